"""The pipeline's MLflow runs: the parent run of a comparison (sdar's own, or the one KFP's MLflow integration opened,
however deep KFP nests a task's run under it), opened by launch_envs and ended by teardown_envs. The arms' runs are
the library's (`sdar.tracking.Tracker`), nested under the parent."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdar.tracking import (
    PARENT_TAG,
    PIPELINE_JOB_TAG,
    Tracker,
    default_tracking_uri,
    mlflow_client,
    resolve_tracking_uri,
)
from sdar.tracking.view import publish_view

KFP_MLFLOW_ENV = "SDAR_KFP_MLFLOW"  # auto (default) | on | off: attach to the run KFP's MLflow integration opened
OWNER_TAG = "sdar.parent_owner"  # "kfp" on a pipeline parent run that KFP opened and closes itself


@dataclass(frozen=True)
class KfpMlflowRun:
    """The MLflow runs KFP's MLflow integration (KFP 2.16+, KEP-12862) opened for this task: `task_run_id` (the
    task's nested run, MLFLOW_RUN_ID), its parent `root_run_id` (the pipeline run's), their experiment."""

    task_run_id: str
    root_run_id: str
    experiment: str
    tracking_uri: str


def kfp_mlflow_run(mode: str | None = None) -> KfpMlflowRun | None:
    """The pipeline run's MLflow run that KFP opened, when its MLflow integration is on for this run: KFP then sets
    MLFLOW_TRACKING_URI and MLFLOW_RUN_ID (the task's nested run, whose parent is the pipeline's run) on every task.
    mode (default $SDAR_KFP_MLFLOW, else auto): auto = use it when those are set; off = never (sdar opens its own
    parent run); on = require it (an error names what is missing)."""
    mode = (mode or os.environ.get(KFP_MLFLOW_ENV) or "auto").strip().lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"{KFP_MLFLOW_ENV}={mode!r}: choose auto, on or off")
    task, uri = os.environ.get("MLFLOW_RUN_ID", ""), os.environ.get("MLFLOW_TRACKING_URI", "")
    if mode == "off" or (mode == "auto" and not (task and uri)):
        return None
    if not (task and uri):
        raise RuntimeError(f"{KFP_MLFLOW_ENV}=on, but MLFLOW_RUN_ID and MLFLOW_TRACKING_URI are not both set on this "
                           "task: is KFP's MLflow integration enabled for the namespace (plugins.mlflow in the API "
                           "server config or the kfp-launcher ConfigMap)?")
    client = mlflow_client(uri)
    run = client.get_run(task)
    return KfpMlflowRun(task, pipeline_root_run(client, task), client.get_experiment(run.info.experiment_id).name, uri)


# KFP's API server tags the pipeline run's MLflow run with the KFP run id (backend/src/apiserver/plugins/mlflow/util.go)
KFP_RUN_TAG = "kfp.pipeline_run_id"


def pipeline_root_run(client, run_id: str, max_depth: int = 32) -> str:
    """The run at the top of `run_id`'s parent chain: KFP's pipeline run, however deep KFP nests a task's run. KFP's
    API server opens the pipeline run (tagged kfp.pipeline_run_id) and its drivers nest a run under it per DAG
    (the exit handler's, a ParallelFor's) and per task (backend/src/v2/driver/dag.go, container.go): a task inside
    the exit handler and a loop is three levels down. The walk stops at a run without a parent, or at KFP's
    pipeline run."""
    seen = [run_id]
    for _ in range(max_depth):
        tags = client.get_run(seen[-1]).data.tags
        parent = tags.get(PARENT_TAG)
        if not parent or tags.get(KFP_RUN_TAG) or parent in seen:
            return seen[-1]
        seen.append(parent)
    raise RuntimeError(f"run {run_id} has more than {max_depth} ancestors ({' <- '.join(seen[:4])} ...): not the "
                       "layout of KFP's MLflow integration; set SDAR_KFP_MLFLOW=off to open sdar's own parent run")


def open_pipeline_run(experiment: str, job_id: str, family: str, *, tracking_uri: str = "",
                      output_root: str = "", parent_run_id: str = "", run_name: str = "",
                      params: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """The pipeline's MLflow parent run, tagged with its job id: `parent_run_id` resumed, KFP's own pipeline run
    when its MLflow integration opened one (`kfp_mlflow_run`: then no second parent run is made, and KFP closes
    it), or a new run named `run_name` (default comparison-<job id>) with `params`. Its experiment gets the job's
    view (sdar.tracking.view.publish_view: the URL `sdar ui` prints opens it). Left RUNNING on purpose:
    close_pipeline_runs ends it with the pipeline's final state. Returns (run id, tracking URI); the run's
    experiment is `pipeline_run_experiment(run id, uri)` (KFP's may differ from `experiment`)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_root)
    tags = {PIPELINE_JOB_TAG: job_id, "sdar.kind": "pipeline", "family": family}
    kfp = None if parent_run_id else kfp_mlflow_run()
    if kfp is not None:
        client = mlflow_client(resolve_tracking_uri(kfp.tracking_uri))
        for k, v in {**tags, OWNER_TAG: "kfp"}.items():
            client.set_tag(kfp.root_run_id, k, v)
        for k, v in dict(params or {}).items():
            with contextlib.suppress(Exception):  # KFP may have logged a parameter of that name already
                client.log_param(kfp.root_run_id, f"sdar.{k}", str(v)[:6000])
        publish_view(kfp.tracking_uri, client.get_run(kfp.root_run_id).info.experiment_id, job_id)
        return kfp.root_run_id, kfp.tracking_uri
    if parent_run_id:
        tracker = Tracker(experiment, resume_run_id=parent_run_id, tracking_uri=uri, tags=tags).start()
    else:
        tracker = Tracker(experiment, run_name=run_name or f"comparison-{job_id[:8]}", tracking_uri=uri,
                          tags=tags).start()
        tracker.log_params(dict(params or {}))
    publish_view(tracker.tracking_uri, tracker.experiment_id, job_id)
    return tracker.run_id, tracker.tracking_uri


def close_pipeline_runs(experiment: str, job_id: str, state: str, *, tracking_uri: str = "",
                        output_root: str = "") -> list[str]:
    """End the parent runs of pipeline job `job_id` FINISHED when `state` is SUCCEEDED, else FAILED,
    and tag them with the state (arm runs, which end themselves, are left alone); one line each."""
    uri = resolve_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                               or default_tracking_uri(output_root))
    client = mlflow_client(uri)
    kfp = kfp_mlflow_run()  # KFP's pipeline run, tagged by launch_envs, lives in KFP's experiment
    names = {experiment} | ({kfp.experiment} if kfp is not None else set())
    ids = [e.experiment_id for e in map(client.get_experiment_by_name, sorted(names)) if e is not None]
    runs = client.search_runs(ids, f"tags.`{PIPELINE_JOB_TAG}` = '{job_id}'") if ids else []
    final = "FINISHED" if state == "SUCCEEDED" else "FAILED"
    done = []
    for run in runs:
        if run.data.tags.get(PARENT_TAG):
            continue  # arm runs end themselves
        client.set_tag(run.info.run_id, "sdar.pipeline_state", state or "UNKNOWN")
        if run.data.tags.get(OWNER_TAG) == "kfp":  # KFP's own pipeline run: KFP ends it when the run ends
            done.append(f"MLflow pipeline run {run.info.run_id} (KFP's) tagged {state or 'UNKNOWN'}")
            continue
        client.set_terminated(run.info.run_id, status=final)
        done.append(f"MLflow parent run {run.info.run_id} {final}")
    return done


def pipeline_run_experiment(run_id: str, tracking_uri: str) -> str:
    """The experiment name of run `run_id` (the arm runs go where their parent is)."""
    client = mlflow_client(resolve_tracking_uri(tracking_uri))
    return client.get_experiment(client.get_run(run_id).info.experiment_id).name
