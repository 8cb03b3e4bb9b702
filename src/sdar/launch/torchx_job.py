"""Training as a TorchX job: `torchrun -m sdar.cli train ...` on `nodes` x `procs_per_node` workers
(data-parallel LoRA, sdar.train.distributed), gang-scheduled as a Volcano Job on Kubernetes, or on
this machine with the `local_cwd` scheduler.

`trainer` is a TorchX component, so the TorchX CLI can run it directly:

    torchx run --workspace "" -s kubernetes -cfg queue=default,namespace=rl \\
        src/sdar/launch/torchx_job.py:trainer \\
        --nnodes 2 --nproc_per_node 4 --gpu 4 -- --config configs/household-tiny.yaml --arm sdar

(`--workspace ""`: run the pushed trainer image as it is, rather than have TorchX build one from
the working directory)

and `launch_training(cfg, ...)` is what the `gated_train` pipeline step calls when the config's
`launch` section says `launcher: torchx`, or asks for more than one GPU with `scheduler: local_cwd` (on
Kubernetes more than one GPU makes a Kubeflow Trainer TrainJob by default: sdar.launch.trainjob, with the same
command, pods and result collection: sdar.launch.job, pods and secrets). Credentials never travel as parameters:
the pods read them from the Kubernetes Secrets named in `secrets` (envFrom), and a replaying arm's
from the teachers' Secret (`teacher_secret`, optional as in gated_train's own pod). The pods
run under the restricted Pod Security profile (non-root uid 10001, no privilege escalation, no
capabilities, RuntimeDefault seccomp, read-only root filesystem with emptyDirs for what they write).

On Kubernetes the launching pod's service account needs, in the job's namespace, exactly what
TorchX's kubernetes scheduler calls for submit, wait, cancel and logs: jobs.batch.volcano.sh create
and get, jobs/status get and update, pods get, pods/log get (k8s/base/rbac.yaml, sdar-torchx-launcher).
"""

# no `from __future__ import annotations`: TorchX reads the component's annotations as types
import collections
import os
import sys
from typing import Any

from torchx import specs

from sdar.config.secrets import MLFLOW_SECRET, S3_SECRET
from sdar.images import trainer_image
from sdar.kube import kube_client
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
from sdar.launch.secrets import SECRET_ENV, env_from, teacher_secret_of
from sdar.lifecycle import handlers_kept

SCHEDULERS = ("kubernetes", "local_cwd")
# what TorchX's kubernetes scheduler creates: a Volcano Job
VOLCANO_JOB = JobKind("batch.volcano.sh", "v1alpha1", "jobs", "Volcano Job", "Volcano", "sdar-torchx-launcher")
ROLE = "trainer"
# the same Secrets the pipeline's ClusterSettings gives its steps (sdar.config.secrets; k8s/ creates them); their
# keys are the variable names (MLFLOW_TRACKING_URI; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, SDAR_S3_ENDPOINT_URL)
DEFAULT_SECRETS = f"{MLFLOW_SECRET},{S3_SECRET}"


def _torchrun_component():
    # torchx-nightly renamed dist.ddp to dist.torchrun (ddp stays as a deprecated alias with the
    # same arguments); the release's dist.ddp is the fallback
    from torchx.components import dist

    return getattr(dist, "torchrun", None) or dist.ddp


