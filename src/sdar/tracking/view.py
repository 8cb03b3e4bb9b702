"""The MLflow view of a comparison: what a person sees when they open the URL `sdar run`, `sdar demo`, `sdar ui` and
`sdar submit` print. Everything lives on the tracking server, so a browser that has never seen MLflow gets it:

- the experiment's tags: `mlflow.experimentKind` (model training, not GenAI) and a saved view
  (`mlflow.sharedViewState.<key>`, what MLflow's own Share button writes) that the URL names;
- the runs' tags: the pipeline job's id on every run of the comparison (sdar.tracking passes it from the parent to
  its children, whatever nesting KFP gives them) and a fixed colour per arm (`mlflow.runColor`, the colour of the
  report's plot);
- the URL's `workflowType=machine_learning` (MLflow 3.10-3.18 open an experiment in their GenAI view otherwise).

The view lists the warm start and every arm and seed of one pipeline job flat (its filter selects those runs,
so MLflow does not nest them under their parent) and charts held-out success per run (the warm start is the
reference bar), its paired difference from the seed's warm start, and training success, gap, gate and the
distillation weight over steps.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

from sdar.tags import PIPELINE_JOB_TAG
from sdar.tracking.store import mlflow_client

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"  # MLflow's model-training kind (genai_development is the other)
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
RUN_COLOR_TAG = "mlflow.runColor"
WARM_START = "warm-start"  # the `arm` tag of a warm start's evaluation run (the reference of every chart)

# one colour per arm, everywhere (MLflow's run colours and the report's plot); matplotlib's tab10 order
ARM_COLORS = {
    "grpo": "#1f77b4", "grpo_opsd": "#ff7f0e", "sdar": "#2ca02c", "opsd": "#d62728", "skill_grpo": "#9467bd",
    "grpo_hint": "#8c564b", "grpo_replay": "#e377c2", "composer": "#bcbd22", "sdar_composer": "#17becf",
    WARM_START: "#7f7f7f",
}
_SPARE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")

# the view's metrics, logged by the compare step into every run it shows (sdar.tracking.comparison.log_view_metrics) under
# names that read as chart titles: (chart type, metric). Held-out success first, the warm start its reference bar.
HELD_OUT = "held-out success"
VS_WARM_START = "held-out success - own warm start"
TRAIN_SUCCESS = "training success"
GAP = "teacher-student gap"
GATE = "gate"
DISTILL_WEIGHT = "distillation weight"
CHARTS = (("BAR", HELD_OUT), ("BAR", VS_WARM_START), ("LINE", TRAIN_SUCCESS), ("LINE", GAP), ("LINE", GATE),
          ("LINE", DISTILL_WEIGHT))
TITLES = {  # what each chart shows, for the section's readers (MLflow titles a chart by its metric)
    HELD_OUT: "the held-out tasks' success of each run; the warm-start runs are the policies before RL",
    VS_WARM_START: "an arm's held-out success minus its own seed's warm start, paired episode by episode",
    TRAIN_SUCCESS: "success of the training rollouts per step",
    GAP: "teacher - student log-prob gap per step (sdar/gap_mean)",
    GATE: "mean SDAR gate per step (the naive arm's is 0.5)",
    DISTILL_WEIGHT: "the distillation term's weight per step: lambda x gate (0 for GRPO)",
}
SECTION = "sdar comparison: held-out success (warm start = before RL), training success, gap, gate, distillation"



@dataclass(frozen=True)
class ViewRows:
    """The view's metrics (CHARTS) for one MLflow run: {metric: value} at `step` (sdar.eval.compare.view_rows makes
    them, sdar.tracking.comparison.log_view_metrics writes them)."""

    run_id: str
    step: int
    metrics: dict[str, float]

def arm_color(arm: str) -> str:
    """The arm's fixed colour (hex); an arm outside ARM_COLORS gets a stable one of the spare colours."""
    return ARM_COLORS.get(arm) or _SPARE[zlib.crc32(arm.encode()) % len(_SPARE)]


def view_key(job_id: str) -> str:
    """The saved view's key of pipeline job `job_id` (the URL's viewStateShareKey)."""
    return "sdar-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", job_id).strip("-") or "job")


def view_filter(job_id: str) -> str:
    """The MLflow search filter of the view: the runs of the job that carry an arm (the arms and warm starts), less
    the attempts that were killed (a run killed before its first checkpoint is marked KILLED, and its rerun is the
    run to show)."""
    return f"tags.`{PIPELINE_JOB_TAG}` = '{job_id}' and tags.`arm` LIKE '%' and attributes.status != 'KILLED'"


