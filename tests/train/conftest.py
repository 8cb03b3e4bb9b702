import pytest

from sdar.config import load_config

# a miniature of configs/household-tiny.yaml: a 2-layer model, short episodes, small batches
SMALL = {
    "steps": 2, "tasks_per_step": 2, "group_size": 2, "eval.every": 0, "eval.tasks": 4, "checkpoint.every": 1,
    "ppo.mini_batch_size": 8, "scoring.batch_size": 16, "teacher.max_prompt_tokens": 1536,
    "rollout.max_turns": 3, "rollout.max_prompt_tokens": 1024, "rollout.max_response_tokens": 12, "rollout.env_workers": 2,
    "warmstart.episodes": 24, "warmstart.tokenizer_episodes": 120, "warmstart.epochs": 1,
    "model.tiny_overrides": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "num_key_value_heads": 1},
}


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