def trainer(
    *train_args: str,
    image: str = "",
    nnodes: int = 1,
    nproc_per_node: int = 1,
    gpu: int = 0,
    cpu: int = 8,
    memMB: int = 32768,
    name: str = "sdar-train",
    secrets: str = DEFAULT_SECRETS,
    node_selector: dict[str, str] | None = None,
    tolerations: str = "",
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    scratch: str = "",
    teacher_secret: str = "",
) -> specs.AppDef:
    """`sdar train` under torchrun: nnodes replicas of nproc_per_node workers each (DDP over LoRA).

    Args:
        train_args: arguments of `sdar train` (e.g. --config configs/household-tiny.yaml --arm sdar)
        image: container image holding sdar ("" = $SDAR_IMAGE or <registry>/sdar-trainer:<tag>)
        nnodes: nodes (replicas of the role; Volcano schedules them as one gang)
        nproc_per_node: torchrun workers per node (one per GPU)
        gpu: GPUs per node (the nvidia.com/gpu limit of each pod)
        cpu: CPUs per node
        memMB: memory per node in MB
        name: the job's name
        secrets: comma-separated Kubernetes Secrets whose keys become the workers' environment
        node_selector: labels the nodes must carry (KEY=VALUE,...)
        tolerations: taints to tolerate, comma-separated KEY[=VALUE]:EFFECT (e.g. nvidia.com/gpu:NoSchedule)
        labels: extra labels of each pod (KEY=VALUE,...), e.g. the ones NetworkPolicies admit
        env: extra environment (not credentials: those come from `secrets`)
        max_retries: scheduler retries of the job
        rdzv_port: port of rank 0's rendezvous store (multi-node)
        scratch: more writable directories of each pod (comma-separated absolute paths; the root
            filesystem is read-only, /tmp and /workspace/runs are always writable)
        teacher_secret: a Secret whose keys (the teacher pool's API keys) become the workers' environment
            when it exists ("" = none; a pool of local servers needs none)
    """
    if "--config" not in train_args:
        raise ValueError("trainer needs the arguments of `sdar train`, e.g. -- --config configs/household-tiny.yaml")
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be >= 1, got {nnodes} and {nproc_per_node}")
    if gpu and nproc_per_node > gpu:
        raise ValueError(f"nproc_per_node={nproc_per_node} workers would share gpu={gpu} GPUs; use one worker per GPU")
    bad = sorted(set(env or {}) & SECRET_ENV)
    if bad:
        raise ValueError(f"{', '.join(bad)} must not be parameters: put them in a Kubernetes Secret named in "
                         f"`secrets` (now {secrets!r})")
    app = _torchrun_component()(
        "train", *train_args,
        m="sdar.cli", image=image or trainer_image(), name=name, cpu=cpu, gpu=gpu, memMB=memMB,
        j=f"{nnodes}x{nproc_per_node}", env=dict(env or {}), max_retries=max_retries, rdzv_port=rdzv_port,
    )
    role = app.roles[0]
    role.name = ROLE
    # the nodes are gang-scheduled by Volcano; the workers' collectives go through the rendezvous
    # above, the data-parallel reduction is sdar's own (sdar.train.distributed)
    overlay = _pod_overlay(role.image, [s for s in secrets.split(",") if s.strip()], node_selector or {},
                           _parse_tolerations(tolerations), labels or {}, memMB,
                           [d.strip() for d in scratch.split(",") if d.strip()], teacher_secret.strip())
    from torchx.specs.overlays import set_overlay

    set_overlay(role, "kubernetes", "V1Pod", overlay)
    return app


def _parse_tolerations(text: str) -> list[dict[str, str]]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        key_value, sep, effect = item.rpartition(":")
        if not sep or not key_value:
            raise ValueError(f"toleration {item!r} is not KEY[=VALUE]:EFFECT (e.g. nvidia.com/gpu:NoSchedule)")
        key, eq, value = key_value.partition("=")
        tol = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
        if eq:
            tol["value"] = value
        out.append(tol)
    return out


