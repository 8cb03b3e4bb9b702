"""ReplayConfig: typed, checked when loaded, light to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sdar.replay import ReplayConfig, TeacherEndpoint


def test_defaults_and_teachers_from_dicts():
    cfg = ReplayConfig()
    assert cfg.teachers == [] and cfg.min_agree == 2 and cfg.budget_usd is None and cfg.lag == 1
    cfg = ReplayConfig.from_dict({"teachers": [{"name": "a", "base_url": "http://h/v1", "model": "m"},
                                               {"name": "b", "base_url": "http://h/v1", "model": "n"}],
                                  "budget_usd": 2.5, "local_policies": ["ckpt=/tmp/x:skills"]})
    assert all(isinstance(t, TeacherEndpoint) for t in cfg.teachers)
    assert ReplayConfig.from_dict(cfg.to_dict()) == cfg


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"unknown replay setting\(s\) \['min_agreee'\]; valid settings: teachers, "):
        ReplayConfig.from_dict({"min_agreee": 3})
    two = [{"name": n, "base_url": "http://h/v1", "model": "m"} for n in ("a", "b")]
    with pytest.raises(ValueError, match="min_agree=3 but only 2 teacher"):
        ReplayConfig.from_dict({"min_agree": 3, "teachers": two})
    with pytest.raises(ValueError, match="budget_usd must be >= 0"):
        ReplayConfig(budget_usd=-1)
    with pytest.raises(ValueError, match="local_experts must be a list"):
        ReplayConfig(local_experts="default")
    with pytest.raises(ValueError, match=r"teacher 'a': base_url must start"):
        ReplayConfig.from_dict({"teachers": [{"name": "a", "base_url": "h:1", "model": "m"}]})


def test_importing_the_config_pulls_neither_torch_nor_openai():
    code = ("import sys; from sdar.replay import ReplayConfig, vote; "
            "print(sorted(m for m in ('torch', 'openai', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
