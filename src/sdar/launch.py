"""Training as a TorchX job: `torchrun -m sdar.cli train ...` on `nodes` x `procs_per_node` workers
(data-parallel LoRA, sdar.train.distributed), gang-scheduled as a Volcano Job on Kubernetes, or on
this machine with the `local_cwd` scheduler.

`trainer` is a TorchX component, so the TorchX CLI can run it directly:

    torchx run --workspace "" -s kubernetes -cfg queue=default,namespace=rl src/sdar/launch.py:trainer \\
        --nnodes 2 --nproc_per_node 4 --gpu 4 -- --config configs/household-tiny.yaml --arm sdar

(`--workspace ""`: run the pushed trainer image as it is, rather than have TorchX build one from
the working directory)

and `launch_training(cfg, ...)` is what the `gated_train` pipeline step calls when the config's
`launch` section says `launcher: torchx`, or asks for more than one GPU with `scheduler: local_cwd` (on
Kubernetes more than one GPU makes a Kubeflow Trainer TrainJob by default: sdar.launch_trainjob, which
shares this module's command, security context and result collection). Credentials never travel as
parameters: the pods read them from the Kubernetes Secrets named in `secrets` (envFrom), and a replaying arm's
from the teachers' Secret (`teacher_secret`, optional as in gated_train's own pod). The pods
run under the restricted Pod Security profile (non-root uid 10001, no privilege escalation, no
capabilities, RuntimeDefault seccomp, read-only root filesystem with emptyDirs for what they write).

On Kubernetes the launching pod's service account needs, in the job's namespace, exactly what
TorchX's kubernetes scheduler calls for submit, wait, cancel and logs: jobs.batch.volcano.sh create
and get, jobs/status get and update, pods get, pods/log get (k8s/base/rbac.yaml, sdar-torchx-launcher).
"""

# no `from __future__ import annotations`: TorchX reads the component's annotations as types
import collections
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from torchx import specs

from sdar.train.cli import RESULT_PREFIX

# environment variables that hold credentials or endpoints: they come from Kubernetes Secrets
# (or, for local_cwd, from the launching process's environment), never from a parameter
SECRET_ENV = frozenset({
    "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SDAR_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL",
})
SCHEDULERS = ("kubernetes", "local_cwd")
ROLE = "trainer"
# the same Secrets the pipeline's ClusterSettings gives its steps (k8s/ creates them); their keys
# are the variable names (MLFLOW_TRACKING_URI; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, SDAR_S3_ENDPOINT_URL)
DEFAULT_SECRETS = "sdar-mlflow,sdar-s3"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# The workers' pods run under the restricted Pod Security profile: the images' user (USER 10001:10001
# in images/*/Dockerfile), no privilege escalation, no capabilities, the runtime's seccomp profile and
# a read-only root filesystem. What they write goes to emptyDirs: /tmp (HOME, the Hugging Face, Triton
# and vLLM caches, torchrun's files) and /workspace/runs (the image's WORKDIR runs/, the default
# output root: checkpoints spool there before they reach S3).
RUN_AS_USER = 10001
RUN_AS_GROUP = 10001
IMAGE_WORKDIR = "/workspace"  # images/trainer/Dockerfile's WORKDIR: relative paths start there
WRITABLE_DIRS = {"tmp": ("/tmp", "100Gi"), "runs": ("/workspace/runs", "50Gi")}
SCRATCH_SIZE = "50Gi"  # each extra writable directory (`scratch`), e.g. an output_dir outside those two


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
    from sdar.images import trainer_image

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
    writable = dict(WRITABLE_DIRS)
    for i, path in enumerate(scratch or []):
        if not path.startswith("/"):
            raise ValueError(f"scratch directory {path!r} is not an absolute path")
        writable[f"scratch-{i}"] = (path, SCRATCH_SIZE)
    mounts = {"dshm": "/dev/shm", **{name: path for name, (path, _) in writable.items()}}
    container: dict[str, Any] = {
        "image": image,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "privileged": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
        "volumeMounts": [{"name": name, "mountPath": path} for name, path in mounts.items()],
    }
    env_from = [{"secretRef": {"name": s.strip()}} for s in secrets]
    if teacher_secret:
        env_from.append({"secretRef": {"name": teacher_secret, "optional": True}})
    if env_from:
        container["envFrom"] = env_from
    volumes = [{"name": name, "emptyDir": {"sizeLimit": size}} for name, (_, size) in writable.items()]
    if mem_mb > 0:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{int(mem_mb)}M"}})
    spec: dict[str, Any] = {
        JOIN("containers", on="image"): [container],
        JOIN("volumes", on="name"): volumes,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_GROUP,
                            "fsGroup": RUN_AS_GROUP, "seccompProfile": {"type": "RuntimeDefault"}},
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
def _procs_per_node(launch) -> int:
    return launch.procs_per_node or max(launch.gpus_per_node, 1)


def teacher_vars(cfg) -> set[str]:
    """The environment variables holding the API keys of the teachers a replaying arm asks (none otherwise)."""
    if cfg.resolved_arm().replay_coef == 0.0:
        return set()
    return {t.api_key_env for t in cfg.replay.teachers if t.api_key_env}


