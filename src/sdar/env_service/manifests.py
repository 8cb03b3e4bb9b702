"""The Deployment and Service of one pipeline run's environment server, built from the values of
charts/sdar-envs and laid out as its templates lay out one family: the chart is the one source.

What differs from a `helm install` on purpose: the objects' identity (named and labelled after the
pipeline job, so teardown_envs finds them by label), the image (the pipeline's env-server image),
the config's env kwargs (`--env-kwargs`) instead of the chart's `--backend`, and no operator-token
Secret, ServiceAccount or ALFWorld data volume, which belong to a chart install.
tests/deploy/test_env_service_chart.py renders the chart with helm and checks the rest is equal.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

# $SDAR_ENV_CHART names the chart directory outright (a checkout finds its own; the trainer image
# holds a copy under its working directory, as it holds configs/)
CHART_ENV = "SDAR_ENV_CHART"
CHART_SUBPATH = Path("charts") / "sdar-envs"
# the label teardown_envs deletes by; its value is the job id (see job_label)
JOB_LABEL = "sdar.io/pipeline-job"
# app.kubernetes.io/name of the servers launch_envs starts (the chart's own pods say sdar-envs);
# the NetworkPolicies in k8s/ admit both names
NAME = "sdar-env-server"
# templates/deployment.yaml writes this number, not a value
REVISION_HISTORY_LIMIT = 3


def chart_dir() -> Path:
    """charts/sdar-envs: $SDAR_ENV_CHART when set, else the checkout's beside this package, else
    ./charts/sdar-envs (the trainer image's working directory holds one)."""
    if os.environ.get(CHART_ENV):
        candidates = [Path(os.environ[CHART_ENV])]
    else:
        candidates = [Path(__file__).resolve().parents[3] / CHART_SUBPATH, Path.cwd() / CHART_SUBPATH]
    for path in candidates:
        if (path / "values.yaml").is_file():
            return path
    raise FileNotFoundError(
        f"no charts/sdar-envs/values.yaml at {', '.join(map(str, candidates))}; the env-server "
        f"Deployment is built from the chart's values: run from the repository root, or set "
        f"{CHART_ENV} to the chart's directory"
    )


def chart_values(chart: Path | None = None) -> dict[str, Any]:
    """The chart's default values (values.yaml)."""
    return yaml.safe_load(((chart or chart_dir()) / "values.yaml").read_text())


def job_label(job_id: str) -> str:
    """The job id as a label value: letters, digits, '-', '_' and '.', at most 63 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)[:63]


def resource_name(family: str, job_id: str) -> str:
    """sdar-env-<family>-<job id> as a DNS-1035 name: lowercase alphanumerics and '-', starting
    with a letter, at most 63 characters."""
    return re.sub(r"[^a-z0-9-]+", "-", f"sdar-env-{family}-{job_id}".lower()).strip("-")[:63].rstrip("-")


def labels(family: str, name: str, job_id: str, values: dict[str, Any]) -> dict[str, str]:
    """The chart's label vocabulary (part-of, component = the family, commonLabels) with this run's
    identity in place of the Helm release's."""
    return {
        **values.get("commonLabels", {}),
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": family,
        "app.kubernetes.io/part-of": "sdar",
        "app.kubernetes.io/managed-by": "sdar-pipeline",
        "sdar.io/family": family,
        JOB_LABEL: job_label(job_id),
    }


def selector(job_id: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, JOB_LABEL: job_label(job_id)}


def manifests(family: str, job_id: str, namespace: str, image: str, replicas: int, port: int,
              env_kwargs: dict[str, Any], values: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Deployment, Service) serving `family` for one pipeline job; `values`: the chart's (default:
    values.yaml)."""
    values = values if values is not None else chart_values()
    name = resource_name(family, job_id)
    meta = {"name": name, "namespace": namespace, "labels": labels(family, name, job_id, values)}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": REVISION_HISTORY_LIMIT,
            "selector": {"matchLabels": selector(job_id)},
            "template": _pod_template(family, meta["labels"], image, port, env_kwargs, values),
        },
    }
    return deployment, _service(meta, job_id, port, values)


def _pod_template(family: str, pod_labels: dict[str, str], image: str, port: int,
                  env_kwargs: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """templates/deployment.yaml's pod for one family: no API token, no service links, the chart's
    security contexts, /tmp the only writable path, and its scheduling values."""
    fam = values[family]
    metadata: dict[str, Any] = {"labels": {**pod_labels, **fam.get("podLabels", {})}}
    annotations = {**values.get("podAnnotations", {}), **fam.get("podAnnotations", {})}
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the servers call no Kubernetes API
        "enableServiceLinks": False,  # <SERVICE>_PORT variables could collide with SDAR_* settings
        "terminationGracePeriodSeconds": values["terminationGracePeriodSeconds"],
    }
    pull_secrets = [*(values.get("global") or {}).get("imagePullSecrets", []),
                    *values.get("imagePullSecrets", [])]
    if pull_secrets:
        spec["imagePullSecrets"] = pull_secrets
    spec["securityContext"] = values["podSecurityContext"]
    spec["containers"] = [_container(family, image, port, env_kwargs, values)]
    spec["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": values["tmpSizeLimit"]}}]
    for key in ("nodeSelector", "affinity", "tolerations"):
        if fam.get(key):
            spec[key] = fam[key]
    return {"metadata": metadata, "spec": spec}


def _container(family: str, image: str, port: int, env_kwargs: dict[str, Any],
               values: dict[str, Any]) -> dict[str, Any]:
    """The server container: `sdar envs serve` with the chart's arguments and the config's env
    kwargs, /health probes on the probe port with the chart's timings, and the family's resources."""
    fam = values[family]
    args = ["envs", "serve", "--env", family, "--host", "0.0.0.0", "--port", str(port),
            "--log-level", str(values["logLevel"])]
    if fam.get("maxSessions"):
        args += ["--max-sessions", str(fam["maxSessions"])]
    limits = values.get("clientLimits") or {}
    for key, flag in (("maxSessionsPerClient", "--max-sessions-per-client"),
                      ("maxConnectionsPerClient", "--max-connections-per-client")):  # fmt: skip
        if limits.get(key) is not None:
            args += [flag, str(limits[key])]
    args += ["--probe-port", str(values["probePort"])]
    args += [str(a) for a in fam.get("extraArgs", [])]
    args += ["--env-kwargs", json.dumps(env_kwargs)]  # the config's backend and settings
    # the kubelet probes a port of its own, outside the clients' connection limits (values.yaml: probePort)
    health = {"httpGet": {"path": "/health", "port": "probe"}}
    container: dict[str, Any] = {
        "name": family,
        "image": image,
        "imagePullPolicy": values["image"]["pullPolicy"],
        "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"},
                  {"name": "probe", "containerPort": int(values["probePort"]), "protocol": "TCP"}],
        "env": [{"name": "SDAR_ENV_PORT", "value": str(port)}, *fam.get("extraEnv", [])],
        "startupProbe": {**health, **values["probes"]["startup"]},
        "readinessProbe": {**health, **values["probes"]["readiness"]},
        "livenessProbe": {**health, **values["probes"]["liveness"]},
    }
    if fam.get("resources"):
        container["resources"] = fam["resources"]
    container["securityContext"] = values["securityContext"]
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    return container


def _service(meta: dict[str, Any], job_id: str, port: int, values: dict[str, Any]) -> dict[str, Any]:
    """templates/service.yaml's Service: HTTP (WebSocket upgrades under /ws) on `port`."""
    svc = values["service"]
    metadata = dict(meta)
    if svc.get("annotations"):
        metadata["annotations"] = svc["annotations"]
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata,
        "spec": {
            "type": svc["type"],
            "sessionAffinity": svc["sessionAffinity"],
            "selector": selector(job_id),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP",
                       "appProtocol": "http"}],
        },
    }
