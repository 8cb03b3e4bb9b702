"""What a training job needs around it, whichever launcher makes it: the `sdar train` arguments that rebuild the
config in the job, the workers per node, the namespace it goes to, the result rank 0 publishes to the checkpoint
store, and a SIGTERM that lets the launcher stop the job before the step ends."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

from sdar.storage import RESULT_PREFIX

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


@contextlib.contextmanager
def sigterm_raises():
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
