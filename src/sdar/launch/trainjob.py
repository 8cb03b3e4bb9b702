"""Training as a Kubeflow Trainer TrainJob (`trainer.kubeflow.org/v1alpha1`): `torchrun -m sdar.cli train ...`
on `nodes` x `procs_per_node` workers, the same command and config a TorchX job runs (sdar.launch.torchx_job), with
Kubeflow Trainer's controller making the pods (a JobSet) from a ClusterTrainingRuntime.

`launch_trainjob(cfg, ...)` is what the `gated_train` pipeline step calls when the config's `launch` section
resolves to `trainjob` (`launcher: trainjob`, or `auto` with more than one GPU on Kubernetes). It builds the
TrainJob (`trainjob_for_config`), checks it against the Trainer's published API models (the
kubeflow-trainer-api package: `validate_trainjob`), creates it through the Kubernetes API, watches it to
Complete or Failed, prints each change of its status into the step's log (and tags the MLflow run at hand
with it), and deletes it when it ends, fails, or this step is stopped (SIGTERM, Ctrl-C). A failed job's
node-0 log tail is printed before the error, which carries the TrainJob's own message.

What the TrainJob says: `runtimeRef` (launch.runtime, default Kubeflow Trainer's `torch-distributed`),
`trainer` (the image, the torchrun command, `numNodes`, `numProcPerNode`, `resourcesPerNode` with the GPUs,
and as env only the Secret keys the job reads: S3 always, MLflow when the run tracks, a replaying arm's
teacher API keys), and one `runtimePatches` entry (manager `sdar/launcher`) for the runtime's `node` pods:
the pipeline's pod labels,
the restricted security context (uid/gid 10001, non-root, no privilege escalation, no capabilities,
RuntimeDefault seccomp, read-only root filesystem with size-limited emptyDirs for /tmp, runs/ and
/dev/shm), no Kubernetes API token (an empty read-only mount at its path: API_TOKEN_DIR), the service
account, and on GPU nodes the node selector and tolerations. With launch.kueue_queue the TrainJob
carries Kueue's `kueue.x-k8s.io/queue-name` label.

The torchrun workers rendezvous through the PET_* variables the Trainer's torch plugin sets (PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT); rank 0 publishes the result to the
checkpoint store (checkpoint.uri, s3://), where this step collects it.

On Kubernetes the launching pod's service account needs, in the job's namespace: trainjobs.trainer.kubeflow.org
create, get, watch, delete, and list (the pipeline's teardown: delete_labelled); pods list and pods/log get
(k8s/base/rbac.yaml, sdar-trainjob-launcher).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from typing import Any

from sdar.images import trainer_image
from sdar.kube import api_message, kube_client
from sdar.launch.job import (
    JobKind,
    collect_result,
    job_namespace,
    procs_per_node,
    require_s3,
    sigterm_raises,
    train_args,
)
from sdar.launch.job import delete_labelled as delete_jobs
from sdar.launch.pods import (
    container_security_context,
    empty_dirs,
    output_scratch,
    pod_security_context,
    shm_volume,
    writable_dirs,
)
from sdar.launch.secrets import secret_env, teacher_vars

# The Kubeflow Trainer release the TrainJob is built for, validated against (its kubeflow-trainer-api models) and
# tested on (its torch-distributed runtime and runtime-patch merge: tests/deploy/trainer_runtime.py); docs/cluster.md
# installs its chart. Patch releases of the same minor merge runtime patches the same way.
TRAINER_VERSION = "2.3.0"
GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
API_VERSION = f"{GROUP}/{VERSION}"
TRAINJOB = JobKind(GROUP, VERSION, PLURAL, KIND, "Kubeflow Trainer", "sdar-trainjob-launcher")
# the replicated job and its container that the torch runtimes run the trainer in (the Trainer's constants.Node)
NODE = "node"
PATCH_MANAGER = "sdar/launcher"  # runtimePatches[].manager: who owns the patch (the API keys patches by it)
MAX_COMMAND_ITEMS = 128  # the TrainJob CRD's maxItems of trainer.command (the API models do not check it)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# the labels JobSet and the Job controller put on the pods: the job's name, and each node's rank
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
NODE_RANK_LABEL = "batch.kubernetes.io/job-completion-index"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
MAX_NAME = 40  # JobSet names pods and the headless Service <name>-node-<i>-<j>: keep it well under 63
# A runtime patch cannot set automountServiceAccountToken: false. A mount at the token's path keeps Kubernetes'
# ServiceAccount admission from mounting the token there (it skips a container that has one), so the workers
# hold no Kubernetes API credentials, as TorchX's do not; IRSA's token has a path of its own and stays.
API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# ---- the TrainJob of a config --------------------------------------------------------------------
def trainjob_name(cfg) -> str:
    """sdar-<arm>-seed<seed>-<digest of the run's output and checkpoint places>: the same for a retried step
    (so it replaces its own earlier TrainJob), different for every run; a DNS-1035 label."""
    digest = hashlib.sha256(f"{cfg.resolved_output_dir()}|{cfg.resolved_checkpoint_uri()}".encode()).hexdigest()[:8]
    arm = "".join(c if c.isalnum() else "-" for c in cfg.arm.lower())[:20].strip("-")
    head = f"sdar-{arm}-seed{int(cfg.seed)}"[:MAX_NAME - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"  # the digest whole, however long the seed


def _resources(launch) -> dict[str, Any]:
    amounts = {"cpu": str(launch.cpu), "memory": f"{int(launch.memory_mb)}M"}
    if launch.gpus_per_node:
        amounts["nvidia.com/gpu"] = str(launch.gpus_per_node)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _pod_patch(cfg) -> dict[str, Any]:
    """The runtimePatches entry's pod template of the runtime's `node` job (what the Trainer lets a TrainJob
    patch): labels, the restricted security context, writable emptyDirs, no API token, service account, GPU
    scheduling."""
    launch = cfg.launch
    # /tmp, runs/, and the output_dir when it lies elsewhere
    writable = writable_dirs([d for d in [output_scratch(cfg)] if d])
    mounts = [{"name": name, "mountPath": path} for name, (path, _) in writable.items()]
    volumes = empty_dirs(writable)
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})  # NCCL's and the dataloaders' shared memory
    volumes.append(shm_volume(launch.memory_mb))
    mounts.append({"name": "no-api-token", "mountPath": API_TOKEN_DIR, "readOnly": True})
    volumes.append({"name": "no-api-token", "emptyDir": {"sizeLimit": "1Mi"}})
    spec: dict[str, Any] = {
        "securityContext": pod_security_context(),
        "containers": [{"name": NODE, "securityContext": container_security_context(), "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if launch.service_account:
        spec["serviceAccountName"] = launch.service_account
    if launch.gpus_per_node:
        spec["nodeSelector"] = dict(launch.node_selector)
        spec["tolerations"] = [dict(t) for t in launch.tolerations]
    template: dict[str, Any] = {"spec": spec}
    if launch.pod_labels:
        template["metadata"] = {"labels": dict(launch.pod_labels)}
    return template


def trainjob_for_config(cfg, config_path: str, overrides: dict[str, Any], namespace: str = "",
                        labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The TrainJob that trains `cfg` (= load_config(config_path, overrides)) as its `launch` section says,
    checked against Kubeflow Trainer's API models (validate_trainjob). `labels` go on the TrainJob besides the
    pods' (the pipeline run's, by which its teardown finds the TrainJobs a lost step left: delete_labelled)."""
    launch = cfg.launch
    procs = procs_per_node(launch)
    if launch.gpus_per_node and procs > launch.gpus_per_node:
        raise ValueError(f"launch.procs_per_node={procs} workers would share {launch.gpus_per_node} GPUs; "
                         "use one worker per GPU")
    labels = {**launch.pod_labels, **(labels or {})}
    if launch.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = launch.kueue_queue
    metadata: dict[str, Any] = {"name": trainjob_name(cfg), "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    command = ["torchrun", "-m", "sdar.cli", "train", *train_args(config_path, overrides)]
    if len(command) > MAX_COMMAND_ITEMS:
        raise ValueError(f"{len(overrides)} overrides make a command of {len(command)} items; a TrainJob takes "
                         f"{MAX_COMMAND_ITEMS}: put most of them into the config file")
    trainer = {
        "image": launch.image or trainer_image(),
        "command": command,
        "numNodes": int(launch.nodes),
        "numProcPerNode": int(procs),
        "resourcesPerNode": _resources(launch),
    }
    env = secret_env(launch.secrets, bool(cfg.tracking), teacher_vars(cfg))
    if env:
        trainer["env"] = env
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE, "template": {"spec": {"template": _pod_patch(cfg)}}}]}}}}
    job = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": {
        "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": launch.runtime},
        "trainer": trainer,
        "runtimePatches": [patch],
    }}
    validate_trainjob(job)
    return job


