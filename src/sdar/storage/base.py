"""`ArtifactStore`: the interface every store has, over keys relative to its root."""

from __future__ import annotations

import json
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath
from typing import Any

from sdar.storage.errors import CorruptFileError

# local writes go to a hidden temp name first, then os.replace; listings skip these names
TMP_TAG = ".sdar-tmp-"


def clean_rel(rel: str | os.PathLike, *, allow_empty: bool = False) -> str:
    """`rel` as a normalised POSIX path relative to the store root; rejects absolute paths and '..'."""
    text = str(rel).replace("\\", "/").strip("/")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"relative storage path {str(rel)!r} contains '..'; name a path inside the store")
    if not parts and not allow_empty:
        raise ValueError("empty relative storage path; name a file such as 'checkpoints/latest.json'")
    return "/".join(parts)


def join_key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix and rel else (prefix or rel)


class ArtifactStore(ABC):
    """Files under one root (a directory or an S3 prefix), addressed by POSIX paths relative to it.

    Every method takes store-relative paths ('checkpoints/step-000010/model.safetensors');
    `list` returns paths relative to the store root, so they can be passed back to `get_file`.
    """

    uri: str

    @classmethod
    def for_uri(cls, uri: str | os.PathLike, **kwargs: Any) -> ArtifactStore:
        """The store for `uri`: a local path, `file:///path` or `s3://bucket/prefix` (see `open_store`)."""
        from sdar.storage import open_store  # the package picks the subclass

        return open_store(uri, **kwargs)

    # -- backend primitives (keys are already cleaned) ---------------------------------------
    @abstractmethod
    def _put_file(self, local: Path, key: str) -> None: ...

    @abstractmethod
    def _get_file(self, key: str, local: Path) -> None:
        """Download `key` to `local`; raise FileNotFoundError when it does not exist."""

    @abstractmethod
    def _put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _get_bytes(self, key: str) -> bytes:
        """The content of `key`; raise FileNotFoundError when it does not exist."""

    @abstractmethod
    def _is_file(self, key: str) -> bool: ...

    @abstractmethod
    def _list(self, key_prefix: str) -> list[str]:
        """Sorted keys of all files under directory `key_prefix` ('' = whole store)."""

    @abstractmethod
    def _delete_keys(self, keys: list[str]) -> None: ...

    # -- public API ---------------------------------------------------------------------------
    def clean_temporaries(self, prefix: str = "") -> list[str]:
        """Delete leftovers of killed writes under `prefix` (a store whose writes leave none: nothing)."""
        return []

    def uri_for(self, rel: str = "") -> str:
        """The full URI of a store-relative path (for logs and error messages)."""
        rel = clean_rel(rel, allow_empty=True)
        return f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri

    def put_file(self, local: str | os.PathLike, rel: str) -> str:
        """Upload one local file to `rel`; returns the cleaned relative path."""
        local = Path(local)
        if not local.is_file():
            raise FileNotFoundError(f"cannot upload {local}: not a file")
        key = clean_rel(rel)
        self._put_file(local, key)
        return key

    def get_file(self, rel: str, local: str | os.PathLike) -> Path:
        """Download `rel` to the local path `local` (parents created); returns `local`."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        self._get_file(clean_rel(rel), local)
        return local

    def put_dir(self, local_dir: str | os.PathLike, rel_prefix: str) -> list[str]:
        """Upload every file under `local_dir` to `rel_prefix/<relative path>`; returns the keys written."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise NotADirectoryError(f"cannot upload {local_dir}: not a directory")
        prefix = clean_rel(rel_prefix, allow_empty=True)
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = join_key(prefix, path.relative_to(local_dir).as_posix())
            self._put_file(path, key)
            keys.append(key)
        return keys

    def get_dir(self, rel_prefix: str, local_dir: str | os.PathLike) -> list[Path]:
        """Download every file under `rel_prefix` into `local_dir`, keeping relative paths."""
        prefix = clean_rel(rel_prefix, allow_empty=True)
        keys = self._list(prefix)
        if not keys:
            raise FileNotFoundError(f"nothing stored under {self.uri_for(prefix)}")
        local_dir = Path(local_dir)
        out = []
        for key in keys:
            target = local_dir / key[len(prefix):].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            self._get_file(key, target)
            out.append(target)
        return out

    def exists(self, rel: str) -> bool:
        """True when `rel` is a file, or a directory prefix with at least one file under it."""
        key = clean_rel(rel)
        return self._is_file(key) or bool(self._list(key))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted store-relative paths of all files under directory `prefix` ('' lists the store)."""
        return self._list(clean_rel(prefix, allow_empty=True))

    def delete(self, prefix: str) -> int:
        """Delete the file `prefix` and every file under directory `prefix`; returns how many."""
        key = clean_rel(prefix, allow_empty=True)
        if not key:
            raise ValueError(f"refusing to delete everything in {self.uri}; name a prefix such as 'checkpoints'")
        keys = self._list(key) + ([key] if self._is_file(key) else [])
        if keys:
            self._delete_keys(keys)
        return len(keys)

    def move(self, src: str, dst: str) -> int:
        """Move every file under `src` to the same relative path under `dst` (copied, then deleted at `src`);
        returns how many. `dst` must not exist yet."""
        src_key, dst_key = clean_rel(src), clean_rel(dst)
        keys = self._list(src_key)
        if not keys:
            raise FileNotFoundError(f"nothing stored under {self.uri_for(src_key)}")
        if self._list(dst_key):
            raise FileExistsError(f"{self.uri_for(dst_key)} exists already; move to a new place")
        for key in keys:
            self._copy_key(key, join_key(dst_key, key[len(src_key):].lstrip("/")))
        self._delete_keys(keys)
        return len(keys)

    def _copy_key(self, key: str, new_key: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "copy"
            self._get_file(key, local)
            self._put_file(local, new_key)

    def write_text(self, rel: str, text: str) -> str:
        key = clean_rel(rel)
        self._put_bytes(key, text.encode("utf-8"))
        return key

    def read_text(self, rel: str) -> str:
        return self._get_bytes(clean_rel(rel)).decode("utf-8")

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_text(rel, json.dumps(obj, indent=2, sort_keys=True) + "\n")

    def read_json(self, rel: str) -> Any:
        text = self.read_text(rel)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorruptFileError(f"{self.uri_for(rel)} is not valid JSON ({exc}); rewrite or delete it") from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


