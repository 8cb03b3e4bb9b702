"""A full disk (issue 43.2): `sdar train` whose output directory sits on a small file system of its own (a tmpfs the
test mounts, as root) stops at the checkpoint that does not fit with one line naming the path and the bytes it needed,
exit 5 and no traceback; the checkpoints before it and every metric logged so far are intact, nothing half-written
is left under a checkpoint's name, and the same command rerun once there is room resumes and finishes. Skipped,
with the reason, only where a file system cannot be mounted (not root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.conftest import SMALL

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
CONFIG = "configs/household-tiny.yaml"


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True, capture_output=True,
                       text=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small file system here ({getattr(exc, 'stderr', '') or exc}); the test needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True, timeout=30)


def _train(out: Path, env: dict, *sets: str) -> subprocess.CompletedProcess:
    args = [a for k, v in SMALL.items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, dict) else v}")]
    return subprocess.run([sys.executable, "-m", "sdar.cli", "train", "--config", CONFIG, "--arm", "grpo", "--output",
                           str(out), *args, "--set", "checkpoint.keep=3", *sets], cwd=REPO, env=env,
                          check=False, capture_output=True, text=True, timeout=600)  # fmt: skip


def _fill(disk: Path, leave: int) -> Path:
    """A filler file that leaves `leave` bytes free on `disk`."""
    import shutil

    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(free - leave, 0))
    return filler


@pytest.mark.slow
def test_a_full_disk_stops_at_the_checkpoint_with_one_line_and_the_rerun_resumes(tiny_ckpt, small_disk, tmp_path):
    from mlflow.tracking import MlflowClient

    from sdar.storage import open_store
    from sdar.tracking import prepare_sqlite_store
    from sdar.train.checkpoint import checkpoint_path, list_checkpoints

    uri = prepare_sqlite_store(tmp_path / "mlflow.db")  # the MLflow store on another disk: metrics must survive
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"}
    ref = _train(tmp_path / "ref", env, "--set", "steps=1", "--set", "tracking=false")  # one checkpoint's size
    assert ref.returncode == 0, ref.stderr[-3000:]
    one = sum(f.stat().st_size for f in (tmp_path / "ref" / checkpoint_path(1)).rglob("*") if f.is_file())
    filler = _fill(small_disk, leave=int(one * 1.6) + (96 << 10))  # room for step 1's checkpoint, not for step 2's
    out = small_disk / "run"
    full = _train(out, env)
    said = full.stdout + full.stderr
    assert full.returncode == 5, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    errors = [ln for ln in said.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, said[-3000:]
    assert f"the disk is full: writing the checkpoint of step 2 to {out / checkpoint_path(2)} needs " in errors[0]
    assert "free there" in errors[0] and "rerun the same command" in errors[0]
    assert [s for s, _ in list_checkpoints(open_store(str(out)))] == [1]
    assert not (out / checkpoint_path(2)).exists() and not list(out.rglob("*sdar-tmp*"))
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("household-tiny").experiment_id])
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "success")] == [0, 1]

    filler.unlink()  # room again: the same command resumes from step 1 and finishes, in the same MLflow run
    again = _train(out, env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "resumed from" in again.stdout + again.stderr
    assert [s for s, _ in list_checkpoints(open_store(str(out)))] == [1, 2]
    (run,) = client.search_runs([client.get_experiment_by_name("household-tiny").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "success")] == [0, 1]


def test_a_write_that_finds_the_disk_full_part_way_leaves_no_file_and_says_how_much(small_disk):
    from sdar.storage import DiskFull, open_store

    store = open_store(str(small_disk / "store"))
    _fill(small_disk, leave=64 << 10)
    with pytest.raises(DiskFull, match=r"the disk is full: writing a file to .*big.json needs 1\.0 MB, \d+\.\d kB free"):
        store.write_text("big.json", "x" * (1 << 20))
    assert [p.name for p in (small_disk / "store").iterdir()] == []  # no temp file, no partial file
    store.write_text("small.json", "{}")  # what fits still does
    assert store.read_text("small.json") == "{}"


@pytest.mark.slow
def test_a_warm_start_that_does_not_fit_the_cache_stops_with_one_line_and_leaves_no_entry(small_disk, monkeypatch):
    """The model cache (SDAR_CACHE_DIR) on a full disk: `sdar warmstart` ends with one line naming the entry and the
    room left, exit 5, no traceback; no folder is left under the entry's name or as a temporary build, and once there
    is room the same command builds the entry (issue 43.2)."""
    from sdar.config import load_config
    from sdar.models.cache import leftovers

    cache = small_disk / "cache"
    env = {**os.environ, "SDAR_CACHE_DIR": str(cache), "COLUMNS": "200"}
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, dict) else v}")]
    cmd = [sys.executable, "-m", "sdar.cli", "warmstart", "--config", CONFIG, *sets]
    filler = _fill(small_disk, leave=64 << 10)  # room for the lock file and the folders, not for a model
    full = subprocess.run(cmd, cwd=REPO, env=env, check=False, capture_output=True, text=True, timeout=600)
    said = full.stdout + full.stderr
    assert full.returncode == 5, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    line = next(ln for ln in said.splitlines() if "the disk is full" in ln)
    assert line.startswith("sdar warmstart: the disk is full: writing the cache entry household-") and "free there" in line
    from sdar.train.warm_cache import tiny_checkpoint_path

    monkeypatch.setenv("SDAR_CACHE_DIR", str(cache))
    target = tiny_checkpoint_path(load_config(CONFIG, dict(SMALL)))
    assert str(target) in line
    assert not target.exists() and leftovers(target) == [], list(target.parent.iterdir())
    filler.unlink()
    again = subprocess.run(cmd, cwd=REPO, env=env, check=False, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert (target / "warmstart.json").is_file()


@pytest.mark.slow
def test_an_mlflow_store_on_a_full_disk_stops_the_run_with_one_line_and_the_rerun_logs_the_rest(tiny_ckpt, tmp_path):
    """The MLflow store (SQLite and its artifacts) on a disk that fills while training runs: `sdar train` ends with one
    line naming the store, exit 5, no traceback (a tracking server's outage is waited out instead: it comes back; a
    full disk does not free itself); the rows logged before are intact and the same command, once there is room,
    resumes and logs the rest in the same run, one row per step (issue 43.2). The fault as
    benchmarks/bench_reliability.py's diskfull section injects it (a tmpfs of its own, filled after the first
    checkpoint)."""
    from reliability_faults import diskfull_section

    found = diskfull_section(tmp_path, cases=("mlflow",))
    if found.skipped:
        pytest.skip(found.skipped)
    (case,) = found.cases
    said = case.full_output
    assert case.status == 5 and case.tracebacks == 0, said[-3000:]
    errors = [ln for ln in said.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and case.named_the_path, said[-3000:]
    assert errors[0].startswith("error: the disk is full: writing the MLflow store to ") or \
        errors[0].startswith("error: the disk is full: writing an MLflow artifact to "), errors[0]
    assert "MLFLOW_TRACKING_URI" in errors[0] and "rerun the same command" in errors[0]
    assert "buffering calls" not in said  # a full disk is not an outage to wait out
    assert case.rows_lost == case.rows_duplicated == case.steps_missing == 0 and case.rerun_finished


def test_a_pipeline_log_on_a_full_disk_says_so_once_and_stops_the_run(small_disk):
    """The local runner's task logs (sdar.runlog.TaskLog, the runner's stdout) on a disk that fills: one line naming
    the log and what it needed, the runner's stop called once (sdar run then stops its tasks and exits 5), and no
    exception raised into the runner's threads, however much more they write (issue 43.2)."""
    import io

    from rich.console import Console

    from sdar.runlog import TaskLog

    out, stops = io.StringIO(), []
    console = Console(file=out, width=300, force_terminal=False)
    with TaskLog(small_disk / "logs", console, live=False, on_disk_full=lambda: stops.append(1)) as view:
        view.write("Executing task 'gated-train'\n[grpo] step 1/4: success 0.50 reward 0.50 gap +0.010 1.0s/step\n")
        filler = _fill(small_disk, leave=0)
        for k in range(200):  # 200 x 8 kB: more than any page the files still hold
            view.write(f"[grpo] step 2/4 running: update phase, {k}s into the step {'x' * 8192}\n")
        assert view.disk_full is not None and stops == [1]
    said = out.getvalue()
    errors = [ln for ln in said.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, said[-2000:]
    assert f"error: the disk is full: writing the task log to {small_disk / 'logs'}/" in errors[0]
    assert "needs 8.1 kB" in errors[0] and "free there" in errors[0]
    filler.unlink()