def validate_trainjob(job: dict[str, Any]) -> dict[str, Any]:
    """`job` read through the Trainer's published API models (kubeflow_trainer_api TrainerV1alpha1TrainJob,
    core types included) and written back: a wrong type fails there, and a field the API does not have
    (which the API server would prune) fails as a difference. Returns the models' dict."""
    import pydantic
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    check_api_models()
    try:
        back = TrainerV1alpha1TrainJob.from_dict(job).to_dict()
    except pydantic.ValidationError as exc:
        raise ValueError(f"the TrainJob does not fit Kubeflow Trainer's API: {exc}") from None
    lost = _differences(job, back)
    if lost:
        raise ValueError(f"the TrainJob has fields Kubeflow Trainer's API does not: {', '.join(lost)}")
    return back


def check_api_models(installed: str | None = None) -> str:
    """The installed kubeflow-trainer-api version (or `installed`), refused unless it is TRAINER_VERSION's minor:
    another minor's models describe another API (2.2's runtime patches merged differently)."""
    from importlib.metadata import version

    installed = installed or version("kubeflow-trainer-api")
    if installed.split(".")[:2] != TRAINER_VERSION.split(".")[:2]:
        major_minor = ".".join(TRAINER_VERSION.split(".")[:2])
        raise RuntimeError(f"kubeflow-trainer-api {installed} is installed, but the TrainJob is built for Kubeflow "
                           f"Trainer {TRAINER_VERSION}: pip install 'kubeflow-trainer-api=={major_minor}.*' (the "
                           f"cluster extra pins it) and run Trainer {major_minor} on the cluster (docs/cluster.md)")
    return installed


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path.lstrip(".") or "."]


