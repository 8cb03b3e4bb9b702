"""Issue 43.1: a command that starts processes ends them when it is ended politely. `sdar ui` stopped with SIGTERM
(kill, systemd, Kubernetes) or SIGHUP (a closing terminal) stops its mlflow server's whole process group (uvicorn,
the job runner, the huey workers) and frees the port, like Ctrl-C. Real processes, real signals."""

from __future__ import annotations

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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sdar_ui_ended_by_a_signal_stops_its_mlflow_server_and_frees_the_port(tmp_path, sig):
    from sdar.mlflow_ui import free_port
    from sdar.tracking import prepare_sqlite_store

    uri = prepare_sqlite_store(tmp_path / "mlflow.db")
    build_comparison_store(uri, "job-1", ["grpo"], [0])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sdar.cli", "ui", "--tracking-uri", uri, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "stops the server" in line or time.monotonic() > deadline:
            break
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
