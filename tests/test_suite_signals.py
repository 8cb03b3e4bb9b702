"""The suite keeps process-wide signal handlers as from a terminal (tests/conftest.py): a test that leaves one changed
has it put back after it and is named at the end of the session, under xdist as `make test` runs it; and a session
started with SIGINT ignored (what a shell without job control gives a background command, CI's and this machine's
tool runs included) gives its tests, and the processes they start, Python's Ctrl-C. Real pytest runs, real
signal dispositions."""

from __future__ import annotations

import signal

from tests.test_suite_deprecations import run_probe

PROBE = '''
import signal
import subprocess
import sys

FOUND = []


def _own(signum, frame):
    pass


def test_a_leaves_its_own_sigint_handler():
    FOUND.append(signal.getsignal(signal.SIGINT))
    signal.signal(signal.SIGINT, _own)


def test_b_finds_the_handler_as_it_was():
    assert FOUND and signal.getsignal(signal.SIGINT) is FOUND[0]


def test_c_runs_with_pythons_ctrl_c_and_so_do_its_children():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is "
                            "signal.default_int_handler)"], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "True"
'''


def _ignoring_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_leaked_handler_is_put_back_and_named_under_xdist_and_an_ignored_ctrl_c_is_restored():
    # one worker: the three probe tests run in order in one process
    proc = run_probe(PROBE, "-n", "1", preexec_fn=_ignoring_sigint)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "3 passed" in proc.stdout, proc.stdout[-3000:]
    assert "tests that left a signal handler changed" in proc.stdout, proc.stdout[-3000:]
    section = proc.stdout.split("tests that left a signal handler changed")[1]
    named = [line for line in section.splitlines() if "left as" in line]
    assert len(named) == 1, proc.stdout[-3000:]
    assert "test_a_leaves_its_own_sigint_handler" in named[0]
    assert "SIGINT left as _own (was default_int_handler); put back" in named[0]


def test_a_session_that_leaves_every_handler_alone_names_none():
    proc = run_probe(PROBE.replace("    signal.signal(signal.SIGINT, _own)", "    pass"), "-n", "1",
                      preexec_fn=_ignoring_sigint)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "tests that left a signal handler changed" not in proc.stdout
