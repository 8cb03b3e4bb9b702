"""What `target="cluster"` adds to the comparison pipeline's tasks, through kfp-kubernetes: pod labels (the
NetworkPolicies admit only labelled pods), the Secrets each step reads and no other, a non-root user,
CPU and memory requests equal to the limits, GPUs and the GPU nodes' selector and tolerations for training
(and, with ClusterSettings.eval_on_gpu, evaluation), no caching where a step has side effects, and the
pipeline's image for the TorchX jobs a training step launches. The DAG (pipelines/sdar_comparison.py)
names each task's step; this module decides what that step gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdar.pipeline.settings import MLFLOW_STEPS, S3_STEPS, TEACHER_STEPS, ClusterSettings

# steps with side effects (services, MLflow runs, paid teacher calls) that must happen on every run: never cached
UNCACHED_STEPS = ("teardown_envs", "launch_envs", "evaluate", "gated_train", "teacher_replay")
# steps that load a policy: evaluation-sized pods (gated_train gets the training size)
POLICY_STEPS = ("evaluate", "rollout", "teacher_replay")


def apply_cluster_settings(tasks: Mapping[Any, str], cs: ClusterSettings, image: str) -> None:
    """Set up every task of `tasks` ({KFP task: its component's name}) for a cluster run with `cs`.

    image: the pipeline's image; each gated_train task passes it as SDAR_IMAGE to the TorchX jobs it
    launches (unless the config's launch.image names another)."""
    from kfp import kubernetes

    for task in tasks:
        for k, v in cs.pod_labels.items():
            kubernetes.add_pod_label(task, label_key=k, label_value=v)
    sizes = {"gated_train": (cs.train_cpu, cs.train_memory), **{s: (cs.eval_cpu, cs.eval_memory) for s in POLICY_STEPS}}
    for task, step in tasks.items():
        secrets(task, cs, step)  # run_matrix touches no store
        restricted(task, cs, *sizes.get(step, (cs.step_cpu, cs.step_memory)))
    for task, step in tasks.items():
        if step in UNCACHED_STEPS:
            task.set_caching_options(False)
    for task, step in tasks.items():
        if step == "gated_train":
            resources(task, cs)
            task.set_env_variable("SDAR_IMAGE", image)
        elif step == "evaluate" and cs.eval_on_gpu:
            resources(task, cs)


def resources(task, cs: ClusterSettings) -> None:
    """CPU and memory of a training-sized pod, and with cs.gpus > 0 its GPUs and the GPU nodes'
    selector and tolerations (without GPUs the pod runs on any node)."""
    from kfp import kubernetes

    task.set_cpu_request(cs.train_cpu).set_cpu_limit(cs.train_cpu)
    task.set_memory_request(cs.train_memory).set_memory_limit(cs.train_memory)
    if not cs.gpus:
        return
    task.set_accelerator_type(cs.gpu_type).set_accelerator_limit(cs.gpus)
    for k, v in cs.node_selector.items():
        kubernetes.add_node_selector(task, label_key=k, label_value=v)
    for t in cs.tolerations:
        kubernetes.add_toleration(task, key=t.get("key"), operator=t.get("operator"), value=t.get("value"),
                                  effect=t.get("effect"))


def secrets(task, cs: ClusterSettings, step: str) -> None:
    """The Secrets `step` (a component's name) reads, and no other."""
    from kfp import kubernetes

    if step in MLFLOW_STEPS:
        kubernetes.use_secret_as_env(task, secret_name=cs.mlflow_secret, secret_key_to_env=dict(cs.mlflow_keys))
    if step in S3_STEPS:
        kubernetes.use_secret_as_env(task, secret_name=cs.s3_secret, secret_key_to_env=dict(cs.s3_keys))
    if step in TEACHER_STEPS and cs.teacher_keys:
        kubernetes.use_secret_as_env(task, secret_name=cs.teacher_secret, secret_key_to_env=dict(cs.teacher_keys),
                                     optional=True)


def restricted(task, cs: ClusterSettings, cpu: str, memory: str) -> None:
    """Non-root user and group (KFP adds no privilege escalation, drop ALL, seccomp RuntimeDefault), and
    CPU and memory requests equal to the limits (the training pods' `resources` replaces them)."""
    from kfp import kubernetes

    if cs.security_context:
        kubernetes.set_security_context(task, run_as_user=cs.run_as_user, run_as_group=cs.run_as_group,
                                        run_as_non_root=True)
    task.set_cpu_request(cpu).set_cpu_limit(cpu)
    task.set_memory_request(memory).set_memory_limit(memory)
