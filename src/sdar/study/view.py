"""A study's runs side by side in MLflow, the way `sdar run --local` shows a comparison: the study's runs carry its job
id (`study-<name>`, PIPELINE_JOB_TAG), each finished run gets the view's metrics (sdar.eval.compare.view_rows) and
each evaluated warm start a run of its own, and the view is saved on the experiment (sdar.tracking.view), so that
`sdar ui --tracking-uri <store> --job study-<name>` (printed by `sdar study run` and `sdar study status`) opens it.
In a study of several families each run's name says its family (`grpo-shop-seed0`, `warm-start-shop-seed0`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.comparison import log_view_metrics
from sdar.tracking.store import mlflow_client
from sdar.tracking.view import RUN_COLOR_TAG, WARM_START, arm_color, published_view

VIEW_LOGGED_TAG = "sdar.view_metrics"  # the eval step whose view metrics a run carries: logged again when it moves


def study_view(runner, port: int = 5000) -> dict[str, str] | None:
    """{job_id, ui_command, view_url} of `runner`'s study (a sdar.study.runner.StudyRunner), or None before it has
    logged anything. Runs logged before studies tagged their job (or resumed under a parent made then) get the tag
    here, and the view's metrics of every run finished since the last call."""
    state = _read(runner.work / "parent_run.json")
    if not state or not state.get("run_id"):
        return None
    uri, parent_id = state["tracking_uri"], state["run_id"]
    client = mlflow_client(uri)
    parent = client.get_run(parent_id)
    exp = parent.info.experiment_id
    children = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=10_000)
    for run in (parent, *children):
        if run.data.tags.get(PIPELINE_JOB_TAG) != runner.job_id:
            client.set_tag(run.info.run_id, PIPELINE_JOB_TAG, runner.job_id)
    if len({c.family for c in runner.spec.cells()}) > 1:  # `grpo-seed0` of each family: one name per run in the view
        for run in children:
            arm, family, name = run.data.tags.get("arm"), run.data.tags.get("family"), run.info.run_name or ""
            if arm and family and arm != WARM_START and name.startswith(f"{arm}-seed"):
                client.update_run(run.info.run_id, name=f"{arm}-{family}-{name[len(arm) + 1:]}")
    _log_view_metrics(runner, client, uri, parent_id, exp, children)
    return published_view(uri, exp, runner.job_id, port)


def _log_view_metrics(runner, client, uri: str, parent_id: str, exp: str, children: list) -> None:
    """What the view charts, once per run and evaluation: each finished cell's held-out success at its last eval
    step and its paired difference from its seed's warm start, its per-step training success, gap, gate and
    distillation weight; each evaluated warm start as a run of its own (arm `warm-start`), the bars' reference, as a
    comparison's."""
    from sdar.eval.compare import ArmRun, view_rows

    cells = runner.spec.cells()
    logged = {r.info.run_id: r.data.tags.get(VIEW_LOGGED_TAG) for r in children}
    warm_runs = {(r.data.tags.get("family"), r.data.tags.get("sdar.seed")): r.info.run_id for r in children
                 if r.data.tags.get("arm") == WARM_START}
    one_family = len({c.family for c in cells}) == 1
    for family in dict.fromkeys(c.family for c in cells):
        baseline: dict[str, Any] = {"by_seed": {}}
        for seed in dict.fromkeys(c.seed for c in cells if c.family == family):
            warm = _read(runner.warmstart_path(family, seed))
            if not warm:
                continue
            run_id = warm_runs.get((family, str(seed)))
            if run_id is None:  # the warm start's evaluation as a run, finished at once
                name = f"warm-start-seed{seed}" if one_family else f"warm-start-{family}-seed{seed}"
                run_id = client.create_run(exp, run_name=name, tags={
                    "mlflow.parentRunId": parent_id, PIPELINE_JOB_TAG: runner.job_id, "arm": WARM_START,
                    "family": family, "sdar.seed": str(seed), RUN_COLOR_TAG: arm_color(WARM_START)}).info.run_id
                client.set_terminated(run_id, "FINISHED")
            baseline["by_seed"][str(seed)] = {"run_id": None if logged.get(run_id) else run_id,
                                              **_evaluation(warm["student"])}
        runs, last = [], str(max(runner.spec.eval_steps))
        for cell in cells:
            rec = _read(runner.result_path(cell)) if cell.family == family else None
            if rec and runner.complete(rec) and rec.get("run_id") and logged.get(rec["run_id"]) != last:
                ev = _evaluation(rec["evals"][last])
                runs.append(ArmRun(cell.arm, cell.seed, ev, rec.get("history", []), rec["run_id"]))
        log_view_metrics(view_rows(runs, baseline), tracking_uri=uri)
        for ws in baseline["by_seed"].values():
            if ws["run_id"]:
                client.set_tag(ws["run_id"], VIEW_LOGGED_TAG, "0")
        for r in runs:
            client.set_tag(r.run_id, VIEW_LOGGED_TAG, last)


def _evaluation(ev: dict[str, Any]) -> dict[str, Any]:
    """A study record's evaluation as sdar.eval.compare reads one: its success and its episodes' outcomes
    (task, repeat, won), one episode per task."""
    return {"success": float(ev["success"]), "outcomes": [(t, 0, int(w)) for t, w in ev.get("tasks", {}).items()]}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