def _pod_overlay(image: str, secrets: list[str], node_selector: dict[str, str],
                 tolerations: list[dict[str, str]], labels: dict[str, str], mem_mb: int,
                 scratch: list[str] | None = None, teacher_secret: str = "") -> dict[str, Any]:
    """What each pod of the job gets beyond TorchX's own: the restricted security context (pod and
    container), emptyDirs with size limits for every writable path (TorchX's /dev/shm included, bounded
    by the pod's memory it counts against), no service-account token and no service links (the workers
    call no Kubernetes API), Secrets as envFrom of the (only) container (the teachers' optional), node
    selector, tolerations and labels (TorchX adds its own labels after the overlay; it sets none of the
    others). The container's env stays TorchX's (the merge would replace it whole), so Secrets come as envFrom."""
    from torchx.specs.overlays import JOIN

    # the container's name differs per replica, its image does not: merge on the image, leaving the
    # env and resources TorchX sets untouched (the merge replaces whole fields: the volumeMounts below
    # repeat TorchX's /dev/shm)
    writable = writable_dirs(scratch or [])
    mounts = {"dshm": "/dev/shm", **{name: path for name, (path, _) in writable.items()}}
    container: dict[str, Any] = {
        "image": image,
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": name, "mountPath": path} for name, path in mounts.items()],
    }
    refs = env_from(secrets, teacher_secret)
    if refs:
        container["envFrom"] = refs
    volumes = empty_dirs(writable)
    if mem_mb > 0:
        volumes.append(shm_volume(mem_mb))
    spec: dict[str, Any] = {
        JOIN("containers", on="image"): [container],
        JOIN("volumes", on="name"): volumes,
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    out: dict[str, Any] = {"spec": spec}
    if labels:
        out["metadata"] = {"labels": dict(labels)}
    return out


# ---- from a TrainConfig ----------------------------------------------------------------------
def app_for_config(cfg, config_path: str, overrides: dict[str, Any]) -> specs.AppDef:
    """The TorchX app that trains `cfg` (= load_config(config_path, overrides)) as its `launch` says."""
    launch = cfg.launch
    if launch.scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {launch.scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
    if launch.nodes > 1 and launch.scheduler == "local_cwd":
        raise ValueError("local_cwd runs on this machine only: set launch.nodes=1 or scheduler=kubernetes")
    on_k8s = launch.scheduler == "kubernetes"
    tolerations = ",".join(f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect', '')}"
                           for t in launch.tolerations) if on_k8s and launch.gpus_per_node else ""
    name = f"sdar-{cfg.arm}-seed{cfg.seed}".replace("_", "-")
    # the pods' root filesystem is read-only: an output_dir outside /tmp and runs/ gets an emptyDir
    scratch = output_scratch(cfg) if on_k8s else ""
    # on this machine the workers inherit this process's environment (credentials included); the
    # interpreter's bin/ goes first so `torchrun` is the one installed beside sdar
    env = {} if on_k8s else {"PATH": os.path.dirname(sys.executable)}
    return trainer(
        *train_args(config_path, overrides),
        image=launch.image, nnodes=launch.nodes, nproc_per_node=procs_per_node(launch), gpu=launch.gpus_per_node,
        cpu=launch.cpu, memMB=launch.memory_mb, name=name, secrets=",".join(launch.secrets) if on_k8s else "",
        node_selector=dict(launch.node_selector) if on_k8s and launch.gpus_per_node else None,
        tolerations=tolerations, labels=dict(launch.pod_labels) if on_k8s else None, env=env, scratch=scratch,
        teacher_secret=teacher_secret_of(cfg) if on_k8s else "",  # on this machine the workers inherit the keys
    )


def scheduler_cfg(cfg) -> dict[str, Any]:
    """The scheduler's run options: Volcano queue, namespace and service account on Kubernetes; the
    workers' log directory (<output_dir>/torchx-logs) on this machine."""
    launch = cfg.launch
    if launch.scheduler != "kubernetes":
        return {"log_dir": str(cfg.resolved_output_dir() / "torchx-logs")}
    out: dict[str, Any] = {"queue": launch.queue, "namespace": job_namespace(launch)}
    if launch.service_account:
        out["service_account"] = launch.service_account
    return out


def dryrun(cfg, config_path: str, overrides: dict[str, Any], validate_spec: bool = True,
           labels: dict[str, str] | None = None):
    """What `launch_training` would submit (a torchx AppDryRunInfo; `.request.resource` is the
    Volcano Job for kubernetes, carrying `labels`), without submitting anything. validate_spec=False skips the
    Kubernetes API server's own dry run (no cluster needed)."""
    from torchx.runner import get_runner

    opts = scheduler_cfg(cfg)
    if cfg.launch.scheduler == "kubernetes":
        opts["validate_spec"] = validate_spec
    with handlers_kept(), get_runner() as runner:  # TorchX's local scheduler sets its own
        return _labelled(runner.dryrun(app_for_config(cfg, config_path, overrides), cfg.launch.scheduler, cfg=opts),
                         labels)


def _labelled(info, labels: dict[str, str] | None):
    """The dry run `info` with `labels` on its Volcano Job (TorchX sets none there; a local_cwd run has no job)."""
    if labels and isinstance(getattr(info.request, "resource", None), dict):
        meta = info.request.resource.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
    return info


def delete_labelled(namespace: str, label_selector: str, *, api_client=None) -> list[str]:
    """Delete every Volcano Job (TorchX's kubernetes jobs) matching `label_selector` in `namespace`, its pods with
    it (sdar.launch.job.delete_labelled): what a pipeline's teardown does for the TorchX jobs of its run."""
    return delete_jobs(VOLCANO_JOB, namespace, label_selector, api_client or kube_client())


def launch_training(cfg, config_path: str, overrides: dict[str, Any], wait_interval: float = 10.0,
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Submit the TorchX job for `cfg`, wait for it, and return a summary like `sdar.train.train`'s,
    with the final policy downloaded from the checkpoint store (rank 0 publishes it there) into
    <output_dir>/final of this machine.

    On Kubernetes the job's pods share no disk with this one: cfg.checkpoint.uri must be s3://. labels: on the
    Volcano Job (the pipeline's run label, by which its teardown deletes a job that a lost node left running).
    """
    from torchx.runner import get_runner
    from torchx.specs import AppState

    if cfg.launch.scheduler == "kubernetes":
        require_s3(cfg)
    app = app_for_config(cfg, config_path, overrides)
    opts = scheduler_cfg(cfg)
    with handlers_kept(), get_runner() as runner:  # TorchX's local scheduler sets its own
        handle = runner.schedule(_labelled(runner.dryrun(app, cfg.launch.scheduler, cfg=opts), labels))
        print(f"TorchX job {handle}: {cfg.launch.nodes} x {procs_per_node(cfg.launch)} torchrun workers", flush=True)
        try:
            with sigterm_raises():
                status = runner.wait(handle, wait_interval=wait_interval)
        except BaseException:
            # this step was stopped (a terminated pipeline run, Ctrl-C): stop the job too, or its
            # gang keeps the GPU nodes until it ends on its own
            _cancel(runner, handle)
            raise
        if status is None or status.state != AppState.SUCCEEDED:
            _print_log_tail(runner, handle)
    if status is None or status.state != AppState.SUCCEEDED:
        where = f"the logs under {opts['log_dir']}" if "log_dir" in opts else f"`torchx log {handle}`"
        raise RuntimeError(f"TorchX job {handle} did not succeed ({status.state if status else 'gone'}); see {where}")
    return collect_result(cfg, app_handle=handle)


def _cancel(runner, handle: str) -> None:
    try:
        runner.cancel(handle)
        print(f"cancelled TorchX job {handle}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the original error matters more; say what to do
        print(f"could not cancel TorchX job {handle} ({exc}); run `torchx cancel {handle}`", flush=True)


def _print_log_tail(runner, handle: str, lines: int = 50) -> None:
    """The last `lines` lines of node 0's log, so a failed step shows why in its own log."""
    try:
        tail = collections.deque(runner.log_lines(handle, ROLE, k=0), maxlen=lines)
    except Exception as exc:  # noqa: BLE001 - best effort: the error below names the logs anyway
        print(f"(could not read the logs of TorchX job {handle}: {exc})", flush=True)
        return
    print(f"--- last {len(tail)} log lines of {ROLE} node 0 of TorchX job {handle} ---", flush=True)
    for line in tail:
        print(line, end="" if line.endswith("\n") else "\n")
    sys.stdout.flush()
