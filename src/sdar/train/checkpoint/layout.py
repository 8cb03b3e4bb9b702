"""A checkpoint in a store: `checkpoints/step-NNNNNN/` with its files, `_COMPLETE.json` written after them (the file
list and sizes), and `checkpoints/latest.json` naming the newest; uploaded first and published last, so a killed run
never resumes from a half-written checkpoint. One that cannot be loaded is moved to `checkpoints/damaged/`, never
deleted."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from sdar.storage import ArtifactStore, CorruptFileError, StorageError

CHECKPOINTS_DIR = "checkpoints"
LATEST_MARKER = f"{CHECKPOINTS_DIR}/latest.json"
# written inside a checkpoint directory after all its files: the checkpoint is complete when present
COMPLETE_FILE = "_COMPLETE.json"
# checkpoints that could not be loaded are moved here (never deleted), each with DAMAGED_FILE saying why
DAMAGED_DIR = f"{CHECKPOINTS_DIR}/damaged"
DAMAGED_FILE = "_DAMAGED.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")

log = logging.getLogger(__name__)


class DamagedCheckpointError(StorageError):
    """A complete-looking checkpoint whose files did not all arrive whole (missing, or not their recorded size);
    `detail` says which, without the checkpoint's URI."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"checkpoint {where} is damaged: {detail}")
        self.detail = detail


def checkpoint_path(step: int) -> str:
    """The store-relative directory of the checkpoint of `step`: 'checkpoints/step-000123'."""
    return f"{CHECKPOINTS_DIR}/step-{step:06d}"


def list_checkpoints(store: ArtifactStore, *, complete_only: bool = True) -> list[tuple[int, str]]:
    """(step, rel_path) of stored checkpoints, oldest first; with complete_only, only finished uploads."""
    found: dict[int, tuple[str, bool]] = {}
    for key in store.list(CHECKPOINTS_DIR):
        parts = key.split("/")
        if len(parts) < 3 or not (m := _STEP_DIR.match(parts[1])):
            continue
        step, rel = int(m.group(1)), "/".join(parts[:2])
        done = found.get(step, (rel, False))[1] or (len(parts) == 3 and parts[2] == COMPLETE_FILE)
        found[step] = (rel, done)
    return [(s, rel) for s, (rel, done) in sorted(found.items()) if done or not complete_only]


