"""`LocalStore`: a directory, every write to a temporary name then renamed into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sdar.storage.base import TMP_TAG, ArtifactStore, clean_rel
from sdar.storage.errors import (
    DiskFull,
    free_bytes,
    is_disk_full,
)


class LocalStore(ArtifactStore):
    """A directory on the local file system; every file write is atomic (temp file + rename)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    @contextlib.contextmanager
    def _atomic_target(self, key: str) -> Iterator[Path]:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}{TMP_TAG}", dir=target.parent)
        os.close(fd)
        try:
            yield Path(tmp)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _put_file(self, local: Path, key: str) -> None:
        try:
            with self._atomic_target(key) as tmp:
                shutil.copyfile(local, tmp)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFull(self._path(key), Path(local).stat().st_size, free_bytes(self._path(key))) from None

    def _get_file(self, key: str, local: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(f"{self.uri_for(key)} does not exist")
        shutil.copyfile(src, local)

    def _put_bytes(self, key: str, data: bytes) -> None:
        try:
            with self._atomic_target(key) as tmp:
                tmp.write_bytes(data)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFull(self._path(key), len(data), free_bytes(self._path(key))) from None

    def _get_bytes(self, key: str) -> bytes:
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(f"{self.uri_for(key)} does not exist")
        return src.read_bytes()

    def _is_file(self, key: str) -> bool:
        return self._path(key).is_file()

    def _list(self, key_prefix: str) -> list[str]:
        base = self._path(key_prefix)
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and TMP_TAG not in p.name
        )

    def move(self, src: str, dst: str) -> int:
        src_dir, dst_dir = self._path(clean_rel(src)), self._path(clean_rel(dst))
        n = len(self._list(clean_rel(src)))
        if not n:
            raise FileNotFoundError(f"nothing stored under {self.uri_for(src)}")
        if dst_dir.exists():
            raise FileExistsError(f"{self.uri_for(dst)} exists already; move to a new place")
        dst_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src_dir, dst_dir)  # one rename: never half moved
        return n

    def clean_temporaries(self, prefix: str = "") -> list[str]:
        """Delete the temporary files of writes that were killed (kill -9 between the temp file and its
        rename leaves one for ever); only safe while no other writer uses the prefix. Returns their keys."""
        base = self._path(prefix)
        found = [p for p in base.rglob(f"*{TMP_TAG}*") if p.is_file()] if base.is_dir() else []
        for p in found:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        return [p.relative_to(self.root).as_posix() for p in found]

    def _delete_keys(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()
        # remove directories left empty, deepest first, never the root itself
        parents = {self._path(k).parent for k in keys}
        for d in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while d != self.root and self.root in d.parents:
                try:
                    d.rmdir()
                except OSError:
                    break
                d = d.parent


