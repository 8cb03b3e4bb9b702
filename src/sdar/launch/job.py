"""What a training job needs around it, whichever launcher makes it: the `sdar train` arguments that rebuild the
config in the job, the workers per node, the namespace it goes to, the result rank 0 publishes to the checkpoint
store, and a SIGTERM that lets the launcher stop the job before the step ends."""

from __future__ import annotations

import json
import shutil
import signal
from dataclasses import dataclass
from typing import Any

from sdar import storage  # storage.open_store read at call time (tests serve S3 through a stand-in)
from sdar.kube import api_message, pod_namespace
from sdar.lifecycle import ending_on_signals
from sdar.storage import RESULT_PREFIX


def train_args(config_path: str, overrides: dict[str, Any]) -> list[str]:
    """`sdar train` arguments that rebuild the same config in the job: the file plus every override
    as --set KEY=<JSON> (JSON is YAML, which --set parses), and --publish to hand the result back."""
    args = ["--config", str(config_path)]
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args + ["--publish"]


def procs_per_node(launch) -> int:
    """torchrun workers per node: launch.procs_per_node, else one per GPU (one without GPUs)."""
    return launch.procs_per_node or max(launch.gpus_per_node, 1)


def job_namespace(launch) -> str:
    """Where a job goes: launch.namespace, else the launching pod's own (its service account's), else default."""
    return launch.namespace or pod_namespace() or "default"


def require_s3(cfg) -> None:
    """A Kubernetes job's pods share no disk with the launching one: they hand the result back through S3."""
    if not str(cfg.checkpoint.uri or "").startswith("s3://"):
        raise ValueError("a Kubernetes training job hands its result back through the checkpoint store: set "
                         "checkpoint.uri to an s3:// URI (the pipeline's checkpoint_root)")


def collect_result(cfg, **extra: Any) -> dict[str, Any]:
    """The summary rank 0 published to the checkpoint store (`sdar train --publish`), with the final policy
    downloaded into <output_dir>/final of this machine; `extra` is added to it (the job's handle)."""
    store = storage.open_store(cfg.resolved_checkpoint_uri())
    out = cfg.resolved_output_dir()
    final = out / "final"
    if final.exists():  # local_cwd: rank 0 wrote it here already; the store's copy is the same
        shutil.rmtree(final)
    store.get_dir(f"{RESULT_PREFIX}/final", final)
    summary = store.read_json(f"{RESULT_PREFIX}/summary.json")
    summary.update({"final_dir": str(final), "output_dir": str(out), **extra})
    return summary


def sigterm_raises():
    """SIGTERM (what Kubernetes sends a pod it stops) raises SystemExit (`sdar.lifecycle.Terminated`, status 143)
    here, so cleanup runs; only the main thread can set a handler, elsewhere nothing changes."""
    return ending_on_signals((signal.SIGTERM,))


# ---- what teardown deletes -------------------------------------------------------------------------
@dataclass(frozen=True)
class JobKind:
    """A job resource a launcher creates (a TrainJob, TorchX's Volcano Job), as a pipeline's teardown finds and
    deletes it by its run's label. provider: what serves it; role: the Role in k8s/ that lets the step do so."""

    group: str
    version: str
    plural: str
    kind: str
    provider: str
    role: str


def delete_labelled(kind: JobKind, namespace: str, label_selector: str, api_client) -> list[str]:
    """Delete every `kind` matching `label_selector` in `namespace` (in the foreground: its pods with it), one line
    per job; a line saying so when the cluster serves no such resource. What a pipeline's teardown does for the
    jobs of its run: a gated_train pod killed without SIGTERM (its node lost) leaves its job holding the GPU nodes.
    RuntimeError, after trying them all, names those left and the kubectl command that deletes them."""
    import kubernetes
    from kubernetes.client import V1DeleteOptions
    from kubernetes.client.rest import ApiException

    api = kubernetes.client.CustomObjectsApi(api_client)

    def failed(exc, doing: str) -> str:
        hint = (f"; the step's service account may not do that in {namespace!r}: apply k8s/ (its Role {kind.role})"
                if exc.status == 403 else "")
        return f"could not {doing} ({exc.status}: {api_message(exc)}){hint}"

    try:
        found = api.list_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural,
                                                  label_selector=label_selector)
    except ApiException as exc:
        if exc.status == 404:
            return [f"no {kind.kind}s in {namespace}: the cluster serves none (no {kind.provider})"]
        raise RuntimeError(failed(exc, f"list the {kind.kind}s with {label_selector} in {namespace}")) from None
    done, left = [], []
    for job in found.get("items") or []:
        name = job["metadata"]["name"]
        try:
            api.delete_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name,
                                                body=V1DeleteOptions(propagation_policy="Foreground"))
            done.append(f"deleted {kind.kind} {namespace}/{name}")
        except ApiException as exc:
            if exc.status == 404:  # gone meanwhile
                continue
            left.append(f"{name} ({failed(exc, f'delete {kind.kind} {namespace}/{name}')})")
    if left:
        raise RuntimeError(f"{kind.kind}s of this run left in {namespace}: {'; '.join(left)}; delete them with "
                           f"`kubectl -n {namespace} delete {kind.plural}.{kind.group} -l {label_selector}`")
    return done
