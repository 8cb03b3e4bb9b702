"""An MLflow store in the shape the comparison pipeline writes, made with the pipeline's own functions in seconds
(no training): the parent run and its view (sdar.pipeline.mlflow_runs.open_pipeline_run), a warm-start run per seed
(sdar.pipeline.evaluation.log_warm_start), an arm run per arm and seed as the trainer opens it (sdar.tracking.Tracker with
the parent), and the view's metrics (sdar.eval.compare.view_rows, written by sdar.tracking.comparison.log_view_metrics). `check_view` is what every such store must
satisfy; tests/pipeline/test_local_run.py checks that a real pipeline run satisfies it too."""

from __future__ import annotations

from sdar.eval.compare import ArmRun, view_rows
from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.comparison import log_view_metrics
from sdar.tracking.view import (
    EXPERIMENT_KIND_TAG,
    HELD_OUT,
    RUN_COLOR_TAG,
    TRAINING_KIND,
    VIEW_TAG_PREFIX,
    WARM_START,
    arm_color,
    view_key,
    view_runs,
)


def _evaluation(arm: str, seed: int, wins: list[int], run_id: str = "") -> dict:
    tasks = [f"task-{i}" for i in range(len(wins))]
    n = len(wins)
    return {"arm": arm, "seed": seed, "run_id": run_id, "success": sum(wins) / n, "ci95": [0.0, 1.0], "n": n,
            "per_type": {}, "task_ids": tasks, "sampling_seed": 10_007 + seed,
            "outcomes": [[t, 0, w] for t, w in zip(tasks, wins)], "metrics": {"success": sum(wins) / n}}


def build_comparison_store(uri: str, job: str, arms: list[str], seeds: list[int], experiment: str = "sdar-comparison",
                           steps: int = 3, info: dict | None = None) -> dict:
    """A comparison of `arms` x `seeds` in the store at `uri`, as pipeline job `job`; returns launch_envs' endpoints
    dict ({parent_run_id, experiment, tracking_uri}). `info`: an endpoints dict already opened (KFP's layout)."""
    from sdar.pipeline.evaluation import log_warm_start
    from sdar.pipeline.mlflow_runs import open_pipeline_run, pipeline_run_experiment
    from sdar.tracking import Tracker

    if info is None:
        parent, _ = open_pipeline_run(experiment, job, "household", tracking_uri=uri)
        info = {"parent_run_id": parent, "experiment": pipeline_run_experiment(parent, uri), "tracking_uri": uri}
    baseline = {"by_seed": {}}
    for seed in seeds:
        ws = _evaluation("grpo", seed, [1, 0, 0, 1, 0, 0])
        ws.update(run_id=log_warm_start(info, ws, uri), label="baseline")
        baseline["by_seed"][str(seed)] = ws
    runs = []
    # an attempt killed before its first checkpoint (sdar.train.loop marks it KILLED; its rerun is the arm's run)
    Tracker(info["experiment"], run_name=f"{arms[0]}-seed{seeds[0]}", parent_run_id=info["parent_run_id"],
            tracking_uri=uri, tags={"arm": arms[0], "family": "household"}).start().end("KILLED")
    for arm in arms:
        for seed in seeds:  # as sdar.train.trainer opens an arm's run
            with Tracker(info["experiment"], run_name=f"{arm}-seed{seed}", parent_run_id=info["parent_run_id"],
                         tracking_uri=uri, tags={"arm": arm, "family": "household"}) as t:
                history = [{"step": s, "success": 0.25 * s, "sdar/gap_mean": -0.1 - 0.01 * s,
                            "sdar/gate_mean": 0.4 + 0.02 * s} for s in range(1, steps + 1)]
                for row in history:
                    t.log_metrics({k: v for k, v in row.items() if k != "step"}, step=row["step"])
                ev = _evaluation(arm, seed, [1, 1, 0, 1, 0, int(arm == "sdar")], t.run_id)
                t.log_metrics({"final/success": ev["success"]})
            runs.append(ArmRun(arm, seed, ev, history, t.run_id))
    log_view_metrics(view_rows(runs, baseline), tracking_uri=uri)
    return info


def check_view(uri: str, job: str, arms: list[str], seeds: list[int]) -> list:
    """Assert the comparison's view of `job` in the store: the experiment is a model-training one and holds the
    view; the view's filter selects exactly the warm start of each seed and each arm and seed, each with the job's
    id, its arm's colour and its held-out success. Returns the runs the view shows."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exps = [e for e in client.search_experiments() if VIEW_TAG_PREFIX + view_key(job) in e.tags]
    assert len(exps) == 1, f"the view of job {job} is saved on {len(exps)} experiments"
    assert exps[0].tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND
    shown = view_runs(uri, exps[0].experiment_id, job)
    want = sorted([f"{WARM_START}-seed{s}" for s in seeds] + [f"{a}-seed{s}" for a in arms for s in seeds])
    assert sorted(r.info.run_name for r in shown) == want
    for r in shown:
        assert r.data.tags[PIPELINE_JOB_TAG] == job and r.data.tags[RUN_COLOR_TAG] == arm_color(r.data.tags["arm"])
        assert HELD_OUT in r.data.metrics, r.info.run_name
    return shown
