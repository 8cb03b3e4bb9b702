"""A local pipeline run ends with its processes (issue 43.1): `sdar run --local` ended by SIGTERM (what `kill`,
systemd and a closing terminal's SIGHUP do) stops its task processes and the env server it started, marks its open
MLflow runs KILLED, and exits 143 with one line; an env server whose runner was killed outright (SIGKILL: no handler
runs) is found and stopped by the next run. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_stops_the_runs_tasks_and_env_server_and_marks_its_runs_killed(tmp_path):
    from mlflow.tracking import MlflowClient

    from sdar.lifecycle import descendants, group_members

    root = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-m", "sdar.cli", "run", "--local", "--quick", "--arms", "grpo,sdar", "--steps", "40",
                             "--root", str(root), "--quiet"], cwd=REPO, env={**env, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, registry = time.monotonic() + 300, None
        while time.monotonic() < deadline and proc.poll() is None:  # the env server is up and a task runs beside it
            found = [p for p in (root / "outputs" / "envs").glob("*.json") if not p.name.endswith(".stopped.json")] \
                if (root / "outputs" / "envs").is_dir() else []
            # inside the arms' ParallelFor: KFP waits for its worker threads there before an exception gets out
            training = list((root / "logs").glob("*/gated-train.log")) if (root / "logs").is_dir() else []
            if found and training and descendants(proc.pid):
                registry = found[0]
                break
            time.sleep(0.5)
        assert registry is not None, f"no env server registered; rc {proc.poll()}"
        info = json.loads(registry.read_text())
        server = info["pids"][0]
        assert info["runner_pid"] == proc.pid and _alive(server)
        time.sleep(2)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    # the training tasks (40 steps each: minutes) were stopped, not waited for (KFP's ParallelFor waits for its
    # worker threads before an exception gets out of it)
    assert ended - signalled < 45, (ended - signalled, out[-3000:])
    lines = [ln for ln in out.splitlines() if ln.startswith("sdar run: ended by SIGTERM; stopped")]
    assert len(lines) == 1 and "1 env server(s)" in lines[0], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not _alive(server) and group_members(proc.pid) == []  # the server and every task process, gone
    assert not registry.exists() and registry.with_suffix(".stopped.json").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status != "RUNNING" for r in runs)
    assert any(r.info.status == "KILLED" and r.data.tags.get("sdar.kind") == "pipeline" for r in runs)


def test_a_server_left_by_a_killed_runner_is_stopped_by_the_next_run_and_a_live_runs_is_not(tmp_path, monkeypatch):
    from sdar.env_service import local

    gone = subprocess.Popen(["true"])
    gone.wait()  # a runner pid that no longer exists, as after SIGKILL
    root = str(tmp_path / "outputs")
    monkeypatch.setenv(local.RUNNER_PID_ENV, str(gone.pid))
    orphan = local.serve("household", {"backend": "sim"}, "job-killed", root, 60.0, {"family": "household"})
    # a live runner: a process whose command names sdar (this test's own process may be an xdist worker, whose
    # command line names neither sdar nor pytest)
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "sdar-live-runner"])
    monkeypatch.setenv(local.RUNNER_PID_ENV, str(runner.pid))
    live = local.serve("household", {"backend": "sim"}, "job-live", root, 60.0, {"family": "household"})
    try:
        lines = local.stop_orphans(root, stop_timeout_s=10)
        assert len(lines) == 1 and f"pid {orphan['pids'][0]}" in lines[0] and f"runner pid {gone.pid} is gone" in lines[0]
        assert not _alive(orphan["pids"][0]) and Path(root, "envs", "job-killed.stopped.json").is_file()
        assert _alive(live["pids"][0]) and Path(live["registry"]).is_file()
        assert local.stop_orphans(root) == []  # nothing left to do
    finally:
        local.stop_runner_servers(root, runner.pid, stop_timeout_s=10)
        runner.kill()
        runner.wait()
    assert not _alive(live["pids"][0])
