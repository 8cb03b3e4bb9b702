"""The comparison pipeline's first and last steps, as plain functions (the components launch_envs and
teardown_envs call them): the environment service the arms share (a detached server process on 127.0.0.1
locally, a Deployment + Service on a cluster) and the pipeline's MLflow parent run, opened at launch and
closed at teardown with the pipeline's final state."""

from __future__ import annotations

import json
from typing import Any

from sdar.env_service import cluster
from sdar.images import env_server_image
from sdar.launch.job import job_namespace
from sdar.pipeline.jobs import job_of
from sdar.pipeline.settings import TARGETS
from sdar.pipeline.steps import step_overrides, write_json


def launch_env_service(config_path: str, overrides: str, job_id: str, endpoints_path: str, *, family: str = "",
                       target: str = "local", output_root: str = "runs/kfp", experiment: str = "sdar-comparison",
                       tracking: bool = True, tracking_uri: str = "", parent_run_id: str = "", run_name: str = "",
                       namespace: str = "", env_image: str = "", replicas: int = 1, port: int = 8000,
                       startup_timeout_s: float = 300.0, dry_run: bool = False) -> dict[str, Any]:
    """Serve the config's environment family for the whole pipeline run and write where to
    `endpoints_path`; returns the same dict.

    target "local": `python -m sdar_envs.server` on a free 127.0.0.1 port, detached so it outlives
    this step; its pid goes to <output_root>/envs/<job_id>.json for teardown_envs.
    target "cluster": a Deployment (replicas pods of env_image, default sdar.images.env_server_image():
    SDAR_ENV_IMAGE or <registry>/sdar-env-server:<tag>) and a ClusterIP Service named after the job
    in `namespace` ("" = this pod's), through the Kubernetes API; waits until ready. The pod is the
    one charts/sdar-envs describes for the family (its values.yaml: probes, resources, security
    contexts; sdar.env_service.manifests), with the config's env kwargs.
    dry_run (cluster): build the manifests and write them to the endpoints without calling the API.
    MLflow: when tracking, `parent_run_id` (or a new run named `run_name`) is the pipeline's parent
    run, tagged with the job id so teardown_envs can close it with the pipeline's final state.
    endpoints: JSON {family, target, url, parent_run_id, experiment, tracking_uri, ...} that the
    training and evaluation steps read (an artifact, so it also reaches ParallelFor bodies in the
    KFP local runner, which replaces task-output parameters passed into a loop by the loop item).
    """
    from sdar.config import load_config

    if target not in TARGETS:
        raise ValueError(f"target must be 'local' or 'cluster', got {target!r}")
    job_id = job_of(job_id)  # the local runner's own job id, which a resumed run keeps
    ov = step_overrides(overrides, family=family)
    cfg = load_config(config_path, ov)
    fam, env_kwargs = cfg.env.family, dict(cfg.env.kwargs)
    info = {"family": fam, "target": target, "job_id": job_id, "experiment": experiment, "tracking": tracking,
            "parent_run_id": "", "tracking_uri": ""}
    if tracking:
        from sdar.pipeline.mlflow_runs import open_pipeline_run, pipeline_run_experiment

        # KFP's own pipeline run when its MLflow integration is on (sdar.pipeline.mlflow_runs.kfp_mlflow_run), else sdar's
        run_id, uri = open_pipeline_run(
            experiment, job_id, fam, tracking_uri=tracking_uri, output_root=output_root,
            parent_run_id=parent_run_id, run_name=run_name,
            params={"config_path": config_path, "overrides": json.dumps(ov, sort_keys=True)})
        # the arm runs go into the parent's experiment, which KFP's integration chooses when it opened the parent
        info.update(parent_run_id=run_id, tracking_uri=uri, experiment=pipeline_run_experiment(run_id, uri))
    if target == "local":
        from sdar.env_service import local

        info.update(local.serve(fam, env_kwargs, job_id, output_root, startup_timeout_s, info))
    else:
        info.update(_deploy(fam, env_kwargs, job_id, namespace, env_image, replicas, port, startup_timeout_s, dry_run))
    write_json(endpoints_path, info)
    return info