def teacher_secret_of(cfg) -> str:
    """The Secret a replaying arm's TorchX workers read its teachers' API keys from (envFrom: each key becomes the
    variable of its name), "" for an arm that asks no teacher for a key. A key stored under another name than
    its variable cannot arrive that way and is refused."""
    wanted = teacher_vars(cfg)
    if not wanted:
        return ""
    from sdar.pipeline.settings import ClusterSettings

    cs = ClusterSettings()
    renamed = sorted(var for var in wanted if cs.teacher_keys.get(var) != var)
    if renamed:
        raise ValueError(f"the teachers' api_key_env {', '.join(renamed)} is no key of the Secret {cs.teacher_secret} "
                         f"(ClusterSettings.teacher_keys: {cs.teacher_keys}): a TorchX job's workers read that Secret "
                         "whole, each key as the variable of its name; store the key under the variable's name, or "
                         "use launch.launcher=trainjob, which maps keys to variables")
    return cs.teacher_secret


def train_args(config_path: str, overrides: dict[str, Any]) -> list[str]:
    """`sdar train` arguments that rebuild the same config in the job: the file plus every override
    as --set KEY=<JSON> (JSON is YAML, which --set parses), and --publish to hand the result back."""
    args = ["--config", str(config_path)]
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args + ["--publish"]


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
    out_dir = os.path.normpath(os.path.join(IMAGE_WORKDIR, cfg.resolved_output_dir()))
    scratch = "" if not on_k8s or any(out_dir == d or out_dir.startswith(d + "/")
                                      for d, _ in WRITABLE_DIRS.values()) else out_dir
    # on this machine the workers inherit this process's environment (credentials included); the
    # interpreter's bin/ goes first so `torchrun` is the one installed beside sdar
    env = {} if on_k8s else {"PATH": os.path.dirname(sys.executable)}
    return trainer(
        *train_args(config_path, overrides),
        image=launch.image, nnodes=launch.nodes, nproc_per_node=_procs_per_node(launch), gpu=launch.gpus_per_node,
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


def job_namespace(launch) -> str:
    """Where a job goes: launch.namespace, else the launching pod's own (its service account's), else default."""
    if launch.namespace:
        return launch.namespace
    ns_file = Path(SA_NAMESPACE_FILE)
    return ns_file.read_text().strip() if ns_file.is_file() else "default"


def require_s3(cfg) -> None:
    """A Kubernetes job's pods share no disk with the launching one: they hand the result back through S3."""
    if not str(cfg.checkpoint.uri or "").startswith("s3://"):
        raise ValueError("a Kubernetes training job hands its result back through the checkpoint store: set "
                         "checkpoint.uri to an s3:// URI (the pipeline's checkpoint_root)")


def collect_result(cfg, **extra: Any) -> dict[str, Any]:
    """The summary rank 0 published to the checkpoint store (`sdar train --publish`), with the final policy
    downloaded into <output_dir>/final of this machine; `extra` is added to it (the job's handle)."""
    from sdar.storage import open_store

    store = open_store(cfg.resolved_checkpoint_uri())
    out = cfg.resolved_output_dir()
    final = out / "final"
    if final.exists():  # local_cwd: rank 0 wrote it here already; the store's copy is the same
        shutil.rmtree(final)
    store.get_dir(f"{RESULT_PREFIX}/final", final)
    summary = store.read_json(f"{RESULT_PREFIX}/summary.json")
    summary.update({"final_dir": str(final), "output_dir": str(out), **extra})
    return summary


def dryrun(cfg, config_path: str, overrides: dict[str, Any], validate_spec: bool = True):
    """What `launch_training` would submit (a torchx AppDryRunInfo; `.request.resource` is the
    Volcano Job for kubernetes), without submitting anything. validate_spec=False skips the
    Kubernetes API server's own dry run (no cluster needed)."""
    from torchx.runner import get_runner

    opts = scheduler_cfg(cfg)
    if cfg.launch.scheduler == "kubernetes":
        opts["validate_spec"] = validate_spec
    with get_runner() as runner:
        return runner.dryrun(app_for_config(cfg, config_path, overrides), cfg.launch.scheduler, cfg=opts)


def launch_training(cfg, config_path: str, overrides: dict[str, Any], wait_interval: float = 10.0) -> dict[str, Any]:
    """Submit the TorchX job for `cfg`, wait for it, and return a summary like `sdar.train.train`'s,
    with the final policy downloaded from the checkpoint store (rank 0 publishes it there) into
    <output_dir>/final of this machine.

    On Kubernetes the job's pods share no disk with this one: cfg.checkpoint.uri must be s3://.
    """
    from torchx.runner import get_runner
    from torchx.specs import AppState

    if cfg.launch.scheduler == "kubernetes":
        require_s3(cfg)
    app = app_for_config(cfg, config_path, overrides)
    opts = scheduler_cfg(cfg)
    with get_runner() as runner:
        handle = runner.schedule(runner.dryrun(app, cfg.launch.scheduler, cfg=opts))
        print(f"TorchX job {handle}: {cfg.launch.nodes} x {_procs_per_node(cfg.launch)} torchrun workers", flush=True)
        try:
            with _sigterm_raises():
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


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM (what Kubernetes sends a pod it stops) raises SystemExit here, so cleanup runs;
    only the main thread can set a handler, elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
