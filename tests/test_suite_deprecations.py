"""The suite fails on a deprecation warning that this repository's own code causes (issue 44; tests/conftest.py): a
probe test that calls something deprecated from a file of ours makes a real pytest run, under xdist as `make test`
runs it, exit non-zero and name the call; a library's warning about its own internals does not."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import our_deprecation

ROOT = Path(__file__).resolve().parents[1]
PROBE = '''
import warnings


def old_api():
    warnings.warn("old_api is deprecated; use new_api", DeprecationWarning, stacklevel=2)


def test_calls_a_deprecated_api():
    old_api()  # the warning points here: a file of this repository


def test_a_librarys_own_warning_is_not_ours():
    warnings.warn_explicit("lib internals", FutureWarning, "/usr/lib/python3/site-packages/lib/mod.py", 7)
'''


def test_which_warnings_are_ours():
    assert our_deprecation(DeprecationWarning, str(ROOT / "src" / "sdar" / "tracking" / "ui.py"))
    assert our_deprecation(FutureWarning, str(ROOT / "tests" / "conftest.py"))
    assert not our_deprecation(UserWarning, str(ROOT / "src" / "sdar" / "tracking" / "ui.py"))
    assert not our_deprecation(DeprecationWarning, str(ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "x.py"))
    assert not our_deprecation(DeprecationWarning, "/usr/lib/python3.11/site-packages/transformers/modeling_utils.py")


def run_probe(body: str, *extra: str, preexec_fn=None) -> subprocess.CompletedProcess:
    """A real pytest run (this repository's conftest) of the test file `body`; preexec_fn: run in the child before
    pytest starts (tests/test_suite_signals.py sets a signal disposition there)."""
    folder = ROOT / "tests" / f"_probe_{uuid.uuid4().hex[:10]}"
    folder.mkdir()
    try:
        (folder / "test_probe.py").write_text(body)
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra,
                               str(folder / "test_probe.py")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              check=False, preexec_fn=preexec_fn)
    finally:
        shutil.rmtree(folder)


def test_a_deprecated_call_of_ours_fails_the_suite_under_xdist_and_is_named():
    proc = run_probe(PROBE, "-n", "2")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "2 passed" in proc.stdout  # the tests themselves pass: the session fails on the warning
    assert "deprecation warnings our own code causes" in proc.stdout
    section = proc.stdout.split("deprecation warnings our own code causes")[1]
    named = [line for line in section.splitlines() if "old_api is deprecated" in line]
    assert len(named) == 1 and "test_probe.py:10: DeprecationWarning" in named[0], proc.stdout[-3000:]
    assert "test_calls_a_deprecated_api" in named[0] and "lib internals" not in section


def test_a_run_without_one_passes():
    proc = run_probe(PROBE.replace("    old_api()  #", "    pass  #"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "deprecation warnings our own code causes" not in proc.stdout
