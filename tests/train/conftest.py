import json

import pytest

from benchmarks.bench_train_step import SMOKE
from sdar.config import load_config

# the miniature of configs/household-tiny.yaml that the benchmarks' smoke runs use too (one cached warm start): a
# 2-layer model, short episodes, small batches; two steps of 2 tasks here
SMALL = {**SMOKE, "steps": 2, "tasks_per_step": 2, "eval.every": 0, "eval.tasks": 4, "checkpoint.every": 1}


def as_sets(overrides: dict) -> list[str]:
    """`overrides` as `sdar`'s command-line arguments, `--set key=value` each (a mapping as a YAML flow mapping)."""
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, dict) else v}")]


def small_config(out, **overrides):
    return load_config("configs/household-tiny.yaml", {**SMALL, "output_dir": str(out), **overrides})


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The warm-started tiny checkpoint of the small config, built once per test session."""
    from sdar.train.warmstart import tiny_checkpoint

    return tiny_checkpoint(small_config(tmp_path_factory.mktemp("ws")))


def make_trainer(cfg, **kwargs):
    """A Trainer for `cfg` with its warm start built first: the explicit step `sdar train`, `sdar eval` and the
    pipeline's components take before the trainer loads the policy."""
    from sdar.train import Trainer
    from sdar.train.warmstart import ensure_warm_start

    ensure_warm_start(cfg)
    return Trainer(cfg, **kwargs)
