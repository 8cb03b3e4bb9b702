"""Artifact storage with one code path for local directories and S3/MinIO (`s3://bucket/prefix`): the stores.
What a checkpoint is in a store (its layout, publication and damage handling) is `sdar.checkpoint`'s."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

ENDPOINT_ENV_VARS = ("SDAR_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# where `sdar train --publish` puts the final policy and summary.json in a run's checkpoint store, for a launcher
# on another machine to collect (sdar.launch.job)
RESULT_PREFIX = "result"
DEFAULT_REGION = "us-east-1"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# local writes go to a hidden temp name first, then os.replace; listings skip these names
_TMP_TAG = ".sdar-tmp-"

log = logging.getLogger(__name__)


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
        need = f"needs {_size(needed)}" if needed is not None else "needs more room"
        have = f", {_size(free)} free there" if free is not None else ""
        super().__init__(f"the disk is full: writing {what} to {self.path} {need}{have}")


def _size(n: int | None) -> str:
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


def _clean_rel(rel: str | os.PathLike, *, allow_empty: bool = False) -> str:
    """`rel` as a normalised POSIX path relative to the store root; rejects absolute paths and '..'."""
    text = str(rel).replace("\\", "/").strip("/")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"relative storage path {str(rel)!r} contains '..'; name a path inside the store")
    if not parts and not allow_empty:
        raise ValueError("empty relative storage path; name a file such as 'checkpoints/latest.json'")
    return "/".join(parts)


def _join(prefix: str, rel: str) -> str:
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
        rel = _clean_rel(rel, allow_empty=True)
        return f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri

    def put_file(self, local: str | os.PathLike, rel: str) -> str:
        """Upload one local file to `rel`; returns the cleaned relative path."""
        local = Path(local)
        if not local.is_file():
            raise FileNotFoundError(f"cannot upload {local}: not a file")
        key = _clean_rel(rel)
        self._put_file(local, key)
        return key

    def get_file(self, rel: str, local: str | os.PathLike) -> Path:
        """Download `rel` to the local path `local` (parents created); returns `local`."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        self._get_file(_clean_rel(rel), local)
        return local

    def put_dir(self, local_dir: str | os.PathLike, rel_prefix: str) -> list[str]:
        """Upload every file under `local_dir` to `rel_prefix/<relative path>`; returns the keys written."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise NotADirectoryError(f"cannot upload {local_dir}: not a directory")
        prefix = _clean_rel(rel_prefix, allow_empty=True)
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = _join(prefix, path.relative_to(local_dir).as_posix())
            self._put_file(path, key)
            keys.append(key)
        return keys

    def get_dir(self, rel_prefix: str, local_dir: str | os.PathLike) -> list[Path]:
        """Download every file under `rel_prefix` into `local_dir`, keeping relative paths."""
        prefix = _clean_rel(rel_prefix, allow_empty=True)
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
        key = _clean_rel(rel)
        return self._is_file(key) or bool(self._list(key))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted store-relative paths of all files under directory `prefix` ('' lists the store)."""
        return self._list(_clean_rel(prefix, allow_empty=True))

    def delete(self, prefix: str) -> int:
        """Delete the file `prefix` and every file under directory `prefix`; returns how many."""
        key = _clean_rel(prefix, allow_empty=True)
        if not key:
            raise ValueError(f"refusing to delete everything in {self.uri}; name a prefix such as 'checkpoints'")
        keys = self._list(key) + ([key] if self._is_file(key) else [])
        if keys:
            self._delete_keys(keys)
        return len(keys)

    def move(self, src: str, dst: str) -> int:
        """Move every file under `src` to the same relative path under `dst` (copied, then deleted at `src`);
        returns how many. `dst` must not exist yet."""
        src_key, dst_key = _clean_rel(src), _clean_rel(dst)
        keys = self._list(src_key)
        if not keys:
            raise FileNotFoundError(f"nothing stored under {self.uri_for(src_key)}")
        if self._list(dst_key):
            raise FileExistsError(f"{self.uri_for(dst_key)} exists already; move to a new place")
        for key in keys:
            self._copy_key(key, _join(dst_key, key[len(src_key):].lstrip("/")))
        self._delete_keys(keys)
        return len(keys)

    def _copy_key(self, key: str, new_key: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "copy"
            self._get_file(key, local)
            self._put_file(local, new_key)

    def write_text(self, rel: str, text: str) -> str:
        key = _clean_rel(rel)
        self._put_bytes(key, text.encode("utf-8"))
        return key

    def read_text(self, rel: str) -> str:
        return self._get_bytes(_clean_rel(rel)).decode("utf-8")

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
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}{_TMP_TAG}", dir=target.parent)
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
            if p.is_file() and _TMP_TAG not in p.name
        )

    def move(self, src: str, dst: str) -> int:
        src_dir, dst_dir = self._path(_clean_rel(src)), self._path(_clean_rel(dst))
        n = len(self._list(_clean_rel(src)))
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
        found = [p for p in base.rglob(f"*{_TMP_TAG}*") if p.is_file()] if base.is_dir() else []
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


def resolve_endpoint_url(endpoint_url: str | None = None) -> str | None:
    """The S3 endpoint: the argument, else SDAR_S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL."""
    if endpoint_url:
        return endpoint_url
    for var in ENDPOINT_ENV_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return None


