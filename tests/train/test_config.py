"""Config loading: numbers written the way people write them reach the dataclasses as numbers,
and what is not a number gets an error naming the key."""

from __future__ import annotations

import pytest
import yaml

from sdar.config import load_config

CONFIG = "configs/household-tiny.yaml"


def test_exponent_without_a_dot_is_a_float_from_cli_and_yaml(tmp_path):
    # YAML 1.1 (PyYAML) reads 2e-3 as the string "2e-3"; `sdar train --set lr=2e-3` parses with it
    assert yaml.safe_load("2e-3") == "2e-3"
    cfg = load_config(CONFIG, {"lr": yaml.safe_load("2e-3"), "warmstart.lr": "5e-4"})
    assert cfg.lr == pytest.approx(2e-3) and isinstance(cfg.lr, float)
    assert cfg.warmstart.lr == pytest.approx(5e-4)
    path = tmp_path / "c.yaml"
    path.write_text("lr: 3e-4\nsteps: 7.0\n")  # and a KFP-style float for an int field
    cfg = load_config(path)
    assert cfg.lr == pytest.approx(3e-4) and cfg.steps == 7 and isinstance(cfg.steps, int)


def test_non_numbers_name_the_key():
    with pytest.raises(ValueError, match=r"household-tiny.yaml.lr must be a number, got 'fast'"):
        load_config(CONFIG, {"lr": "fast"}).lr  # noqa: B018
    with pytest.raises(ValueError, match=r"rollout\.max_turns must be an integer"):
        load_config(CONFIG, {"rollout.max_turns": "ten"})


def test_device_auto_picks_the_cpu_without_cuda_and_bad_devices_name_the_fix(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_config(CONFIG).resolved_device() == torch.device("cpu")  # device: auto (default)
    assert load_config(CONFIG, {"device": "cpu"}).resolved_device() == torch.device("cpu")
    with pytest.raises(ValueError, match=r"no CUDA device is visible; use device: cpu"):
        load_config(CONFIG, {"device": "cuda:0"}).resolved_device()
    with pytest.raises(ValueError, match=r"device='tpu0' is not a device; use auto, cpu, cuda or cuda:N"):
        load_config(CONFIG, {"device": "tpu0"}).resolved_device()
    with pytest.raises(ValueError, match=r"only cpu and cuda are supported"):
        load_config(CONFIG, {"device": "meta"}).resolved_device()
    # auto follows CUDA when a device is visible (a GPU machine; CUDA itself is not touched here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_config(CONFIG).resolved_device() == torch.device("cuda")


def test_every_config_in_configs_loads_and_the_gpu_config_only_scales_the_cpu_one():
    from pathlib import Path

    root = Path(__file__).parents[2] / "configs"
    for path in sorted(root.glob("*.yaml")):
        load_config(path)
    cpu, gpu = load_config(root / "household-tiny.yaml"), load_config(root / "household-tiny-gpu.yaml")
    # the same experiment (env, rollout, model, RL step size), only larger budgets
    assert gpu.env == cpu.env and gpu.rollout == cpu.rollout and gpu.model == cpu.model and gpu.lr == cpu.lr
    assert gpu.warmstart.episodes > cpu.warmstart.episodes and gpu.warmstart.batch_size > cpu.warmstart.batch_size
    assert gpu.tasks_per_step > cpu.tasks_per_step and gpu.eval_tasks > cpu.eval_tasks


def test_reading_and_checking_a_config_needs_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from sdar.config import load_config\n"
            "cfg = load_config(None, {'env.family': 'searchqa'})\nload_config('configs/household-tiny.yaml')\n"
            "assert cfg.rollout.max_turns == 4 and 'torch' not in [m for m in sys.modules if sys.modules[m]]\n"
            "try:\n    load_config(None, {'rollout.penalize': 'sometimes'})\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "rollout.penalize='sometimes' is not one of format, invalid" in out.stdout
