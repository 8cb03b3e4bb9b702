"""The pipeline's faults as sections of benchmarks/bench_reliability.py (issue 43.8), each injected into real
processes the way tests/ does it once, here with the counts printed:

  pipeline  `sdar run --local` (quick, one arm) killed with SIGKILL to its whole process group after the arm's first
            training checkpoint, then `sdar run --local --resume <job>` -> tasks redone, MLflow runs and rows
            duplicated, the step training resumed at
  diskfull  a tmpfs of its own (mounted here: root only), filled under a running `sdar train`: once under its
            checkpoints (room for one), once under its MLflow store (after the first checkpoint) -> tracebacks, error
            lines, rows and checkpoints lost, half-written files, whether the rerun finished
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
CONFIG = "configs/household-tiny.yaml"
from tests.train.conftest import SMALL  # noqa: E402 - the small household run of tests/train (a checkpoint per step)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return {**env, "COLUMNS": "200", **extra}


def _rows(uri: str) -> tuple[dict[str, list[int]], list]:
    """{run name/metric: steps logged} and the runs of the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return ({f"{r.info.run_name}/{k}": [m.step for m in client.get_metric_history(r.info.run_id, k)]
             for r in runs for k in r.data.metrics}, runs)


# ---- pipeline ---------------------------------------------------------------------------------------------------
@dataclass
class PipelineResult:
    killed_at: str = ""  # what had happened when the kill came
    tasks_finished_before: int = 0
    tasks_redone: int = 0  # finished before the kill, run again by the resume
    resumed_at_step: int | None = None
    resume_status: int | None = None
    runs: int = 0
    runs_duplicated: int = 0  # more than one run of a name
    rows_duplicated: int = 0  # (run, metric, step) logged twice
    runs_left_running: int = 0
    wall_s: float = 0.0
    root: str = ""  # where it ran, the job and both runs' output (tests/pipeline/test_local_resume.py reads them)
    job: str = ""
    killed_output: str = ""
    resume_output: str = ""


