"""A killed local pipeline run continued (issue 43.3): `sdar run --local` killed outright (SIGKILL to its whole process
group: the runner, its task processes and its env server, as an OOM kill or a lost container does) in the middle of a
training task; `sdar run --local --resume <job>` finishes the comparison without redoing the tasks that had
finished, the arm resuming from its checkpoint, and the MLflow store holds each run once with one row per metric and
step. Real processes, the real KFP local runner, a real MLflow store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _sdar(*args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen([sys.executable, "-m", "sdar.cli", *args], cwd=REPO, env={**env, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_a_killed_run_resumes_without_redoing_finished_tasks_and_logs_each_run_once(tmp_path):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "root"
    proc = _sdar("run", "--local", "--quick", "--arms", "grpo", "--steps", "3", "--eval-tasks", "4",
                 "--set", "checkpoint.every=1", "--root", str(root), "--quiet", start_new_session=True)
    try:
        deadline, killed = time.monotonic() + 400, False
        while time.monotonic() < deadline and proc.poll() is None:
            if list(root.glob("outputs/*/grpo-seed0/checkpoints/step-000001/_COMPLETE.json")):
                os.killpg(proc.pid, signal.SIGKILL)  # mid-training: step 1 saved, steps 2-3 to go
                killed = True
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed, f"the run ended before its first checkpoint (rc {proc.returncode}):\n{out[-3000:]}"
    job = re.search(r"^job (\S+) \(new\); should it stop, `sdar run --local --root \S+ --resume (\S+)`", out, re.M)
    assert job and job.group(1) == job.group(2), out[-3000:]
    job = job.group(1)
    records = root / "outputs" / job / "tasks"
    finished = sorted(p.name for p in records.iterdir() if (p / "_DONE.json").is_file())
    assert finished == ["evaluate-baseline-grpo-0", "rollout-grpo-0-0", "teacher-replay-grpo-0-0"], finished
    stamps = {name: (records / name / "_DONE.json").stat().st_mtime_ns for name in finished}

    # the same job again: refused with settings, continued without
    refused = _sdar("run", "--local", "--root", str(root), "--resume", job, "--arms", "sdar")
    assert refused.wait(60) != 0 and "continues the job with the settings it began with; drop arms" in refused.stdout.read()
    again = _sdar("run", "--local", "--root", str(root), "--resume", job, "--quiet")
    out2, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out2[-4000:]
    assert f"job {job} (continued)" in out2 and "Traceback" not in out2
    for task in ("evaluate", "rollout", "teacher-replay"):  # answered from their records, not run again
        assert f"  {task}: success in 0s (finished before in this job: not redone)" in out2, out2[-4000:]
    assert {n: (records / n / "_DONE.json").stat().st_mtime_ns for n in finished} == stamps
    logs = sorted((root / "logs").iterdir())[-1]
    train_log = (logs / "gated-train.log").read_text()
    assert re.search(r"resumed from \S+/grpo-seed0/checkpoints/step-000001 at step 1", train_log), train_log[-3000:]
    assert "[grpo] step 1/3" not in train_log and "[grpo] step 3/3" in train_log
    assert (root / "outputs" / job / "tasks" / "train-grpo-0-0" / "_DONE.json").is_file()

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    names = sorted(r.info.run_name for r in runs)
    assert len(names) == 3 and names[1:] == ["grpo-seed0", "warm-start-seed0"], names  # one parent, one per arm
    assert all(r.info.status == "FINISHED" and r.data.tags["sdar.pipeline_job_id"] == job for r in runs)
    for run in runs:
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (run.info.run_name, key, steps)
    grpo = next(r for r in runs if r.info.run_name == "grpo-seed0")
    assert [m.step for m in client.get_metric_history(grpo.info.run_id, "success")] == [0, 1, 2]
    assert "final/success" in grpo.data.metrics

    done = _sdar("run", "--local", "--root", str(root), "--resume", job)
    assert done.wait(120) != 0 and f"job {job} finished already" in done.stdout.read()
