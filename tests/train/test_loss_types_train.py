"""Every loss type trains: `sdar train --set arm_overrides.loss_type=...` runs, and the loss type reaches the
loss the trainer forms (its aggregation changes the distillation term of the same rollouts)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from sdar.algos import LOSS_TYPES

from .conftest import make_trainer, small_config


def _history(out):
    return json.loads((out / "history.json").read_text())


def test_every_loss_type_trains_with_the_distillation_channel(tiny_ckpt, tmp_path):
    # the same seed gives the same rollouts and teacher scores at step 0: only the loss type differs
    runs = {}
    for loss_type, level in [*((t, "token") for t in LOSS_TYPES), ("grpo", "sequence")]:
        out = tmp_path / f"{loss_type}-{level}"
        cfg = small_config(out, steps=1, tracking=False, arm="sdar",
                           arm_overrides={"loss_type": loss_type, "importance_sampling_level": level})
        make_trainer(cfg).run()
        (row,) = _history(out)
        for key in ("loss/pg", "loss/kl", "loss/sdar", "loss/total", "pg/ratio_mean"):
            assert math.isfinite(row[key]), (loss_type, level, key, row[key])
        assert row["updates"] >= 1, (loss_type, row)
        runs[(loss_type, level)] = row
    sdar = {k: v["loss/sdar"] for k, v in runs.items()}
    # token-mean (ppo, bnpo, dapo, cispo), seq-mean-token-mean (grpo, sapo) and Dr. GRPO's constant differ
    assert sdar[("ppo", "token")] == pytest.approx(sdar[("dapo", "token")], rel=1e-6)
    assert sdar[("grpo", "token")] == pytest.approx(sdar[("sapo", "token")], rel=1e-6)
    distinct = {round(sdar[(t, "token")], 9) for t in ("ppo", "grpo", "dr_grpo")}
    assert len(distinct) == 3, sdar


def test_sdar_train_cli_dr_grpo_two_steps(tiny_ckpt, tmp_path):
    from tests.reliability.train_runs import small_overrides

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sdar.cli", "train", "--config", "configs/household-tiny.yaml", "--output", str(out),
           "--set", "arm=sdar_composer", "--set", "arm_overrides.loss_type=dr_grpo", "--set", "tracking=false"]
    for key, value in small_overrides(2).items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _history(out)
    assert [r["step"] for r in rows] == [0, 1] and all(math.isfinite(r["loss/total"]) for r in rows)
