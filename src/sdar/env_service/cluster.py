"""The environment service of a pipeline run on Kubernetes: create its Deployment and Service, wait
until they serve, and delete everything labelled with the job. The calls are exactly those the
sdar-env-manager Role in k8s/ grants (tests/deploy/test_k8s.py records them)."""

from __future__ import annotations

import time
from typing import Any

from sdar.kube import kube_client, pod_namespace

DEFAULT_NAMESPACE = "kubeflow"


def namespace_of(namespace: str = "") -> str:
    """`namespace`, else this pod's, else kubeflow (KFP's)."""
    return namespace or pod_namespace() or DEFAULT_NAMESPACE


def _apis():
    """(AppsV1Api, CoreV1Api, the client module) with this pod's credentials, or a developer's
    kubeconfig outside a pod."""
    from kubernetes import client as k8s

    api_client = kube_client()
    return k8s.AppsV1Api(api_client), k8s.CoreV1Api(api_client), k8s


def create(deployment: dict[str, Any], service: dict[str, Any]) -> None:
    """Create both objects; ones that exist already (a retried step finds its own) are used."""
    apps, core, k8s = _apis()
    ns = deployment["metadata"]["namespace"]
    for create_one in (lambda: apps.create_namespaced_deployment(ns, deployment),
                       lambda: core.create_namespaced_service(ns, service)):
        try:
            create_one()
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise


def wait_serving(deployment: dict[str, Any], url: str, timeout_s: float) -> None:
    """Wait until every replica is ready and `url` answers /health, or raise TimeoutError with
    where to look."""
    apps, _, _ = _apis()
    name, ns = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
    replicas = deployment["spec"]["replicas"]
    deadline = time.monotonic() + timeout_s
    while True:
        ready = apps.read_namespaced_deployment_status(name, ns).status.ready_replicas or 0
        if ready >= replicas:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"deployment {ns}/{name} has {ready}/{replicas} ready pods after {timeout_s:g} s; check "
                f"`kubectl -n {ns} describe deployment {name}` (image pull, resources) and raise "
                "startup_timeout_s for slow backends"
            )
        time.sleep(3)
    from sdar_envs.launcher import wait_healthy

    wait_healthy(url, timeout_s=max(30.0, deadline - time.monotonic()))


def delete_labelled(namespace: str, label_selector: str) -> list[str]:
    """Delete every Deployment and Service matching `label_selector` in `namespace` (found by label,
    so a launch that died half-way is cleaned up too); one line per object deleted."""
    apps, core, _ = _apis()
    done = []
    for d in apps.list_namespaced_deployment(namespace, label_selector=label_selector).items:
        apps.delete_namespaced_deployment(d.metadata.name, namespace, propagation_policy="Foreground")
        done.append(f"deleted deployment {namespace}/{d.metadata.name}")
    for s in core.list_namespaced_service(namespace, label_selector=label_selector).items:
        core.delete_namespaced_service(s.metadata.name, namespace)
        done.append(f"deleted service {namespace}/{s.metadata.name}")
    return done
