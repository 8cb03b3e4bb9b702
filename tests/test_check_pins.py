"""tools/check_pins.py against the real package index: the ranges read from pyproject.toml, and a fresh install
(what `make test` makes) holds the newest release each range allows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ranges_come_from_every_requirement_list():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_pins
    finally:
        sys.path.pop(0)
    got = check_pins.ranges()
    assert got["trl"] == "<2,>=1.16" and got["kfp"] == "<2.18,>=2.10"
    assert got["transformers"] == "<6,>=4.45,>=5.13"  # the dependency and the trl extra, both
    assert "torch" not in got  # its build comes from the Makefile


def test_installed_versions_are_the_newest_the_ranges_allow():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "check_pins.py"), "--json", "peft", "kfp"],
                          capture_output=True, text=True, timeout=300)
    rows = {r["package"]: r for r in json.loads(done.stdout)}
    assert done.returncode == 0, done.stdout + done.stderr
    for row in rows.values():
        assert row["status"] != "behind" and row["installed"] == row["newest_allowed"], row
