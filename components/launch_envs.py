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
    in `namespace` ("" = this pod's), through the Kubernetes API; waits until ready.
    dry_run (cluster): build the manifests and write them to `endpoints` without calling the API.
    MLflow: when tracking, `parent_run_id` (or a new run named `run_name`) is the pipeline's parent
    run, tagged with the job id so teardown_envs can close it with the pipeline's final state.
    endpoints: JSON {family, target, url, parent_run_id, experiment, tracking_uri, ...} that the
    training and evaluation steps read (an artifact, so it also reaches ParallelFor bodies in the
    KFP local runner, which replaces task-output parameters passed into a loop by the loop item).
    """
    import json
    import os
    import re
    import time
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
    info = {"family": fam, "target": target, "job_id": job_id, "experiment": experiment, "tracking": tracking}

    # ---- MLflow parent run ------------------------------------------------------------------
    if tracking:
        from sdar.tracking import Tracker, default_tracking_uri

        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(output_root)
        tags = {"sdar.pipeline_job_id": job_id, "sdar.kind": "pipeline", "family": fam}
        if parent_run_id:
            tracker = Tracker(experiment, resume_run_id=parent_run_id, tracking_uri=uri, tags=tags).start()
        else:
            tracker = Tracker(experiment, run_name=run_name or f"comparison-{job_id[:8]}", tracking_uri=uri,
                              tags=tags).start()
            tracker.log_params({"config_path": config_path, "overrides": json.dumps(ov, sort_keys=True)})
        # left RUNNING on purpose: teardown_envs ends it with the pipeline's final state
        info.update(parent_run_id=tracker.run_id, tracking_uri=tracker.tracking_uri)
    else:
        info.update(parent_run_id="", tracking_uri="")

    # ---- the environment service ------------------------------------------------------------
    if target == "local":
        from sdar_envs.client import serve_in_background

        url, handle = serve_in_background(fam, die_with_parent=False, startup_timeout_s=startup_timeout_s, **env_kwargs)
        info.update(url=url, pids=[handle.pid], log=str(handle.log_path))
        registry = Path(output_root) / "envs" / f"{job_id}.json"
        registry.parent.mkdir(parents=True, exist_ok=True)
        registry.write_text(json.dumps(info, indent=1))
        info["registry"] = str(registry.resolve())
        print(f"serving {fam} at {url} (pid {handle.pid}); teardown_envs stops it")
    else:
        # DNS-1035 name: lowercase alphanumerics and '-', starting with a letter, at most 63 characters
        name = re.sub(r"[^a-z0-9-]+", "-", f"sdar-env-{fam}-{job_id}".lower()).strip("-")[:63].rstrip("-")
        ns = namespace
        sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        if not ns and sa_ns.is_file():
            ns = sa_ns.read_text().strip()
        ns = ns or "kubeflow"
        from sdar.images import env_server_image

        image = env_image or env_server_image()
        labels = {"app.kubernetes.io/name": "sdar-env-server", "app.kubernetes.io/component": "environment",
                  "app.kubernetes.io/managed-by": "sdar-pipeline", "sdar.io/family": fam,
                  "sdar.io/pipeline-job": re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)[:63]}
        selector = {"app.kubernetes.io/name": "sdar-env-server", "sdar.io/pipeline-job": labels["sdar.io/pipeline-job"]}
        args = ["envs", "serve", "--env", fam, "--host", "0.0.0.0", "--port", str(port),
                "--env-kwargs", json.dumps(env_kwargs)]
        probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 4}
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "replicas": replicas, "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "automountServiceAccountToken": False,  # the servers call no Kubernetes API
                        "enableServiceLinks": False,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                            "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "env", "image": image, "args": args,
                            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
                            "env": [{"name": "SDAR_ENV_PORT", "value": str(port)}],
                            "startupProbe": {**probe, "failureThreshold": 60},
                            "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "readOnlyRootFilesystem": True, "runAsNonRoot": True},
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        }],
                        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "512Mi"}}],
                    },
                },
            },
        }
        service = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]},
        }
        url = f"http://{name}.{ns}.svc.cluster.local:{port}"
        info.update(url=url, namespace=ns, name=name, manifests=[deployment, service], dry_run=dry_run)
        if not dry_run:
            from kubernetes import client as k8s
            from kubernetes import config as k8s_config

            try:
                k8s_config.load_incluster_config()
            except k8s_config.ConfigException:
                k8s_config.load_kube_config()  # running outside a pod (a developer's kubeconfig)
            apps, core = k8s.AppsV1Api(), k8s.CoreV1Api()
            for create in (lambda: apps.create_namespaced_deployment(ns, deployment),
                           lambda: core.create_namespaced_service(ns, service)):
                try:
                    create()
                except k8s.ApiException as exc:
                    if exc.status != 409:  # 409: a retried step finds its own objects: use them
                        raise
            deadline = time.monotonic() + startup_timeout_s
            while True:
                status = apps.read_namespaced_deployment_status(name, ns).status
                if (status.ready_replicas or 0) >= replicas:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"deployment {ns}/{name} has {status.ready_replicas or 0}/{replicas} ready pods after "
                        f"{startup_timeout_s:g} s; check `kubectl -n {ns} describe deployment {name}` (image pull, "
                        "resources) and raise startup_timeout_s for slow backends"
                    )
                time.sleep(3)
            from sdar_envs.client import wait_healthy

            wait_healthy(url, timeout_s=max(30.0, deadline - time.monotonic()))
            print(f"serving {fam} at {url} ({replicas} pod(s) of {image})")

    Path(endpoints.path).parent.mkdir(parents=True, exist_ok=True)
    Path(endpoints.path).write_text(json.dumps(info, indent=1))
    endpoints.metadata.update({"url": info["url"], "family": fam, "target": target})
    return namedtuple("LaunchOutputs", ["url", "parent_run_id"])(info["url"], info["parent_run_id"])
