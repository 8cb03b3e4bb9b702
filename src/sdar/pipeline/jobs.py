"""A local pipeline job and what its finished tasks leave for a rerun, so that a killed `sdar run --local`
continued with `--resume <job>` (issue 43.3) does not redo what had finished.

The job: the local runner names it itself (`new_job_id`; JOB_ENV, which its task processes inherit, instead of KFP's
per-run uuid) and keeps what continuing it needs in <root>/outputs/<job>/job.json (`write_job` / `read_job`: the
settings, the MLflow parent run and store), under a lock held for the life of the run (`job_lock`).

Its tasks: each step function decorated with `once_per_job` records its return value and its output files under
<output_root>/<job>/tasks/<task>-<key>/ once it returns, and the same task of the same job later restores them
instead of running again. A task that was interrupted left no record and runs again; training then resumes from its
own newest checkpoint (sdar.train's resume), and MLflow keeps one run per arm and one row per metric and step
(sdar.tracking.Tracker's resume_step). On a cluster JOB_ENV is unset: KFP's job id stands and nothing is recorded (its
own retries and caching apply, and a pod's artifacts may sit on another filesystem than its outputs, where a record
would be a second copy of a checkpoint). Outputs are hard links where the filesystem allows, copies otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

JOB_ENV = "SDAR_PIPELINE_JOB"  # the job the local runner's tasks work for (sdar.pipeline.runner.run_local)
DONE = "_DONE.json"


def job_of(job_id: str) -> str:
    """The job a pipeline step works for: the local runner's (JOB_ENV: a resumed run continues its job), else `job_id`,
    KFP's."""
    return os.environ.get(JOB_ENV, "").strip() or job_id


JOB_FILE = "job.json"


class JobError(ValueError):
    """A job that cannot be continued: unknown, finished, running elsewhere, or asked with other settings."""


def new_job_id() -> str:
    """A fresh local job id: when it began, and 6 random hex digits (two runs in one second differ)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def job_file(output_root: str | os.PathLike, job_id: str) -> Path:
    return Path(output_root) / job_id / JOB_FILE


def write_job(output_root: str | os.PathLike, job_id: str, record: dict[str, Any]) -> None:
    path = job_file(output_root, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def read_job(output_root: str | os.PathLike, job_id: str) -> dict[str, Any]:
    """The saved record of `job_id`; JobError naming the jobs there when there is none."""
    path = job_file(output_root, job_id)
    if not path.is_file():
        known = sorted(p.parent.name for p in Path(output_root).glob(f"*/{JOB_FILE}"))
        raise JobError(f"no job {job_id!r} under {output_root} (no {path}); the jobs there: "
                       f"{', '.join(known[-5:]) or 'none'}. Pass the --root the job ran with and its id as printed")
    return json.loads(path.read_text())


@contextlib.contextmanager
def job_lock(output_root: str | os.PathLike, job_id: str) -> Iterator[None]:
    """Hold the job for the life of this run (the lock goes when the process dies, however it dies); JobError when
    another run holds it."""
    path = Path(output_root) / job_id / ".runner.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise JobError(f"job {job_id} is being run by another process (pid {fh.read().strip() or '?'}); wait for "
                           "it, or stop it and resume the job then") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield


def record_dir(output_root: str | os.PathLike, job_id: str, name: str) -> Path:
    return Path(output_root) / job_id / "tasks" / name


def once_per_job(task: str, key: tuple[str, ...] = (), outputs: tuple[str, ...] = ()) -> Callable:
    """Decorate a step function that takes `job_id` and `output_root`. Under the local runner (JOB_ENV set; elsewhere the
    function runs as it is) its job id becomes the runner's, and once
    the task `task` of that job (one per value of the `key` parameters, e.g. arm and seed) has returned, a later call
    restores the files and folders of its `outputs` parameters (paths it writes) and returns the recorded value, in
    which each recorded output path reads as the new one."""

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if not os.environ.get(JOB_ENV, "").strip():  # not the local runner: KFP's own retries and caching apply
                return fn(*bound.args, **bound.kwargs)
            a["job_id"] = job_of(a["job_id"])
            name = "-".join([task, *(str(a[k]) for k in key if a[k] not in ("", None))])
            where = record_dir(a["output_root"], a["job_id"], name)
            paths = {p: str(a[p]) for p in outputs if a[p]}
            if (where / DONE).is_file():
                value = _restore(where, paths)
                print(f"{name}: finished before in job {a['job_id']}; its outputs are taken from {where}", flush=True)
                return value
            value = fn(*bound.args, **bound.kwargs)
            _record(where, paths, value)
            return value

        return run

    return wrap


def _record(where: Path, paths: dict[str, str], value: Any) -> None:
    """Write the record in a folder of its own and rename it into place: a record is whole or absent."""
    partial = where.with_name(f"{where.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for param, path in paths.items():
        if Path(path).exists():
            _link_or_copy(Path(path), partial / param)
    (partial / DONE).write_text(json.dumps({"outputs": paths, "value": value}, indent=1))
    shutil.rmtree(where, ignore_errors=True)  # a folder without DONE: nothing to keep
    os.replace(partial, where)


def _restore(where: Path, paths: dict[str, str]) -> Any:
    done = json.loads((where / DONE).read_text())
    renamed = {}
    for param, path in paths.items():
        kept = where / param
        if kept.exists():
            _link_or_copy(kept, Path(path))
        if param in done["outputs"]:
            renamed[done["outputs"][param]] = path
    return _renamed(done["value"], renamed)


def _renamed(value: Any, renamed: dict[str, str]) -> Any:
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, dict):
        return {k: _renamed(v, renamed) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, renamed) for v in value]
    return value


def _link_or_copy(src: Path, dst: Path) -> None:
    """`src` (a file or a folder) at `dst`, replacing what is there: hard links, else copies."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=_link_file)
    else:
        _link_file(src, dst)


def _link_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
