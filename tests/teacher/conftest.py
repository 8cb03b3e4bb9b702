# the trainer tests' small config and its session warm start serve the teacher's tests too
from tests.train.conftest import make_trainer, small_config, tiny_ckpt  # noqa: F401
