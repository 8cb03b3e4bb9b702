"""KFP component teardown_envs: the pipeline's exit handler; stops this run's environment service and ends the
MLflow parent run with the pipeline's final state (sdar.pipeline.services.teardown_env_service)."""

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
    trainjob_namespace: str = "",
) -> str:
    """Find what launch_envs started for `job_id` and stop it (local: the registered server pids, each checked
    to still be an sdar env server; cluster: the Deployments and Services labelled with the job in
    `namespace`, and the run's training jobs, TrainJobs and TorchX's Volcano Jobs, in `trainjob_namespace`,
    "" = this pod's), and end the MLflow parent run FINISHED if the pipeline succeeded, else FAILED; runs whether
    the body succeeded or failed, and finding nothing is not an error. Returns a one-line summary.
    Parameters: sdar.pipeline.services.teardown_env_service (dry_run: only report)."""
    from sdar.pipeline.services import teardown_env_service

    state, error = (status.state or "", status.error_message) if status is not None else (None, None)
    return teardown_env_service(job_id, state, error, target=target, output_root=output_root, namespace=namespace,
                                experiment=experiment, tracking=tracking, tracking_uri=tracking_uri,
                                stop_timeout_s=stop_timeout_s, dry_run=dry_run,
                                trainjob_namespace=trainjob_namespace)
