"""Where converted models, tokenizers and warm starts are cached, and how a cache entry is written: once, atomically.

Root: $SDAR_CACHE_DIR, else $XDG_CACHE_HOME/sdar, else ~/.cache/sdar (shared with the ALFWorld data).

An entry is built into a sibling temporary folder and renamed into place once its marker file is written, under an
exclusive lock on `.<name>.lock` beside it (`fcntl.flock`: the kernel releases it when the builder dies, SIGKILL
included). So two commands that need one entry build it once (the second waits, told which process builds it), a
build killed at any point leaves no folder that carries the marker, and the next build, holding the lock, removes
the folders earlier builds left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sdar_envs.base import cache_root  # noqa: F401 - the one definition, re-exported


def lock_path(target: Path) -> Path:
    """The lock file of cache entry `target`."""
    return target.parent / f".{target.name}.lock"


def leftovers(target: Path) -> list[Path]:
    """The temporary folders that builds of `target` left (killed mid-build): only meaningful under its lock."""
    return sorted(p for p in target.parent.glob(f".{target.name}.*") if p.is_dir())


@contextlib.contextmanager
def exclusive(target: Path, say: Callable[[str], Any] | None = None) -> Iterator[None]:
    """Hold `target`'s build lock. When another process holds it, `say` (default: print to stderr) is told who (pid,
    host, since when, from the lock file) once, and this waits until that process ends or finishes."""
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            for _ in range(40):  # the holder writes who it is just after it takes the lock: give it 2 s to
                fh.seek(0)
                holder = fh.read().strip()
                if holder:
                    break
                time.sleep(0.05)
            holder = holder or "another process"
            message = f"waiting for {holder} to finish building {target}"
            if say is None:
                import sys

                print(message, file=sys.stderr, flush=True)
            else:
                say(message)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} (since {time.strftime('%H:%M:%S')})")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], None], marker: str,
               say: Callable[[str], Any] | None = None) -> Path:
    """Return `target`, first running `build(tmp_dir)` and renaming it into place if `target/marker` is missing.

    Under `target`'s lock (see the module): a concurrent caller waits for the builder and then finds the entry; the
    folders of builds that died are removed first, and so is a `target` without its marker. `build` must write
    `marker` last; an entry is trusted only with it. say: where the waiting message goes.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(target, say):
        if (target / marker).is_file():  # built by the process this one waited for
            return target
        for old in leftovers(target):  # a build killed before it finished: nobody else builds while we hold the lock
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            try:
                build(tmp)
            except Exception as exc:
                from sdar.storage import DiskFull, free_bytes, is_disk_full

                if is_disk_full(exc, tmp):  # the folder goes below; say where and what, not a library's traceback
                    raise DiskFull(target, None, free_bytes(target.parent), what=f"the cache entry {target.name}") \
                        from exc
                raise
            if not (tmp / marker).is_file():
                raise RuntimeError(f"building the cache entry {target} did not write {marker}")
            if target.exists():  # no marker: not an entry anyone may trust
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
