"""sdar.train.runtime: the parts the trainer, `sdar eval` and the components share, built one way; the warm
start is its own step that the runtime only loads; evaluation loads a checkpoint's weights only."""

from __future__ import annotations

import random

import pytest
import torch

from sdar.train.runtime import build_runtime
from sdar.train.warmstart import WarmStartMissing, tiny_checkpoint_path

from .conftest import make_trainer, small_config


def test_the_runtime_loads_a_warm_start_it_never_builds(tmp_path):
    # a tiny model no test builds (another width): the runtime says which step builds it, and builds nothing
    cfg = small_config(tmp_path, **{"model.tiny_overrides": {"hidden_size": 48, "intermediate_size": 96,
                                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                                              "num_key_value_heads": 1}})
    with pytest.raises(WarmStartMissing, match="sdar warmstart --config"):
        build_runtime(cfg, train=False)
    assert not tiny_checkpoint_path(cfg).exists()


def test_evaluation_loads_a_checkpoints_weights_only(tiny_ckpt, tmp_path):
    trainer = make_trainer(small_config(tmp_path / "run", arm="sdar", steps=1, tracking=False))
    trainer.run()
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    rt = build_runtime(small_config(tmp_path / "eval", arm="sdar", tracking=False), train=False)
    assert rt.train_pool == [] and rt.eval_tasks == trainer.eval_tasks
    named = dict(rt.model.named_parameters())
    assert any(not torch.equal(named[n], w) for n, w in trained.items())  # a fresh adapter before loading
    rng = (torch.get_rng_state(), random.getstate())
    for where in (str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")):  # a run's output or its checkpoints
        assert rt.load_weights(where) == 1
        for n, w in trained.items():
            torch.testing.assert_close(named[n], w, rtol=0, atol=0)
    # weights only: no optimizer exists to restore, and the process's random state is the one it had
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        rt.load_weights(str(tmp_path / "nowhere"))
