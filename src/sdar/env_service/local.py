"""The environment service of a pipeline run on this machine: a detached server process on
127.0.0.1 whose pid is registered under <output_root>/envs/<job_id>.json, and stopping it: by the run's teardown, by
the runner itself when a signal ends it (`stop_runner_servers`), or by the next run when the runner that started it
was killed outright (`stop_orphans`: the registry names the runner's pid, `RUNNER_PID_ENV`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

RUNNER_PID_ENV = "SDAR_RUNNER_PID"  # set by the local runner for its tasks: whose run a server belongs to


def registry_path(output_root: str, job_id: str) -> Path:
    return Path(output_root) / "envs" / f"{job_id}.json"


def serve(family: str, env_kwargs: dict[str, Any], job_id: str, output_root: str,
          startup_timeout_s: float, info: dict[str, Any]) -> dict[str, Any]:
    """Start `python -m sdar_envs.server` detached (it outlives this step) and register its pid with
    `info`; returns {url, pids, log, registry}."""
    from sdar_envs.launcher import serve_in_background

    url, handle = serve_in_background(family, die_with_parent=False, startup_timeout_s=startup_timeout_s,
                                      **env_kwargs)
    runner = os.environ.get(RUNNER_PID_ENV, "")
    started = {"url": url, "pids": [handle.pid], "log": str(handle.log_path),
               "runner_pid": int(runner) if runner.isdigit() else None}
    registry = registry_path(output_root, job_id)
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_text(json.dumps({**info, **started}, indent=1))
    print(f"serving {family} at {url} (pid {handle.pid}); teardown_envs stops it")
    return {**started, "registry": str(registry.resolve())}


def stop(job_id: str, output_root: str, stop_timeout_s: float, dry_run: bool) -> list[str]:
    """Stop the servers registered for `job_id`, one line each; each pid is checked to still be an
    sdar env server (a recycled pid is never signalled), SIGTERM then SIGKILL after stop_timeout_s.
    The registry is renamed to <job_id>.stopped.json, so a second call finds nothing to do."""
    registry = registry_path(output_root, job_id)
    if not registry.is_file():
        return [f"no local env servers registered for job {job_id}"]
    info = json.loads(registry.read_text())
    done = [_stop_pid(pid, info, stop_timeout_s, dry_run) for pid in info.get("pids", [])]
    if not dry_run:
        if info.get("log"):
            Path(info["log"]).unlink(missing_ok=True)
        registry.rename(registry.with_suffix(".stopped.json"))
    return done


def _stop_pid(pid: int, info: dict[str, Any], stop_timeout_s: float, dry_run: bool) -> str:
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        argv = cmdline.read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid} already gone"
    if b"sdar_envs.server" not in argv:
        return f"pid {pid} is no longer an env server; left alone"
    if dry_run:
        return f"would stop pid {pid}"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + stop_timeout_s
    while time.monotonic() < deadline:
        try:
            # reap it if it is our child (tests); otherwise poll until /proc forgets it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:
            pass
        if not cmdline.exists():
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    return f"stopped {info.get('family', 'env')} server pid {pid} ({info.get('url', '?')})"


def registered(output_root: str) -> list[dict[str, Any]]:
    """The registries of servers not yet stopped under `output_root`, each with its job_id."""
    envs = Path(output_root) / "envs"
    out = []
    for path in sorted(envs.glob("*.json")) if envs.is_dir() else []:
        if path.name.endswith(".stopped.json"):
            continue
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out.append({**info, "job_id": info.get("job_id") or path.stem})
    return out


def _runner_alive(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sdar" in argv or b"pytest" in argv  # a recycled pid runs something else


def stop_orphans(output_root: str, stop_timeout_s: float = 20.0) -> list[str]:
    """Stop the servers whose runner is gone without tearing them down (SIGKILL, a lost terminal): one line each."""
    lines = []
    for info in registered(output_root):
        pid = info.get("runner_pid")
        if pid is None or _runner_alive(int(pid)):
            continue  # a server of a live run (or of a run on the cluster path, which has no runner pid)
        lines += [f"{line} (left by job {info['job_id']}, whose runner pid {pid} is gone)"
                  for line in stop(info["job_id"], output_root, stop_timeout_s, dry_run=False)]
    return lines


def stop_runner_servers(output_root: str, runner_pid: int, stop_timeout_s: float = 20.0) -> list[str]:
    """Stop every server the runner `runner_pid` started (its teardown will not run): one line each."""
    lines = []
    for info in registered(output_root):
        if info.get("runner_pid") == runner_pid:
            lines += stop(info["job_id"], output_root, stop_timeout_s, dry_run=False)
    return lines
