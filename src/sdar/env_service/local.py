"""The environment service of a pipeline run on this machine: a detached server process on
127.0.0.1 whose pid is registered under <output_root>/envs/<job_id>.json, and stopping it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any


def registry_path(output_root: str, job_id: str) -> Path:
    return Path(output_root) / "envs" / f"{job_id}.json"


def serve(family: str, env_kwargs: dict[str, Any], job_id: str, output_root: str,
          startup_timeout_s: float, info: dict[str, Any]) -> dict[str, Any]:
    """Start `python -m sdar_envs.server` detached (it outlives this step) and register its pid with
    `info`; returns {url, pids, log, registry}."""
    from sdar_envs.client import serve_in_background

    url, handle = serve_in_background(family, die_with_parent=False, startup_timeout_s=startup_timeout_s,
                                      **env_kwargs)
    started = {"url": url, "pids": [handle.pid], "log": str(handle.log_path)}
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
