"""KFP component launch_envs: starts the environment service the arms share (a detached server
process on 127.0.0.1 locally, a Deployment + Service on a cluster) and opens the MLflow parent run."""

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
    """Serve the config's environment family for the whole pipeline run.

    target "local": `python -m sdar_envs.server` on a free 127.0.0.1 port, detached so it outlives
    this step; its pid goes to <output_root>/envs/<job_id>.json for teardown_envs.
    target "cluster": a Deployment (replicas pods of env_image, default sdar.images.env_server_image():
    SDAR_ENV_IMAGE or <registry>/sdar-env-server:<tag>) and a ClusterIP Service named after the job
    in `namespace` ("" = this pod's), through the Kubernetes API; waits until ready. The pod is the
    one charts/sdar-envs describes for the family (its values.yaml: probes, resources, security
    contexts; sdar.env_service.manifests), with the config's env kwargs.
    dry_run (cluster): build the manifests and write them to `endpoints` without calling the API.
    MLflow: when tracking, `parent_run_id` (or a new run named `run_name`) is the pipeline's parent
    run, tagged with the job id so teardown_envs can close it with the pipeline's final state.
    endpoints: JSON {family, target, url, parent_run_id, experiment, tracking_uri, ...} that the
    training and evaluation steps read (an artifact, so it also reaches ParallelFor bodies in the
    KFP local runner, which replaces task-output parameters passed into a loop by the loop item).
    """
    import json
    from collections import namedtuple
    from pathlib import Path

    from sdar.config import load_config, parse_overrides

    if target not in ("local", "cluster"):
        raise ValueError(f"target must be 'local' or 'cluster', got {target!r}")
    ov = parse_overrides(overrides)
    if family:
        ov["env.family"] = family
    cfg = load_config(config_path, ov)
    fam, env_kwargs = cfg.env.family, dict(cfg.env.kwargs)
    info = {"family": fam, "target": target, "job_id": job_id, "experiment": experiment, "tracking": tracking,
            "parent_run_id": "", "tracking_uri": ""}

    if tracking:
        from sdar.tracking import open_pipeline_run

        run_id, uri = open_pipeline_run(
            experiment, job_id, fam, tracking_uri=tracking_uri, output_root=output_root,
            parent_run_id=parent_run_id, run_name=run_name,
            params={"config_path": config_path, "overrides": json.dumps(ov, sort_keys=True)})
        info.update(parent_run_id=run_id, tracking_uri=uri)

    if target == "local":
        from sdar.env_service import local

        info.update(local.serve(fam, env_kwargs, job_id, output_root, startup_timeout_s, info))
    else:
        from sdar.env_service import cluster
        from sdar.env_service.manifests import manifests
        from sdar.images import env_server_image

        ns = cluster.namespace_of(namespace)
        image = env_image or env_server_image()
        deployment, service = manifests(fam, job_id, ns, image, replicas, port, env_kwargs)
        name = deployment["metadata"]["name"]
        url = f"http://{name}.{ns}.svc.cluster.local:{port}"
        info.update(url=url, namespace=ns, name=name, manifests=[deployment, service], dry_run=dry_run)
        if not dry_run:
            cluster.create(deployment, service)
            cluster.wait_serving(deployment, url, startup_timeout_s)
            print(f"serving {fam} at {url} ({replicas} pod(s) of {image})")

    Path(endpoints.path).parent.mkdir(parents=True, exist_ok=True)
    Path(endpoints.path).write_text(json.dumps(info, indent=1))
    endpoints.metadata.update({"url": info["url"], "family": fam, "target": target})
    return namedtuple("LaunchOutputs", ["url", "parent_run_id"])(info["url"], info["parent_run_id"])
