"""What can go wrong with a store, and the disk-space checks: errors named once, `is_disk_full` the one recogniser of a full disk."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class StorageError(RuntimeError):
    """A storage operation failed; the message says what to change."""


class CorruptFileError(StorageError):
    """A stored file that is there but cannot be read as what it should be (not JSON, a wrong shape)."""


class BucketNotFoundError(StorageError):
    """The S3 bucket named in the URI does not exist."""


class CredentialsError(StorageError):
    """No usable credentials were found in the standard AWS chain."""


class DiskFull(StorageError):
    """A local write the file system has no room for: `path` (where), `needed` bytes (None when unknown), `free`
    bytes there. Nothing half-written is left under the name (writes go to a temp name first)."""

    def __init__(self, path: str | os.PathLike, needed: int | None, free: int | None, what: str = "a file") -> None:
        self.path, self.needed, self.free, self.what = str(path), needed, free, what
        need = f"needs {size_text(needed)}" if needed is not None else "needs more room"
        have = f", {size_text(free)} free there" if free is not None else ""
        super().__init__(f"the disk is full: writing {what} to {self.path} {need}{have}")


def size_text(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def is_disk_full(exc: BaseException, where: str | os.PathLike | None = None) -> bool:
    """Whether `exc` (or an exception it was raised from) means no space or quota is left: an OSError saying so,
    SQLite's "database or disk is full" (an MLflow store, wrapped by MLflow and SQLAlchemy), or a library's own
    error naming no space left (safetensors' and tokenizers' Rust writers). With `where`: also any error while the
    file system holding `where` has less than 1 MiB free (torch.save reports a failed write as a RuntimeError)."""
    import errno

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e).lower()
        if "database or disk is full" in text or "no space left" in text or "os error 28" in text:
            return True
        e = e.__cause__ or e.__context__
    free = free_bytes(where) if where is not None else None
    return free is not None and free < (1 << 20)


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes of the file system holding `path` (its nearest existing ancestor); None when it cannot be read."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def ensure_room(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise DiskFull before writing `needed` bytes under `path` when its file system has less free (the write
    would fail part-way)."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise DiskFull(path, needed, free, what)