def _deploy(family: str, env_kwargs: dict[str, Any], job_id: str, namespace: str, env_image: str, replicas: int,
            port: int, startup_timeout_s: float, dry_run: bool) -> dict[str, Any]:
    """The env service's Deployment and Service on the cluster (only built with dry_run); its endpoints keys."""
    from sdar.env_service.manifests import manifests

    ns = cluster.namespace_of(namespace)
    image = env_image or env_server_image()
    deployment, service = manifests(family, job_id, ns, image, replicas, port, env_kwargs)
    name = deployment["metadata"]["name"]
    url = f"http://{name}.{ns}.svc.cluster.local:{port}"
    if not dry_run:
        cluster.create(deployment, service)
        cluster.wait_serving(deployment, url, startup_timeout_s)
        print(f"serving {family} at {url} ({replicas} pod(s) of {image})")
    return {"url": url, "namespace": ns, "name": name, "manifests": [deployment, service], "dry_run": dry_run}


def teardown_env_service(job_id: str, state: str | None, error_message: str | None = None, *, target: str = "local",
                         output_root: str = "runs/kfp", namespace: str = "", experiment: str = "sdar-comparison",
                         tracking: bool = True, tracking_uri: str = "", stop_timeout_s: float = 20.0,
                         dry_run: bool = False, trainjob_namespace: str = "") -> str:
    """Find what launch_env_service started for `job_id` and stop it, and the training jobs of the run; returns a
    one-line summary.

    state / error_message: the pipeline's final state (KFP's PipelineTaskFinalStatus; state None: no status).
    local: the pids in <output_root>/envs/<job_id>.json, each checked to still be an sdar env
    server (a recycled pid is never signalled), SIGTERM then SIGKILL after stop_timeout_s.
    cluster: every Deployment and Service labelled sdar.io/pipeline-job=<job_id> in `namespace`
    (found by label, so a launch that died half-way is cleaned up too), and every training job with that label
    in `trainjob_namespace` ("" = this pod's, where gated_train creates them), Kubeflow Trainer TrainJobs and
    TorchX's Volcano Jobs: a gated_train pod killed without SIGTERM (its node lost) cannot delete its own.
    dry_run: only report.
    MLflow: the parent run tagged with this job id ends FINISHED if the pipeline succeeded, else FAILED.
    Nothing found is not an error (launch_envs may have failed before starting anything); training jobs that
    could not be deleted are, after the rest is done.
    """
    state, job_id = "UNKNOWN" if state is None else state.upper(), job_of(job_id)
    left: RuntimeError | None = None  # training jobs that could not be deleted: raised once the rest is torn down
    print(f"pipeline job {job_id} ended {state or 'UNKNOWN'}" + (f": {error_message}" if error_message else ""))
    if target == "local":
        from sdar.env_service import local

        done = local.stop(job_id, output_root, stop_timeout_s, dry_run)
    elif target == "cluster":
        from sdar.env_service import cluster
        from sdar.env_service.manifests import JOB_LABEL, job_label

        ns = cluster.namespace_of(namespace)
        selector = f"{JOB_LABEL}={job_label(job_id)}"
        if dry_run:
            done = [f"would delete deployments and services with {selector} in {ns}"]
        else:
            done = cluster.delete_labelled(ns, selector) or [f"nothing labelled {selector} in {ns}"]
        left = _delete_jobs(selector, trainjob_namespace, dry_run, done)
    else:
        raise ValueError(f"target must be 'local' or 'cluster', got {target!r}")
    if tracking and not dry_run:
        from sdar.pipeline.mlflow_runs import close_pipeline_runs

        done += close_pipeline_runs(experiment, job_id, state, tracking_uri=tracking_uri, output_root=output_root)
    summary = "; ".join(done)
    print(summary)
    if left is not None:
        raise left
    return summary


def _delete_jobs(selector: str, namespace: str, dry_run: bool, done: list[str]) -> RuntimeError | None:
    """The run's training jobs in `namespace` ("" = this pod's), whichever launcher made them: TrainJobs
    (sdar.launch.trainjob) and TorchX's Volcano Jobs (sdar.launch.torchx_job); each line into `done`. Returns the
    error of those left, for the caller to raise once the rest is torn down."""
    from sdar.config import LaunchConfig
    from sdar.launch import torchx_job, trainjob

    ns = job_namespace(LaunchConfig(namespace=namespace))
    if dry_run:
        done.append(f"would delete TrainJobs and Volcano Jobs with {selector} in {ns}")
        return None
    left: RuntimeError | None = None
    for kind, delete in ((trainjob.TRAINJOB, trainjob.delete_labelled),
                         (torchx_job.VOLCANO_JOB, torchx_job.delete_labelled)):
        try:
            done += delete(ns, selector) or [f"no {kind.kind} labelled {selector} in {ns}"]
        except RuntimeError as exc:
            done.append(str(exc))
            left = exc if left is None else RuntimeError(f"{left}; {exc}")
    return left
