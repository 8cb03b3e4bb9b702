"""A killed local pipeline run continued (issue 43.3): `sdar run --local` killed outright (SIGKILL to its whole process
group: the runner, its task processes and its env server, as an OOM kill or a lost container does) in the middle of a
training task; `sdar run --local --resume <job>` finishes the comparison without redoing the tasks that had
finished, the arm resuming from its checkpoint, and the MLflow store holds each run once with one row per metric and
step. Real processes, the real KFP local runner, a real MLflow store."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.mark.slow
def test_a_killed_run_resumes_without_redoing_finished_tasks_and_logs_each_run_once(tmp_path):
    from mlflow.tracking import MlflowClient
    from reliability_faults import pipeline_section  # benchmarks/reliability_faults.py: the fault as the benchmark injects it

    res = pipeline_section(tmp_path, steps=2)  # killed after step 1's checkpoint of 2, then `--resume <job>`
    root, job = Path(res.root), res.job
    assert re.search(rf"^job {job} \(new\); should it stop, `sdar run --local --root \S+ --resume {job}`",
                     res.killed_output, re.M), res.killed_output[-3000:]
    records = root / "outputs" / job / "tasks"
    assert res.tasks_finished_before == 3 and res.tasks_redone == 0  # baseline evaluation, rollout, teacher replay
    assert res.resume_status == 0, res.resume_output[-4000:]
    out2 = res.resume_output
    assert f"job {job} (continued)" in out2 and "Traceback" not in out2
    for task in ("evaluate", "rollout", "teacher-replay"):  # answered from their records, not run again
        assert f"  {task}: success in 0s (finished before in this job: not redone)" in out2, out2[-4000:]
    logs = sorted((root / "logs").iterdir())[-1]
    train_log = (logs / "gated-train.log").read_text()
    assert re.search(r"resumed from \S+/grpo-seed0/checkpoints/step-000001 at step 1", train_log), train_log[-3000:]
    assert res.resumed_at_step == 1 and "[grpo] step 1/2" not in train_log and "[grpo] step 2/2" in train_log
    assert (records / "train-grpo-0-0" / "_DONE.json").is_file()

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    names = sorted(r.info.run_name for r in runs)
    assert len(names) == 3 and names[1:] == ["grpo-seed0", "warm-start-seed0"], names  # one parent, one per arm
    assert all(r.info.status == "FINISHED" and r.data.tags["sdar.pipeline_job_id"] == job for r in runs)
    assert res.runs_duplicated == res.rows_duplicated == res.runs_left_running == 0
    grpo = next(r for r in runs if r.info.run_name == "grpo-seed0")
    assert [m.step for m in client.get_metric_history(grpo.info.run_id, "success")] == [0, 1]
    assert "final/success" in grpo.data.metrics

    # the same job again: refused with settings, and once finished (the command in this process: nothing starts)
    from sdar.cli import main

    with pytest.raises(SystemExit, match="continues the job with the settings it began with; drop arms"):
        main(["run", "--local", "--root", str(root), "--resume", job, "--arms", "sdar"])
    with pytest.raises(SystemExit, match=f"job {job} finished already"):
        main(["run", "--local", "--root", str(root), "--resume", job])