class S3Store(ArtifactStore):
    """Objects under `s3://bucket/prefix` on AWS S3 or any S3 API (MinIO), through boto3.

    Credentials come only from the standard AWS chain (env vars, profile, IRSA/instance role);
    a custom endpoint (MinIO) switches to path-style addressing.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        check: bool = True,
    ):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = _clean_rel(prefix, allow_empty=True)
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.endpoint_url = resolve_endpoint_url(endpoint_url)
        session = boto3.session.Session()
        self.region = region or session.region_name or DEFAULT_REGION
        config = Config(
            # AWS_MAX_ATTEMPTS still wins, as it would without this config
            retries={"max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", "5")), "mode": "standard"},
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            # MinIO and other S3 APIs may reject the CRC checksums newer botocore sends by default
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.client = session.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        if check:
            with self._errors("open"):
                self.client.head_bucket(Bucket=bucket)

    def _key(self, key: str) -> str:
        return _join(self.prefix, key)

    @contextlib.contextmanager
    def _errors(self, what: str, key: str = "") -> Iterator[None]:
        """Translate botocore errors into StorageError subclasses that say what to do."""
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        where = f"at endpoint {self.endpoint_url}" if self.endpoint_url else "on AWS S3"
        try:
            yield
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise CredentialsError(
                f"no AWS credentials found to {what} {self.uri_for(key)} ({exc}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or use an IAM role / IRSA on EKS)"
            ) from exc
        except EndpointConnectionError as exc:
            raise StorageError(
                f"cannot reach the S3 endpoint {self.endpoint_url or 'for region ' + self.region} ({exc}); "
                f"check that the server (MinIO) is running and SDAR_S3_ENDPOINT_URL is right"
            ) from exc
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket" or (what == "open" and (code == "404" or status == 404)):
                raise BucketNotFoundError(
                    f"S3 bucket '{self.bucket}' does not exist {where}; create it with "
                    f"`aws s3 mb s3://{self.bucket}` (MinIO: `mc mb <alias>/{self.bucket}`) or fix the URI {self.uri}"
                ) from exc
            if code in ("NoSuchKey", "404") or status == 404:
                raise FileNotFoundError(f"{self.uri_for(key)} does not exist") from exc
            if code in ("AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
                raise CredentialsError(
                    f"access denied to {what} {self.uri_for(key)} {where} ({code}); check the credentials and that "
                    f"their policy allows s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on {self.bucket}"
                ) from exc
            raise StorageError(f"S3 {what} of {self.uri_for(key)} failed {where}: {code} {err.get('Message', '')}") from exc

    def _put_file(self, local: Path, key: str) -> None:
        with self._errors("upload", key):
            self.client.upload_file(str(local), self.bucket, self._key(key))

    def _get_file(self, key: str, local: Path) -> None:
        # download next to the target and rename, so a failed download leaves no partial file
        tmp = local.with_name(f".{local.name}{_TMP_TAG}{os.getpid()}")
        try:
            with self._errors("download", key):
                self.client.download_file(self.bucket, self._key(key), str(tmp))
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def _copy_key(self, key: str, new_key: str) -> None:
        with self._errors("copy", key):  # server side (multipart above 8 MB), nothing through this machine
            self.client.copy({"Bucket": self.bucket, "Key": self._key(key)}, self.bucket, self._key(new_key))

    def _get_bytes(self, key: str) -> bytes:
        with self._errors("read", key):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def _is_file(self, key: str) -> bool:
        try:
            with self._errors("stat", key):
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return False
        return True

    def _list(self, key_prefix: str) -> list[str]:
        full = self._key(key_prefix)
        # a directory listing: 'step-1' must not match 'step-10/...'
        s3_prefix = f"{full}/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        with self._errors("list", key_prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=s3_prefix):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # the S3 API deletes at most 1000 keys per call
            chunk = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            with self._errors("delete", keys[i]):
                resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise StorageError(
                    f"could not delete {len(resp['Errors'])} objects under {self.uri}, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )


def open_store(
    uri: str | os.PathLike,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    check: bool = True,
) -> ArtifactStore:
    """The store for `uri`: a local path or `file:///path` (created if missing) or `s3://bucket/prefix`.

    endpoint_url: S3 API endpoint (MinIO); default from SDAR_S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3 or
      AWS_ENDPOINT_URL, else AWS. region: default from the AWS config/env, else us-east-1.
    check: for S3, verify the bucket exists now (one HEAD request) so a wrong name fails early.
    """
    text = os.fspath(uri)
    if not text:
        raise ValueError("empty storage URI; use a local path, file:///path or s3://bucket/prefix")
    parsed = urllib.parse.urlparse(text)
    scheme = parsed.scheme.lower()
    if scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage URI {text!r} names no bucket; write it as s3://bucket/prefix")
        if not _BUCKET_NAME.match(parsed.netloc):
            raise ValueError(
                f"invalid S3 bucket name {parsed.netloc!r} in {text!r}; bucket names are 3-63 characters of "
                "lowercase letters, digits, '.' and '-'"
            )
        return S3Store(parsed.netloc, parsed.path, endpoint_url=endpoint_url, region=region, check=check)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {text!r} names host {parsed.netloc!r}; write file:///absolute/path")
        return LocalStore(urllib.parse.unquote(parsed.path))
    if scheme == "":
        return LocalStore(text)
    raise ValueError(
        f"unsupported storage URI scheme '{scheme}' in {text!r}; use a local path, file:///path or s3://bucket/prefix"
    )
