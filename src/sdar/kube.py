"""What every caller of the Kubernetes API here shares, the env service's and the training launchers' alike: a
client with this pod's credentials (or a developer's kubeconfig outside a pod), this pod's own namespace, and the
API server's message in an error."""

from __future__ import annotations

import json
from pathlib import Path

# where a pod finds its own namespace (its service account's)
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def pod_namespace() -> str | None:
    """The namespace of the pod this runs in; None outside a pod."""
    path = Path(SA_NAMESPACE_FILE)
    return (path.read_text().strip() or None) if path.is_file() else None


def kube_client():
    """A client of the cluster this runs in (the pod's service account), else of the kubeconfig's context."""
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def api_message(exc) -> str:
    """The API server's own message in a kubernetes ApiException (its Status body), else its reason."""
    try:
        return json.loads(exc.body or "{}").get("message") or exc.reason
    except ValueError:
        return exc.body or exc.reason