# ---- its status ----------------------------------------------------------------------------------
def describe(job: dict[str, Any]) -> tuple[str | None, str]:
    """(Complete | Failed | None while it runs, one line of its status): the conditions that hold, the
    child jobs' counts and the trainer's progress when the Trainer reports it."""
    status = job.get("status") or {}
    held = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    parts = []
    for c in held:
        why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
        parts.append(f"{c['type']}" + (f" ({why})" if why else ""))
    for j in status.get("jobsStatus") or []:
        counts = ", ".join(f"{j.get(k, 0)} {k}" for k in ("active", "ready", "succeeded", "failed", "suspended")
                           if j.get(k))
        parts.append(f"{j['name']}: {counts or 'no pods'}")
    progress = (status.get("trainerStatus") or {}).get("progressPercentage")
    if progress is not None:
        parts.append(f"{progress}% done")
    ended = next((c["type"] for c in held if c["type"] in ("Complete", "Failed")), None)
    return ended, "; ".join(parts) or "created, waiting for its pods"


class StatusLog:
    """Each change of a TrainJob's status: a line in this step's log and, when an MLflow run is at hand
    (the pipeline's parent run while the job runs), the tag trainjob.<name> of that run; `save` puts
    the whole history into a run as the artifact trainjob/<name>.log."""

    def __init__(self, name: str, run_id: str | None = None):
        self.name, self.run_id = name, run_id
        self.lines: list[str] = []
        self._last = ""

    def __call__(self, job: dict[str, Any]) -> str | None:
        ended, line = describe(job)
        if line != self._last:
            self._last = line
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.lines.append(f"{stamp} {line}")
            print(f"TrainJob {self.name}: {line}", flush=True)
            if self.run_id:
                self._mlflow(lambda client: client.set_tag(self.run_id, f"trainjob.{self.name}", line[:5000]))
        return ended

    def save(self, run_id: str | None) -> None:
        if run_id and self.lines:
            self._mlflow(lambda client: (client.set_tag(run_id, "trainjob.name", self.name),
                                         client.log_text(run_id, "\n".join(self.lines) + "\n",
                                                         f"trainjob/{self.name}.log")))

    def _mlflow(self, call) -> None:
        try:
            from sdar.tracking import mlflow_client

            call(mlflow_client(os.environ.get("MLFLOW_TRACKING_URI")))
        except Exception as exc:  # noqa: BLE001 - the job matters more than its record; say it once
            print(f"(could not log the TrainJob's status to MLflow: {exc}; the step's log has it)", flush=True)
            self.run_id = None


