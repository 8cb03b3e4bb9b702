"""tools/check_pins.py: the ranges read from pyproject.toml, each row's status from a package index (a fake one, so
that what upstream releases never decides a test), the exit status (0 unless --strict), and one run against the
real index that must report and exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _check_pins():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_pins
    finally:
        sys.path.pop(0)
    return check_pins


def test_ranges_come_from_every_requirement_list():
    check_pins = _check_pins()
    got = check_pins.ranges()
    assert got["trl"] == "<2,>=1.16" and got["kfp"] == "<2.18,>=2.10"
    assert got["transformers"] == "<6,>=4.45,>=5.13"  # the dependency and the trl extra, both
    assert "torch" not in got  # its build comes from the Makefile


@pytest.fixture
def fake_index(monkeypatch):
    """check_pins against made-up releases and installed versions: {package: (releases newest first, installed)}."""
    check_pins = _check_pins()
    world: dict[str, tuple[list[str], str]] = {}

    def versions(package):
        if package not in world:
            raise RuntimeError(f"pip index versions {package} failed: no answer")
        return [Version(v) for v in world[package][0]]

    monkeypatch.setattr(check_pins, "index_versions", versions)
    monkeypatch.setattr(check_pins, "_installed", lambda package: world.get(package, ([], ""))[1])
    monkeypatch.setattr(check_pins, "ranges", lambda: {"peft": ">=0.13,<1", "trl": ">=1.16,<2", "kfp": "<2.18,>=2.10"})
    return check_pins, world


def test_each_status_from_the_index(fake_index, monkeypatch):
    check_pins, world = fake_index
    world.update({"peft": (["1.0.0", "0.22.0", "0.21.2"], "0.21.2"), "trl": (["1.17.0", "1.16.0"], "1.17.0+local"),
                  "kfp": (["2.17.3"], "")})
    assert check_pins.check("peft", ">=0.13,<1").status == "behind"  # 0.22.0 allowed, 0.21.2 installed
    assert check_pins.check("trl", ">=1.16,<2").status == "current"
    assert check_pins.check("kfp", "<2.18,>=2.10").status == "not installed"
    world["peft"] = (["1.0.0", "0.21.2"], "0.21.2")
    assert check_pins.check("peft", ">=0.13,<1").status == "newer outside"
    monkeypatch.setattr(check_pins, "HELD", {("peft", "1.0.0"): "does not install here"})
    assert check_pins.check("peft", ">=0.13,<1").status == "held"
    del world["kfp"]
    assert check_pins.check("kfp", "<2.18,>=2.10").status == "index unreachable"


def test_newer_releases_are_reported_without_failing(fake_index, capsys):
    """A release past a range, an environment behind it or an index that does not answer: printed, exit 0; --strict
    alone turns them into exit 1."""
    check_pins, world = fake_index
    world.update({"peft": (["1.0.0", "0.21.2"], "0.21.2"), "trl": (["1.18.0", "1.17.0"], "1.17.0")})  # kfp: no answer
    assert check_pins.main([]) == 0
    table = capsys.readouterr().out
    assert "newer outside" in table and "behind" in table and "index unreachable" in table
    assert check_pins.main(["--strict"]) == 1
    world.update({"peft": (["0.21.2"], "0.21.2"), "trl": (["1.18.0"], "1.18.0"), "kfp": (["2.17.3"], "2.17.3")})
    assert check_pins.main(["--strict"]) == 0


def test_against_the_real_index_it_reports_and_exits_0():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "check_pins.py"), "--json", "peft", "kfp"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["package"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"peft", "kfp"}
    for row in rows.values():
        assert row["status"] in ("current", "behind", "newer outside", "held", "not installed", "index unreachable"), row
