"""Issue 43.1: a command that starts processes ends them when it is ended politely. `sdar ui` stopped with SIGTERM
(kill, systemd, Kubernetes) or SIGHUP (a closing terminal) stops its mlflow server's whole process group (uvicorn,
the job runner, the huey workers) and frees the port, like Ctrl-C. Real processes, real signals."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.comparison_store import build_comparison_store


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _group_alive(pgid: int) -> bool:
    from sdar.lifecycle import group_members

    return bool(group_members(pgid))


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ui(uri: str, port: int) -> tuple[subprocess.Popen, list[str]]:
    """`sdar ui` on `port`, read until it serves (its lines so far)."""
    proc = subprocess.Popen([sys.executable, "-m", "sdar.cli", "ui", "--tracking-uri", uri, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "stops the server" in line or time.monotonic() > deadline:
            break
    return proc, lines


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sdar_ui_ended_by_a_signal_stops_its_mlflow_server_and_frees_the_port(tmp_path, sig):
    from sdar.ports import free_port
    from sdar.tracking import prepare_sqlite_store

    uri = prepare_sqlite_store(tmp_path / "mlflow.db")
    build_comparison_store(uri, "job-1", ["grpo"], [0])
    port = free_port()
    proc, lines = _ui(uri, port)
    assert _port_taken(port), "".join(lines)
    servers = _children(proc.pid)
    assert len(servers) == 1 and _group_alive(servers[0])  # the mlflow server leads its own process group
    assert len(_children(servers[0])) >= 1  # uvicorn and the workers under it
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, "".join(lines) + rest
    assert f"ended by {signal.Signals(sig).name}" in rest and "is stopped" in rest
    assert not _group_alive(servers[0]), "the server's process group outlived sdar ui"
    assert not _port_taken(port)


@pytest.mark.slow
def test_a_server_that_a_killed_sdar_ui_left_is_reused_for_its_store_and_stopped_for_another(tmp_path):
    """SIGKILL runs no handler: `sdar ui`'s mlflow server (its own process group) outlives it, holding the port. The
    next `sdar ui` on that port takes it over when it serves the same store (and stops it when it ends), and stops it
    first when it serves another store; it never yields another store's server as its own (issue 43.1)."""
    from sdar.ports import free_port
    from sdar.tracking.ui import left_behind
    from sdar.tracking import prepare_sqlite_store

    first = prepare_sqlite_store(tmp_path / "a" / "mlflow.db")
    other = prepare_sqlite_store(tmp_path / "b" / "mlflow.db")
    for uri in (first, other):
        build_comparison_store(uri, "job-1", ["grpo"], [0])
    port = free_port()
    ui, lines = _ui(first, port)
    (server,) = _children(ui.pid)
    try:
        assert left_behind(port) is None, "a live sdar ui's server is not left behind"
        ui.kill()  # SIGKILL: the server stays
        ui.wait(30)
        assert _port_taken(port) and _group_alive(server)
        assert left_behind(port) == (server, first)

        again, lines = _ui(first, port)  # the same store: taken over, no second server
        assert any("reusing the mlflow server an earlier sdar ui left on port" in ln for ln in lines), lines
        assert _children(again.pid) == [] and _group_alive(server)
        again.kill()  # left behind once more
        again.wait(30)

        third, lines = _ui(other, port)  # another store: the old one stopped, a fresh one started
        assert any(f"stopped the mlflow server an earlier sdar ui left on port {port} over {first}" in ln
                   for ln in lines), lines
        assert not _group_alive(server)
        (fresh,) = _children(third.pid)
        third.send_signal(signal.SIGTERM)
        third.communicate(timeout=60)
        assert not _group_alive(fresh) and not _port_taken(port)
    finally:  # a failed check must not leave a server holding the port
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, signal.SIGKILL)


def test_a_command_freezes_its_objects_at_exit_after_the_other_exit_handlers():
    """sdar.lifecycle.skip_the_final_collection, as `sdar` registers it: at exit every object is frozen (the shutdown's
    collections skip them) after the exit handlers registered later, and before those registered earlier, which
    still run; the command's output and status are untouched. Twice registered, it runs once."""
    child = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('earlier handler: frozen', gc.get_freeze_count() > 0, flush=True))\n"
        "from sdar.cli import main\n"
        "from sdar.lifecycle import skip_the_final_collection\n"
        "code = main(['--version'])\n"
        "n = atexit._ncallbacks()\n"
        "skip_the_final_collection()  # registered by main already: nothing more\n"
        "print('handlers added', atexit._ncallbacks() - n, flush=True)\n"
        "atexit.register(lambda: print('later handler: frozen', gc.get_freeze_count() > 0, flush=True))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    from sdar import __version__

    assert lines == [__version__, "handlers added 0", "later handler: frozen False", "earlier handler: frozen True"], lines