# ---- the Kubernetes API ----------------------------------------------------------------------------
def _api_error(exc, namespace: str, doing: str) -> RuntimeError:
    message = api_message(exc)
    hint = {403: f"the step's service account may not do that in {namespace!r}: apply k8s/ (its Role "
                 "sdar-trainjob-launcher), and leave launch.namespace empty"}.get(exc.status, "")
    if exc.status == 404 and doing.startswith("create"):
        hint = (f"the cluster serves no trainjobs.trainer.kubeflow.org: install Kubeflow Trainer {TRAINER_VERSION} "
                "(docs/cluster.md) or set launch.launcher=torchx")
    return RuntimeError(f"could not {doing} ({exc.status}: {message})" + (f"; {hint}" if hint else ""))


def _create(api, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    """Create the TrainJob; one of the same name (an earlier attempt of this step) is deleted first."""
    from kubernetes.client.rest import ApiException

    name = job["metadata"]["name"]
    try:
        return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    except ApiException as exc:
        if exc.status != 409:
            raise _api_error(exc, namespace, f"create TrainJob {namespace}/{name}") from None
    print(f"TrainJob {namespace}/{name} exists (an earlier attempt of this step): deleting it", flush=True)
    _delete(api, namespace, name)
    _wait_gone(api, namespace, name)
    try:
        return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    except ApiException as exc:
        raise _api_error(exc, namespace, f"create TrainJob {namespace}/{name}") from None


def _get(api, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.rest import ApiException

    try:
        return api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _api_error(exc, namespace, f"read TrainJob {namespace}/{name}") from None


def _wait_gone(api, namespace: str, name: str, timeout_s: float = 600.0, interval_s: float = 2.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while _get(api, namespace, name) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"TrainJob {namespace}/{name} is still there {timeout_s:.0f} s after its deletion")
        time.sleep(interval_s)


def _delete(api, namespace: str, name: str) -> bool:
    """Delete the TrainJob and, in the foreground, its JobSet and pods; False when there was none, or it
    could not be (said, with the command that does it)."""
    from kubernetes.client import V1DeleteOptions
    from kubernetes.client.rest import ApiException

    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                            body=V1DeleteOptions(propagation_policy="Foreground"))
    except ApiException as exc:
        if exc.status == 404:
            return False
        why = f"{exc.status} {exc.reason}"
    except Exception as exc:  # noqa: BLE001 - the API out of reach: say what to do, keep the error at hand
        why = str(exc)
    else:
        return True
    print(f"could not delete TrainJob {namespace}/{name} ({why}); run `kubectl -n {namespace} delete trainjob {name}`",
          flush=True)
    return False


def delete_labelled(namespace: str, label_selector: str, *, api_client=None) -> list[str]:
    """Delete every TrainJob matching `label_selector` in `namespace`, its JobSet and pods with it
    (sdar.launch.job.delete_labelled): what a pipeline's teardown does for the TrainJobs of its run."""
    return delete_jobs(TRAINJOB, namespace, label_selector, api_client or kube_client())


def _watch(api, namespace: str, name: str, report: StatusLog, timeout_s: int) -> tuple[str, dict[str, Any]]:
    """Watch the TrainJob until a Complete or Failed condition holds; report each state it passes through.
    Each watch lasts timeout_s (the API server ends it), then the job is read afresh and watched again."""
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    while True:
        job = _get(api, namespace, name)
        if job is None:
            raise RuntimeError(f"TrainJob {namespace}/{name} was deleted before it ended (by someone else?)")
        ended = report(job)
        if ended:
            return ended, job
        w = watch.Watch()
        try:
            for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                  field_selector=f"metadata.name={name}",
                                  resource_version=job["metadata"].get("resourceVersion"),
                                  timeout_seconds=int(timeout_s), _request_timeout=int(timeout_s) + 30):
                if event["type"] == "DELETED":
                    raise RuntimeError(f"TrainJob {namespace}/{name} was deleted before it ended (by someone else?)")
                if event["type"] in ("ADDED", "MODIFIED"):
                    ended = report(event["object"])
                    if ended:
                        w.stop()
                        return ended, event["object"]
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: the version watched from expired; read it afresh
                raise _api_error(exc, namespace, f"watch TrainJob {namespace}/{name}") from None


