"""sdar.openmp: how PyTorch's OpenMP threads wait, set by `import sdar` before torch loads, the user's choice kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sdar.openmp import KNOBS, SPIN_COUNT, describe, wait_settings


def test_a_short_spin_unless_the_user_chose():
    assert wait_settings({}) == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    assert wait_settings({"PATH": "/bin"}) == {"GOMP_SPINCOUNT": "1000"}
    for env in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "0"},
                {"OMP_WAIT_POLICY": ""}):
        assert wait_settings(env) == {}, env


def test_describe_names_what_a_process_waits_with():
    assert describe({}) == "spin 1000"
    assert describe({"OMP_WAIT_POLICY": "PASSIVE"}) == "passive"
    assert describe({"OMP_WAIT_POLICY": "Active"}) == "active"
    assert describe({"GOMP_SPINCOUNT": "300000"}) == "spin 300000"
    assert describe({"OMP_WAIT_POLICY": ""}) == "libgomp default"


@pytest.mark.parametrize("given, expected", [
    ({}, "GOMP_SPINCOUNT=1000 OMP_WAIT_POLICY=None"),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "GOMP_SPINCOUNT=None OMP_WAIT_POLICY=PASSIVE"),
    ({"GOMP_SPINCOUNT": "5"}, "GOMP_SPINCOUNT=5 OMP_WAIT_POLICY=None"),
])
def test_import_sdar_sets_it_before_torch_loads(given, expected):
    """A fresh process: after `import sdar` (before torch) the environment libgomp reads holds the choice."""
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(given)
    code = ("import sys, os, sdar; assert 'torch' not in sys.modules, 'sdar imported torch'; "
            "print(' '.join(f'{k}={os.environ.get(k)}' for k in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_the_suite_itself_runs_passive():
    """The test workers share the cores by design (tests/conftest.py): each sleeps at once."""
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
    assert "GOMP_SPINCOUNT" not in os.environ


def test_processes_at_once_sleep_unless_the_user_chose(monkeypatch):
    """The local pipeline's arms, two at once, get PASSIVE and lose sdar's spin (libgomp lets a spin count override
    the policy); one at a time, or a user's own choice, changes nothing."""
    from sdar import openmp

    monkeypatch.setattr(openmp, "USER_CHOSE", False)
    assert openmp.at_once(2) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    assert openmp.at_once(1) == {}
    monkeypatch.setattr(openmp, "USER_CHOSE", True)
    assert openmp.at_once(2) == {}
    assert describe({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}) == "spin 1000"


def test_the_local_pipeline_hands_its_arms_passive(monkeypatch):
    """run_local's environment for its task subprocesses: the at_once variables set (None removed), then restored."""
    from sdar import openmp
    from sdar.pipeline import runner

    monkeypatch.setattr(openmp, "USER_CHOSE", False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with runner._environ({"X_SDAR_JOB": "j", **openmp.at_once(2)}):
        assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
        assert os.environ["X_SDAR_JOB"] == "j"
    assert os.environ.get("GOMP_SPINCOUNT") == "1000" and "OMP_WAIT_POLICY" not in os.environ
    assert "X_SDAR_JOB" not in os.environ
