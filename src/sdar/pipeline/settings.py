"""The settings of the comparison pipeline, as plain dataclasses (no kfp import): `RunSettings`, the sizes and
arms of one run (the pipeline's arguments), and `ClusterSettings`, what `target="cluster"` adds to the tasks
(GPUs, scheduling, the env service's image and namespace, Secrets, pod security). `sdar compile`, `sdar run
--local`, `sdar submit` and the DAG (pipelines/sdar_comparison.py) share them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sdar.config.secrets import (
    MLFLOW_KEYS,
    MLFLOW_SECRET,
    S3_KEYS,
    S3_SECRET,
    TEACHER_KEYS,
    TEACHER_SECRET,
)

PIPELINE_NAME = "sdar-comparison"  # the DAG's name, and its entry point's in group sdar.pipelines
DEFAULT_ARMS = ["grpo", "grpo_opsd", "sdar"]
DEFAULT_CONFIG = "configs/household-tiny.yaml"
DEFAULT_EXPERIMENT = "sdar-comparison"
TARGETS = ("local", "cluster")


@dataclass
class ClusterSettings:
    """What `target="cluster"` adds to the tasks (kfp-kubernetes); the secrets must exist in the
    pipeline's namespace (k8s/ creates them).

    gpu_type / gpus: accelerator of each gated_train pod (set_accelerator_type / _limit). gpus=0: no
    GPU request, node selector or toleration, for clusters without GPUs (kind, minikube) or when
    gated_train only launches a TorchX job (launch.gpus_per_node in `overrides`) and waits for it.
    train_cpu / train_memory: requests (and limits) of each gated_train pod.
    node_selector: labels a GPU node carries (EKS managed node group named "gpu" by default).
    tolerations: taints of the GPU nodes the training pods tolerate.
    env_image: the env-server image launch_envs deploys; "" = SDAR_ENV_IMAGE, else sdar-env-server
    beside the pipeline's image (same registry and tag), else sdar.images' default.
    env_namespace: default of the pipeline's `namespace` parameter, where launch_envs puts the env
    services: `sdar`, where k8s/ grants the Role and NetworkPolicies; "" = the pipeline pods' own.
    mlflow_secret / mlflow_keys: Secret name and {env var: secret key} for MLflow (tracking URI etc.),
    given only to the steps that log (MLFLOW_STEPS; MLflow proxies artifacts, so none needs S3 for it).
    s3_secret / s3_keys: Secret name and {env var: secret key} for S3/MinIO, given only to the step
    that reads and writes checkpoints there (S3_STEPS: gated_train and the TorchX jobs it launches).
    The Secrets' names and keys default to sdar.config.secrets, which the training jobs (sdar.launch) read too.
    eval_on_gpu: give the evaluation pods the same GPU settings (real models decode faster there).
    pod_labels: labels on every task's pod; k8s/ NetworkPolicies admit only pods carrying these to
    the env services, MLflow and MinIO (the chart's networkPolicy.allowedClients default too).
    run_as_user / run_as_group: the user every step's container runs as (non-root; the images' USER
    10001:10001). KFP's backend (>= 2.16) adds the rest of the restricted profile to every executor
    container (allowPrivilegeEscalation false, capabilities drop ALL, seccomp RuntimeDefault).
    security_context: False leaves the user out of the IR, for KFP backends before 2.16, whose
    compiler rejects the field (2.6 to 2.15) or then drops the pod labels (2.5).
    step_cpu / step_memory: requests (and limits) of the light steps (run matrix, launch, compare, teardown).
    eval_cpu / eval_memory: requests (and limits) of the evaluation pods without eval_on_gpu.
    """

    gpu_type: str = "nvidia.com/gpu"
    gpus: int = 1
    train_cpu: str = "8"
    train_memory: str = "32G"
    node_selector: dict[str, str] = field(default_factory=lambda: {"eks.amazonaws.com/nodegroup": "gpu"})
    tolerations: list[dict[str, str]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    env_image: str = ""
    env_namespace: str = "sdar"
    mlflow_secret: str = MLFLOW_SECRET
    mlflow_keys: dict[str, str] = field(default_factory=lambda: dict(MLFLOW_KEYS))
    s3_secret: str = S3_SECRET
    s3_keys: dict[str, str] = field(default_factory=lambda: dict(S3_KEYS))
    eval_on_gpu: bool = False
    pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/part-of": "sdar-pipeline"})
    run_as_user: int = 10001
    run_as_group: int = 10001
    security_context: bool = True
    step_cpu: str = "1"
    step_memory: str = "2G"
    eval_cpu: str = "4"
    eval_memory: str = "16G"
    # the teacher pool's API keys: {env var an endpoint's api_key_env names: key in the Secret}, mounted
    # (optional: a pool of local models needs none) in the steps that call the pool (TEACHER_STEPS)
    teacher_secret: str = TEACHER_SECRET
    teacher_keys: dict[str, str] = field(default_factory=lambda: dict(TEACHER_KEYS))


# the steps (component names) that read each Secret: MLflow for those that log runs (launch opens the
# parent run, teardown closes it); S3 for checkpoints, which only training reads and writes
MLFLOW_STEPS = ("launch_envs", "evaluate", "gated_train", "compare", "teardown_envs")
S3_STEPS = ("gated_train",)
# the steps that call the N-teacher pool (Composer channel 3): the replay step, and training, which goes on
# replaying its own on-policy trajectories
TEACHER_STEPS = ("teacher_replay", "gated_train")


@dataclass
class RunSettings:
    """Sizes of one comparison run; 0 keeps the config's value. `quick()` is the smoke-test size."""

    arms: list[str] = field(default_factory=lambda: list(DEFAULT_ARMS))
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 0
    group_size: int = 0
    tasks_per_step: int = 0
    eval_tasks: int = 0
    episodes_per_task: int = 1
    eval_temperature: float = 0.4
    greedy: bool = False
    family: str = ""
    model: str = ""
    config_path: str = DEFAULT_CONFIG
    overrides: dict[str, Any] = field(default_factory=dict)
    experiment: str = DEFAULT_EXPERIMENT
    teacher_pool: str = ""  # YAML of the N-teacher pool; "" = the config's replay section (the local pool)
    replay_episodes: int = 8  # episodes each round's rollout step plays for teacher replay
    replay_rounds: int = 1  # rollout -> teacher_replay -> gated_train rounds (compile time)

    @classmethod
    def quick(cls, **changes: Any) -> "RunSettings":
        """A few minutes on 2 CPU cores: 2 steps of 2 tasks x 2 rollouts, 10 eval tasks, 8-turn
        episodes, a small warm start, no periodic evaluation. A smoke test of the machinery: the
        policy barely learns at this size."""
        base = cls(steps=2, group_size=2, tasks_per_step=2, eval_tasks=10, replay_episodes=2, overrides={
            "rollout.max_turns": 8, "eval.every": 0, "checkpoint.every": 2,
            "warmstart.episodes": 24, "warmstart.epochs": 1,  # the tokenizer still sees 400 (cheap)
            # headroom: a barely trained policy wanders into long observations the config's budgets refuse
            "rollout.max_prompt_tokens": 768, "teacher.max_prompt_tokens": 1024,
        })
        overrides = {**base.overrides, **changes.pop("overrides", {})}
        return replace(base, overrides=overrides, **changes)

    def arguments(self) -> dict[str, Any]:
        """The pipeline's arguments (overrides as JSON: a KFP dict parameter would turn ints into floats)."""
        d = asdict(self)
        out = {k: d[k] for k in ("arms", "seeds", "steps", "group_size", "tasks_per_step", "eval_tasks",
                                 "episodes_per_task", "eval_temperature", "greedy", "family", "model",
                                 "config_path", "experiment", "teacher_pool", "replay_episodes")}
        out["overrides"] = json.dumps(self.overrides, sort_keys=True)
        return out


# arms trained at once by the local runner (which caps it at 2). On 2 cores, 2 at once vs 1 at a
# time measured 147 s vs 157 s for the quick run: no loss from the overlap, so arms run in parallel
LOCAL_PARALLELISM = 2


def arms_at_once(text: str) -> int:
    """`--parallel N` of `sdar run --local` and `sdar demo`: 1..LOCAL_PARALLELISM, else a message saying which."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= LOCAL_PARALLELISM:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the local runner trains 1 to {LOCAL_PARALLELISM} arms at once (2, the default; 1 one at a "
            "time, with one training process's memory)")
    return n