def _chart(kind: str, metric: str, section: str) -> dict[str, Any]:
    card: dict[str, Any] = {"type": kind, "uuid": "sdar-" + re.sub(r"\W+", "-", metric), "metricSectionId": section,
                            "metricKey": metric, "displayName": TITLES[metric], "runsCountToCompare": 100,
                            "isGenerated": False, "deleted": False}
    if kind == "LINE":
        card.update(selectedMetricKeys=[metric], xAxisKey="step", selectedXAxisMetricKey="", lineSmoothness=0,
                    scaleType="linear", xAxisScaleType="linear", useGlobalXaxisKey=False,
                    useGlobalLineSmoothing=False, range={})
    return card


def view_state(job_id: str) -> dict[str, Any]:
    """The saved view (MLflow's shared view state: search facets and UI state) of pipeline job `job_id`."""
    sections = [{"uuid": "sdar-section", "name": SECTION, "display": True, "isReordered": True, "deleted": False,
                 "isGenerated": False}]
    sections += [{"uuid": f"sdar-{name.split()[0].lower()}", "name": name, "display": False, "isReordered": False,
                  "deleted": False, "isGenerated": True} for name in ("Model metrics", "System metrics")]
    return {
        "searchFilter": view_filter(job_id), "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
        "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": [],
        "runsHiddenMode": "SHOW_ALL", "runsVisibilityMap": {}, "runsHidden": [], "runsPinned": [], "runsExpanded": {},
        "compareRunCharts": [_chart(kind, metric, "sdar-section") for kind, metric in CHARTS],
        "compareRunSections": sections, "isAccordionReordered": True, "hideEmptyCharts": True,
        "autoRefreshEnabled": True, "viewMaximized": False, "runListHidden": False, "groupBy": None,
        "groupsExpanded": {}, "useGroupedValuesInCharts": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def publish_view(tracking_uri: str, experiment_id: str, job_id: str) -> str:
    """Make the experiment a model-training one and save the job's view on it (idempotent); returns its key."""
    client = mlflow_client(tracking_uri)
    key = view_key(job_id)
    set_experiment_tag_once(client, experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    set_experiment_tag_once(client, experiment_id, VIEW_TAG_PREFIX + key, json.dumps(view_state(job_id)))
    return key


def set_experiment_tag_once(client, experiment_id: str, key: str, value: str, attempts: int = 3) -> None:
    """Set an experiment tag unless it already holds `value`, safe against another process setting it at the same
    moment: MLflow's SQL store inserts a new tag after a read, so two jobs that publish at once on one PostgreSQL
    store can both read "absent" and one insert fails with a unique-key violation. That failure is retried after
    reading the tag again; it is an error only if the tag still differs after `attempts` tries."""
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        if client.get_experiment(experiment_id).tags.get(key) == value:
            return
        try:
            client.set_experiment_tag(experiment_id, key, value)
            return
        except MlflowException:
            if attempt == attempts - 1:
                raise


def published_view(tracking_uri: str, experiment_id: str, job_id: str, port: int = 5000) -> dict[str, str]:
    """Save the job's view on its experiment and say how to open it: {job_id, ui_command, view_url}. For a local
    store `ui_command` (`sdar ui`) serves it on 127.0.0.1:`port`, where `view_url` opens the view; for an http(s)
    tracking server `ui_command` is empty and `view_url` is on that server, whose UI it is."""
    publish_view(tracking_uri, experiment_id, job_id)
    if tracking_uri.startswith(("http://", "https://")):
        return {"job_id": job_id, "ui_command": "", "view_url": view_url(tracking_uri, experiment_id, job_id)}
    command = f"sdar ui --tracking-uri {tracking_uri} --job {job_id}" + (f" --port {port}" if port != 5000 else "")
    return {"job_id": job_id, "ui_command": command,
            "view_url": view_url(f"http://127.0.0.1:{port}", experiment_id, job_id)}


def how_to_open(view: dict[str, str], store: str = "this store") -> str:
    """The words before a printed view URL: start `sdar ui` on `store` first, or (a tracking server) open its UI."""
    if view["ui_command"]:
        return f"`{view['ui_command']}` starts the MLflow UI on {store}, then open"
    return "open the tracking server's own UI at"


def view_url(base_url: str, experiment_id: str, job_id: str) -> str:
    """The URL of the job's view on the MLflow UI at `base_url` (e.g. http://127.0.0.1:5000)."""
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={view_key(job_id)}&compareRunsMode=CHART")


def view_runs(tracking_uri: str, experiment_id: str, job_id: str) -> list:
    """The runs the job's view shows (MLflow Run objects, by run name)."""
    return mlflow_client(tracking_uri).search_runs([experiment_id], view_filter(job_id),
                                                               order_by=["tags.`mlflow.runName` ASC"])
