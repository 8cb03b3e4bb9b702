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
