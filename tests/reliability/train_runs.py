"""`sdar train` of the tests' small household config in a child process that can be killed -9, and what a run
leaves behind read back: MLflow metric rows, the history.json curve, checkpoint files. Used by
benchmarks/bench_reliability.py."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/household-tiny.yaml"
STEP_LINE = re.compile(r"^\[\w+\] step (\d+)/(\d+):")  # what the trainer prints per step when not on a terminal
TIMING_KEYS = re.compile(r"^(time/|tokens_per_s$)")  # wall-clock metrics: never equal between two runs


def small_overrides(steps: int, **extra: Any) -> dict[str, Any]:
    """tests/train/conftest.py's miniature of household-tiny, for `steps` steps."""
    from tests.train.conftest import SMALL

    return {**SMALL, "steps": steps, **extra}


class TrainProcess:
    """`sdar train --config household-tiny.yaml --output <out> --set ...` in its own process group, its output
    appended to `<out>.log` and its per-step lines timed."""

    def __init__(self, out: Path, overrides: dict[str, Any], env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "sdar.cli", "train", "--config", CONFIG, "--output", str(out)]
        for key, value in overrides.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]  # JSON is YAML
        self.log_path = out.parent / f"{out.name}.log"
        self.steps: list[tuple[float, int]] = []  # (seconds since start, steps done) per printed line
        self.summary: dict[str, Any] | None = None  # the JSON line `sdar train` ends with
        self.t0 = time.monotonic()
        full_env = {**os.environ, "COLUMNS": "200", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", env=full_env, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "a") as log:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                if m := STEP_LINE.match(line):
                    self.steps.append((time.monotonic() - self.t0, int(m.group(1))))
                elif line.startswith('{"arm"'):
                    self.summary = json.loads(line)

    def kill_after(self, steps: int, seconds: float) -> bool:
        """SIGKILL `seconds` after this process printed its `steps`-th step line; False if it ended first."""
        while len(self.steps) < steps:
            if self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        try:
            self.proc.wait(seconds)
            return False
        except subprocess.TimeoutExpired:
            self.kill()
            return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(10)

    def wait(self, timeout_s: float) -> int:
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"training run did not finish within {timeout_s:.0f} s; see {self.log_path}") from None
        self._reader.join(10)
        return rc

    def wait_for_step(self, step: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(s >= step for _, s in self.steps):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the run never reached step {step}:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]


def latest_step(store_uri: str) -> int:
    """The step of the checkpoint a rerun resumes from (0: none)."""
    from sdar.storage import open_store
    from sdar.train.checkpoint import latest_checkpoint

    found = latest_checkpoint(open_store(store_uri))
    return found[0] if found else 0


def metric_rows(tracking_uri: str, run_id: str) -> dict[tuple[str, int], list[float]]:
    """Every (key, step) of a run's metrics with all its values (more than one is a duplicate row)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    rows: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            rows[(key, m.step)].append(m.value)
    return dict(rows)


def history_rows(out: Path) -> dict[tuple[str, int], float]:
    """history.json as (key, step) -> value, for the finite numbers the trainer logs to MLflow."""
    rows = {}
    for h in json.loads((out / "history.json").read_text()):
        for key, value in h.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(float(value)):
                rows[(key, int(h["step"]))] = float(value)
    return rows


def max_diff(a: dict[tuple[str, int], float], b: dict[tuple[str, int], float]) -> tuple[float, str]:
    """The largest |a - b| over shared (key, step) of non-timing keys, and where it is."""
    worst, where = 0.0, ""
    for k in a.keys() & b.keys():
        if not TIMING_KEYS.match(k[0]) and abs(a[k] - b[k]) > worst:
            worst, where = abs(a[k] - b[k]), f"{k[0]} at step {k[1]}"
    return worst, where


def checkpoint_file(store_uri: str, step: int, name: str, tmp: Path) -> Path:
    """A local copy of file `name` of the checkpoint of `step`."""
    from sdar.storage import open_store
    from sdar.train.checkpoint import checkpoint_path

    local = tmp / f"ckpt-{secrets.token_hex(4)}"
    open_store(store_uri).get_dir(checkpoint_path(step), local)
    return local / name
