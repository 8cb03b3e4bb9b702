"""The training job's pods under the restricted Pod Security profile, for either launcher: the images' user, no
privilege escalation, no capabilities, the runtime's seccomp profile and a read-only root filesystem, with
size-limited emptyDirs for what the workers write."""

from __future__ import annotations

import os
from typing import Any

# The images' user (USER 10001:10001 in images/*/Dockerfile). What the workers write goes to emptyDirs: /tmp (HOME,
# the Hugging Face, Triton and vLLM caches, torchrun's files) and /workspace/runs (the image's WORKDIR runs/, the
# default output root: checkpoints spool there before they reach S3).
RUN_AS_USER = 10001
RUN_AS_GROUP = 10001
IMAGE_WORKDIR = "/workspace"  # images/trainer/Dockerfile's WORKDIR: relative paths start there
WRITABLE_DIRS = {"tmp": ("/tmp", "100Gi"), "runs": ("/workspace/runs", "50Gi")}
SCRATCH_SIZE = "50Gi"  # each extra writable directory (`scratch`), e.g. an output_dir outside those two


def pod_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_GROUP, "fsGroup": RUN_AS_GROUP,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False,
            "readOnlyRootFilesystem": True, "runAsNonRoot": True}


def output_scratch(cfg) -> str:
    """The run's output_dir as the pods see it when it lies outside WRITABLE_DIRS (it then needs an emptyDir of
    its own), else ""."""
    out_dir = os.path.normpath(os.path.join(IMAGE_WORKDIR, cfg.resolved_output_dir()))
    inside = any(out_dir == d or out_dir.startswith(d + "/") for d, _ in WRITABLE_DIRS.values())
    return "" if inside else out_dir


def writable_dirs(scratch: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (mount path, size limit) of each emptyDir: WRITABLE_DIRS, then each of `scratch` (scratch-<i>)."""
    writable = dict(WRITABLE_DIRS)
    for i, path in enumerate(scratch):
        if not path.startswith("/"):
            raise ValueError(f"scratch directory {path!r} is not an absolute path")
        writable[f"scratch-{i}"] = (path, SCRATCH_SIZE)
    return writable


def empty_dirs(writable: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """The pod's volumes of `writable` (writable_dirs), each an emptyDir with its size limit."""
    return [{"name": name, "emptyDir": {"sizeLimit": size}} for name, (_, size) in writable.items()]


def shm_volume(memory_mb: int) -> dict[str, Any]:
    """/dev/shm (NCCL's and the dataloaders' shared memory) in memory, bounded by the pod's memory it counts against."""
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{int(memory_mb)}M"}}