def write_checkpoint(
    store: ArtifactStore,
    step: int,
    local_dir: str | os.PathLike,
    *,
    keep_last: int | None = None,
    meta: dict[str, Any] | None = None,
) -> str:
    """Upload `local_dir` as the checkpoint of `step`, then publish it; returns its rel path.

    Order: (1) clear leftovers of an earlier killed upload of the same step, (2) upload all files,
    (3) write `<dir>/_COMPLETE.json` (file list + sizes + meta), (4) overwrite `checkpoints/latest.json`
    with {"step", "path", **meta}. A crash before (4) leaves the previous marker in place.
    keep_last: afterwards delete all but the newest `keep_last` complete checkpoints and any unfinished
      upload of an older step. meta: JSON-able extras kept in the marker (e.g. {"mlflow_run_id": ...}).
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file()) if local_dir.is_dir() else []
    if not files:
        raise ValueError(f"checkpoint directory {local_dir} is missing or empty; save the model there first")
    meta = dict(meta or {})
    clash = {"step", "path"} & meta.keys()
    if clash:
        raise ValueError(f"checkpoint meta may not set {sorted(clash)}; those keys are written by write_checkpoint")
    rel = checkpoint_path(step)
    store.clean_temporaries(CHECKPOINTS_DIR)  # a writer killed mid-file left a temporary behind
    # unpublish first: from here until step (3) this step is not complete, whatever else remains
    store.delete(f"{rel}/{COMPLETE_FILE}")
    store.delete(rel)
    store.put_dir(local_dir, rel)
    record = {"step": step, "path": rel, **meta}
    store.write_json(
        f"{rel}/{COMPLETE_FILE}",
        {**record, "files": {p.relative_to(local_dir).as_posix(): p.stat().st_size for p in files}, "time": time.time()},
    )
    store.write_json(LATEST_MARKER, record)
    if keep_last is not None:
        prune_checkpoints(store, keep_last, newest_step=step)
    return rel


def prune_checkpoints(store: ArtifactStore, keep_last: int, *, newest_step: int | None = None) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints (never the one `latest.json` names)
    and unfinished uploads older than `newest_step`; returns the deleted rel paths."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    marker = read_checkpoint_marker(store)
    protected = marker.get("path") if marker else None
    complete = list_checkpoints(store)
    done = {s for s, _ in complete}
    doomed = [rel for _, rel in complete[:-keep_last] if rel != protected]
    if newest_step is not None:
        doomed += [rel for s, rel in list_checkpoints(store, complete_only=False) if s not in done and s < newest_step]
    for rel in doomed:
        store.delete(rel)
    return doomed


def read_checkpoint_marker(store: ArtifactStore) -> dict[str, Any] | None:
    """The content of `checkpoints/latest.json` ({"step", "path", **meta}), or None when absent; a
    `CorruptFileError` when it is not such a record."""
    try:
        marker = store.read_json(LATEST_MARKER)
    except FileNotFoundError:
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("step"), int) or not isinstance(marker.get("path"), str) \
            or not _STEP_DIR.match(marker["path"].rpartition("/")[2]):
        raise CorruptFileError(f"{store.uri_for(LATEST_MARKER)} is malformed ({str(marker)[:200]!r}); delete it to fall back")
    return marker


def latest_checkpoint(store: ArtifactStore, warn: Callable[[str], None] | None = None) -> tuple[int, str] | None:
    """(step, rel_path) of the checkpoint to resume from, or None when there is no complete one.

    The newest complete checkpoint (one with `_COMPLETE.json`): the marker's, unless it is missing, unreadable
    (said through `warn`, default: the log; the file is left as it is), names a checkpoint that is no longer
    complete, or a checkpoint of a later step completed after it (a kill between the two files).
    Uploads without `_COMPLETE.json` are never returned.
    """
    try:
        marker = read_checkpoint_marker(store)
    except CorruptFileError as exc:
        (warn or log.warning)(f"{exc}; using the newest complete checkpoint instead (the next checkpoint rewrites it)")
        marker = None
    complete = list_checkpoints(store)
    if marker and store.exists(f"{marker['path']}/{COMPLETE_FILE}"):
        # a writer killed between a checkpoint's _COMPLETE.json and latest.json left a newer complete one,
        # written after the marker's (a run deliberately restarted from an older step wrote its marker last)
        if complete and complete[-1][0] > marker["step"]:
            newer, named = (store.read_json(f"{rel}/{COMPLETE_FILE}").get("time", 0.0)
                            for rel in (complete[-1][1], marker["path"]))
            if newer > named:
                return complete[-1]
        return marker["step"], marker["path"]
    return complete[-1] if complete else None


def fetch_checkpoint(store: ArtifactStore, rel: str, local_dir: str | os.PathLike) -> dict[str, Any]:
    """Download checkpoint `rel` into `local_dir` and return its manifest, after checking that every file the
    manifest lists arrived with its recorded size (`DamagedCheckpointError` naming the first that did not)."""
    local_dir = Path(local_dir)
    store.get_dir(rel, local_dir)
    try:
        manifest = json.loads((local_dir / COMPLETE_FILE).read_text())
        files = manifest["files"]
        assert isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise DamagedCheckpointError(store.uri_for(rel), f"its {COMPLETE_FILE} does not read ({exc!r})") from None
    (local_dir / COMPLETE_FILE).unlink()
    for name, size in files.items():
        path = local_dir / name
        if not path.is_file():
            raise DamagedCheckpointError(store.uri_for(rel), f"{name} is missing")
        if path.stat().st_size != size:
            raise DamagedCheckpointError(store.uri_for(rel), f"{name} is {path.stat().st_size} bytes, its manifest says {size}")
    return manifest


def quarantine_checkpoint(store: ArtifactStore, rel: str, why: str) -> str:
    """Move checkpoint `rel`, which cannot be loaded, out of the checkpoints a run resumes from or prunes:
    to `checkpoints/damaged/<step dir>-<UTC time>/`, with `_DAMAGED.json` saying why. Nothing is deleted;
    returns the new relative path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = f"{DAMAGED_DIR}/{PurePosixPath(rel).name}-{stamp}"
    n = 1
    while store.exists(dest):
        n += 1
        dest = f"{DAMAGED_DIR}/{PurePosixPath(rel).name}-{stamp}-{n}"
    store.move(rel, dest)
    store.write_json(f"{dest}/{DAMAGED_FILE}", {"from": rel, "why": why, "time": time.time()})
    return dest


def restore_latest_checkpoint(store: ArtifactStore, local_dir: str | os.PathLike) -> tuple[int, dict[str, Any]] | None:
    """Download the latest complete checkpoint into `local_dir`; returns (step, manifest) or None.

    Checks every file the manifest lists arrived with its recorded size (`fetch_checkpoint`).
    """
    found = latest_checkpoint(store)
    if found is None:
        return None
    step, rel = found
    return step, fetch_checkpoint(store, rel, local_dir)
