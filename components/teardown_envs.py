"""KFP component teardown_envs: the pipeline's exit handler. Stops the environment service of this
pipeline run (local processes or the Deployment + Service) and ends the MLflow parent run with the
pipeline's final state; it runs whether the body succeeded or failed."""

from kfp import dsl

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def teardown_envs(
    job_id: str,
    status: dsl.PipelineTaskFinalStatus,
    target: str = "local",
    output_root: str = "runs/kfp",
    namespace: str = "",
    experiment: str = "sdar-comparison",
    tracking: bool = True,
    tracking_uri: str = "",
    stop_timeout_s: float = 20.0,
    dry_run: bool = False,
) -> str:
    """Find what launch_envs started for `job_id` and stop it; returns a one-line summary.

    local: the pids in <output_root>/envs/<job_id>.json, each checked to still be an sdar env
    server (a recycled pid is never signalled), SIGTERM then SIGKILL after stop_timeout_s.
    cluster: every Deployment and Service labelled sdar.io/pipeline-job=<job_id> in `namespace`
    (found by label, so a launch that died half-way is cleaned up too). dry_run: only report.
    MLflow: the parent run tagged with this job id ends FINISHED if the pipeline succeeded, else FAILED.
    Nothing found is not an error (launch_envs may have failed before starting anything).
    """
    state = (status.state or "").upper() if status is not None else "UNKNOWN"
    print(f"pipeline job {job_id} ended {state or 'UNKNOWN'}"
          + (f": {status.error_message}" if status is not None and status.error_message else ""))

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
    else:
        raise ValueError(f"target must be 'local' or 'cluster', got {target!r}")

    if tracking and not dry_run:
        from sdar.tracking import close_pipeline_runs

        done += close_pipeline_runs(experiment, job_id, state, tracking_uri=tracking_uri,
                                    output_root=output_root)
    summary = "; ".join(done)
    print(summary)
    return summary