def _print_log_tail(core, namespace: str, name: str, lines: int = 50) -> None:
    """The last `lines` lines of node 0's trainer container, so a failed step shows why in its own log."""
    try:
        selector = f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL}={NODE},{NODE_RANK_LABEL}=0"
        pods = core.list_namespaced_pod(namespace, label_selector=selector)
        if not pods.items:
            print(f"(TrainJob {name} has no node-0 pod left to read the log of)", flush=True)
            return
        pod = max(pods.items, key=lambda p: p.metadata.creation_timestamp or EPOCH)
        text = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=NODE, tail_lines=lines)
    except Exception as exc:  # noqa: BLE001 - best effort: the error below names the job anyway
        print(f"(could not read the log of TrainJob {name}'s node 0: {exc})", flush=True)
        return
    print(f"--- last {lines} log lines of node 0 ({pod.metadata.name}) of TrainJob {name} ---", flush=True)
    print(text if text.endswith("\n") else text + "\n", end="", flush=True)


def launch_trainjob(cfg, config_path: str, overrides: dict[str, Any], *, api_client=None,
                    watch_timeout_s: int = 300, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Create the TrainJob for `cfg` (with `labels`), watch it to its end, delete it, and return a summary like
    `sdar.train.train`'s, with the final policy downloaded from the checkpoint store (rank 0 publishes it
    there, cfg.checkpoint.uri must be s3://) into <output_dir>/final of this machine. A failed TrainJob
    raises RuntimeError with its message; a stopped step (SIGTERM, KeyboardInterrupt) deletes it first. A step
    killed outright (its node lost) cannot: the pipeline's teardown deletes its TrainJobs by label
    (delete_labelled)."""
    import kubernetes

    require_s3(cfg)
    namespace = job_namespace(cfg.launch)
    job = trainjob_for_config(cfg, config_path, overrides, namespace, labels)
    name = job["metadata"]["name"]
    api_client = api_client or kube_client()
    api = kubernetes.client.CustomObjectsApi(api_client)
    parent = cfg.parent_run_id if cfg.tracking and os.environ.get("MLFLOW_TRACKING_URI") else None
    report = StatusLog(name, parent)
    try:
        with sigterm_raises():  # from the create on: a stop between it and the watch deletes the job too
            _create(api, namespace, job)
            print(f"TrainJob {namespace}/{name}: {cfg.launch.nodes} x {procs_per_node(cfg.launch)} torchrun "
                  f"workers, runtime {cfg.launch.runtime}", flush=True)
            ended, final = _watch(api, namespace, name, report, watch_timeout_s)
        if ended != "Complete":
            _print_log_tail(kubernetes.client.CoreV1Api(api_client), namespace, name)
    except BaseException:
        # this step was stopped (a terminated pipeline run, Ctrl-C) or lost the API: stop the job too, or its
        # pods keep the GPU nodes until it ends on its own (nothing to delete when the create failed)
        if _delete(api, namespace, name):
            print(f"deleted TrainJob {namespace}/{name}", flush=True)
        raise
    if _delete(api, namespace, name):  # its pods are done; the history is in this log (and MLflow)
        print(f"deleted TrainJob {namespace}/{name}", flush=True)
    if ended != "Complete":
        report.save(parent)
        _, line = describe(final)
        raise RuntimeError(f"TrainJob {namespace}/{name} failed: {line}")
    summary = collect_result(cfg, trainjob=f"{namespace}/{name}")
    report.save(summary.get("run_id") or parent)
    return summary
