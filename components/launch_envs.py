"""KFP component launch_envs: starts the environment service the arms share and opens the MLflow parent run
(sdar.pipeline.services.launch_env_service)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Output

from components._image import COMPONENT_OPTIONS, base_image


@dsl.component(base_image=base_image(), **COMPONENT_OPTIONS)
def launch_envs(
    config_path: str,
    overrides: str,
    job_id: str,
    endpoints: Output[Artifact],
    family: str = "",
    target: str = "local",
    output_root: str = "runs/kfp",
    experiment: str = "sdar-comparison",
    tracking: bool = True,
    tracking_uri: str = "",
    parent_run_id: str = "",
    run_name: str = "",
    namespace: str = "",
    env_image: str = "",
    replicas: int = 1,
    port: int = 8000,
    startup_timeout_s: float = 300.0,
    dry_run: bool = False,
) -> NamedTuple("LaunchOutputs", [("url", str), ("parent_run_id", str)]):
    """Serve the config's environment family for the whole pipeline run: a detached server process on
    127.0.0.1 (target "local") or a Deployment + Service of `env_image` in `namespace` (target "cluster"; the
    pod charts/sdar-envs describes), and open (or resume) the MLflow parent run. `endpoints`: the JSON the
    training and evaluation steps read (url, parent_run_id, ...). Parameters: sdar.pipeline.services."""
    from collections import namedtuple

    from sdar.pipeline.services import launch_env_service

    info = launch_env_service(
        config_path, overrides, job_id, endpoints.path, family=family, target=target, output_root=output_root,
        experiment=experiment, tracking=tracking, tracking_uri=tracking_uri, parent_run_id=parent_run_id,
        run_name=run_name, namespace=namespace, env_image=env_image, replicas=replicas, port=port,
        startup_timeout_s=startup_timeout_s, dry_run=dry_run)
    endpoints.metadata.update({"url": info["url"], "family": info["family"], "target": target})
    return namedtuple("LaunchOutputs", ["url", "parent_run_id"])(info["url"], info["parent_run_id"])