def pipeline_section(work: Path, steps: int = 3, timeout_s: float = 900.0) -> PipelineResult:
    res, t0, root = PipelineResult(), time.monotonic(), work / "pipeline"
    res.root = str(root)
    proc = subprocess.Popen([sys.executable, "-m", "sdar.cli", "run", "--local", "--quick", "--arms", "grpo", "--steps",
                             str(steps), "--eval-tasks", "4", "--set", "checkpoint.every=1", "--root", str(root),
                             "--quiet"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if list(root.glob("outputs/*/grpo-seed0/checkpoints/step-000001/_COMPLETE.json")):
                os.killpg(proc.pid, signal.SIGKILL)
                res.killed_at = "after the arm's first checkpoint"
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    job = re.search(r"^job (\S+) \(new\)", out, re.M)
    if not res.killed_at or job is None:
        raise RuntimeError(f"the run was not killed mid-training (rc {proc.returncode}): {out[-1500:]}")
    res.job, res.killed_output = job.group(1), out
    records = root / "outputs" / job.group(1) / "tasks"
    before = {p.name: (p / "_DONE.json").stat().st_mtime_ns for p in records.iterdir() if (p / "_DONE.json").is_file()}
    res.tasks_finished_before = len(before)
    again = subprocess.run([sys.executable, "-m", "sdar.cli", "run", "--local", "--root", str(root), "--resume",
                            job.group(1), "--quiet"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                           timeout=timeout_s)
    res.resume_status, res.resume_output = again.returncode, again.stdout + again.stderr
    res.tasks_redone = sum((records / n / "_DONE.json").stat().st_mtime_ns != m for n, m in before.items())
    logs = sorted((root / "logs").iterdir())[-1]
    found = re.search(r"resumed from \S+ at step (\d+)", (logs / "gated-train.log").read_text())
    res.resumed_at_step = int(found.group(1)) if found else None
    rows, runs = _rows(f"sqlite:///{root / 'mlflow.db'}")
    names = [r.info.run_name for r in runs]
    res.runs, res.runs_duplicated = len(runs), len(names) - len(set(names))
    res.rows_duplicated = sum(len(s) - len(set(s)) for s in rows.values())
    res.runs_left_running = sum(r.info.status == "RUNNING" for r in runs)
    res.wall_s = time.monotonic() - t0
    return res


# ---- diskfull ---------------------------------------------------------------------------------------------------
@dataclass
class DiskFullCase:
    where: str  # checkpoints | MLflow store
    status: int | None = None  # of the run that met the full disk (5 expected)
    error_lines: int = 0  # lines starting "error:" (1 expected)
    tracebacks: int = 0
    named_the_path: bool = False
    half_written: int = 0  # files or folders left under a checkpoint's name or as temporaries
    rows_lost: int = 0  # (metric, step) rows the run had logged before, missing afterwards
    rows_duplicated: int = 0  # after the rerun
    steps_missing: int = 0  # steps without their `success` row after the rerun
    rerun_finished: bool = False
    full_output: str = ""  # what the run that met the full disk printed (for the tests)


@dataclass
class DiskFullResult:
    skipped: str = ""  # why, where a file system cannot be mounted
    cases: list[DiskFullCase] = field(default_factory=list)
    wall_s: float = 0.0


def _train(out: Path, env: dict[str, str], steps: int) -> list[str]:
    sets = [a for k, v in {**SMALL, "steps": steps, "checkpoint.keep": 3}.items()
            for a in ("--set", f"{k}={json.dumps(v) if isinstance(v, dict) else v}")]
    return [sys.executable, "-m", "sdar.cli", "train", "--config", CONFIG, "--arm", "grpo", "--output", str(out), *sets]


def _fill(disk: Path, leave: int) -> Path:
    """Fill `disk` but for `leave` bytes. A disk the run's own writes filled first (no room for the filler, or for all
    of it) has the fault in place already: not an error."""
    filler = disk / "filler"
    try:
        with open(filler, "wb") as f:
            f.write(b"\0" * max(shutil.disk_usage(disk).free - leave, 0))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    return filler


def _full_run(case: DiskFullCase, cmd: list[str], env: dict[str, str], fill, path: Path, timeout_s: float) -> str:
    """Run `cmd`, calling `fill()` whenever it returns True; the output, with the case's figures filled in."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline and not fill():
            time.sleep(0.05)
        said, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [ln for ln in said.splitlines() if ln.startswith("error:")]
    case.status, case.error_lines, case.tracebacks = proc.returncode, len(errors), said.count("Traceback")
    case.named_the_path = any(str(path) in ln and "the disk is full" in ln for ln in errors)
    case.full_output = said
    return said


def diskfull_section(work: Path, timeout_s: float = 900.0, cases: tuple[str, ...] = ("checkpoints", "mlflow")
                     ) -> DiskFullResult:
    res, t0, disk = DiskFullResult(), time.monotonic(), work / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        res.skipped = f"cannot mount a small file system here (needs root): {mounted.stderr.strip()[:200]}"
        return res
    try:
        if "checkpoints" in cases:
            res.cases.append(_checkpoints_case(work, disk, timeout_s))
        if "mlflow" in cases:
            res.cases.append(_mlflow_case(work, disk, timeout_s))
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
    res.wall_s = time.monotonic() - t0
    return res


def _checkpoints_case(work: Path, disk: Path, timeout_s: float) -> DiskFullCase:
    """The checkpoints on the small disk, with room for the first only."""
    from sdar.tracking import prepare_sqlite_store
    from sdar.train.checkpoint import checkpoint_path

    uri = prepare_sqlite_store(work / "mlflow-a.db")
    env = _env(MLFLOW_TRACKING_URI=uri)
    ref = subprocess.run(_train(work / "ref", env, 1) + ["--set", "tracking=false"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout_s, check=False)
    if ref.returncode != 0:
        raise RuntimeError(f"the reference run failed: {ref.stderr[-1500:]}")
    one = sum(f.stat().st_size for f in (work / "ref" / checkpoint_path(1)).rglob("*") if f.is_file())
    filler = _fill(disk, leave=int(one * 1.6) + (96 << 10))
    case, out = DiskFullCase("checkpoints"), disk / "run"
    _full_run(case, _train(out, env, 2), env, lambda: False, out, timeout_s)
    case.half_written = len([p for p in out.rglob("*") if ".sdar-tmp-" in p.name]) + int(
        (out / checkpoint_path(2)).exists())
    before, _ = _rows(uri)
    filler.unlink(missing_ok=True)
    _rerun(case, _train(out, env, 2), env, uri, before, timeout_s, 2)
    shutil.rmtree(out, ignore_errors=True)
    return case


def _mlflow_case(work: Path, disk: Path, timeout_s: float) -> DiskFullCase:
    """The MLflow store on the small disk, filled once the run's first checkpoint (on another disk) is out."""
    from sdar.tracking import prepare_sqlite_store
    from sdar.train.checkpoint import checkpoint_path

    uri = prepare_sqlite_store(disk / "mlflow.db")
    env, out, state = _env(MLFLOW_TRACKING_URI=uri), work / "run-b", {}
    case = DiskFullCase("MLflow store")

    def fill() -> bool:
        if (out / checkpoint_path(1) / "_COMPLETE.json").is_file():
            state["filler"] = _fill(disk, leave=0)
            return True
        return False

    _full_run(case, _train(out, env, 3), env, fill, disk / "mlflow.db", timeout_s)
    if "filler" in state:
        state["filler"].unlink(missing_ok=True)
    before, _ = _rows(uri)
    _rerun(case, _train(out, env, 3), env, uri, before, timeout_s, 3)
    (disk / "mlflow.db").unlink(missing_ok=True)
    return case


def _rerun(case: DiskFullCase, cmd: list[str], env: dict[str, str], uri: str, before: dict[str, list[int]],
           timeout_s: float, steps: int) -> None:
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    case.rerun_finished = again.returncode == 0
    after, _ = _rows(uri)
    case.rows_lost = sum(len(set(s) - set(after.get(k, []))) for k, s in before.items())
    case.rows_duplicated = sum(len(s) - len(set(s)) for s in after.values())
    logged = {s for k, v in after.items() if k.endswith("/success") for s in v}
    case.steps_missing = len(set(range(steps)) - logged)


def figures(results: dict, Figure) -> list:
    out = []
    if "pipeline" in results:
        p = results["pipeline"]
        out += [Figure("pipeline", "killed (SIGKILL, whole process group)", f"{p.killed_at}; "
                       f"{p.tasks_finished_before} tasks had finished"),
                Figure("pipeline", "finished tasks redone by --resume", p.tasks_redone, 0),
                Figure("pipeline", "resume did not finish", int(p.resume_status != 0), 0),
                Figure("pipeline", "training resumed at step", p.resumed_at_step),
                Figure("pipeline", f"MLflow runs duplicated (of {p.runs})", p.runs_duplicated, 0),
                Figure("pipeline", "MLflow rows duplicated / runs left RUNNING",
                       p.rows_duplicated + p.runs_left_running, 0)]
    if "diskfull" in results:
        d = results["diskfull"]
        if d.skipped:
            out.append(Figure("diskfull", "skipped", d.skipped))
        for c in d.cases:
            name = f"diskfull {c.where}"
            out += [Figure(name, "exit status (5: disk full)", c.status),
                    Figure(name, "tracebacks", c.tracebacks, 0),
                    Figure(name, "not one error line naming the path", int(c.error_lines != 1 or not c.named_the_path), 0),
                    Figure(name, "half-written files left", c.half_written, 0),
                    Figure(name, "rows lost / duplicated / steps missing after the rerun",
                           c.rows_lost + c.rows_duplicated + c.steps_missing, 0),
                    Figure(name, "rerun did not finish", int(not c.rerun_finished), 0)]
    return out


if __name__ == "__main__":  # a section alone: python benchmarks/reliability_faults.py pipeline|diskfull
    import tempfile
    from dataclasses import asdict

    section = {"pipeline": pipeline_section, "diskfull": diskfull_section}[sys.argv[1]]
    found = asdict(section(Path(tempfile.mkdtemp(prefix="sdar-faults-"))))
    print(json.dumps({k: v for k, v in found.items() if not k.endswith("_output")}, indent=1))
