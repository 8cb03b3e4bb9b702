"""Artifact storage with one code path for local directories and S3/MinIO (`s3://bucket/prefix`): the stores.
What a checkpoint is in a store (its layout, publication and damage handling) is `sdar.checkpoint`'s.

The package: `errors` (what goes wrong; the disk-space checks), `base` (the interface), `local`, `s3`; `open_store`
picks one for a URI. Import from here.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from sdar.storage.base import ArtifactStore
from sdar.storage.errors import (
    BucketNotFoundError,
    CorruptFileError,
    CredentialsError,
    DiskFull,
    StorageError,
    ensure_room,
    free_bytes,
    is_disk_full,
)
from sdar.storage.local import LocalStore
from sdar.storage.s3 import ENDPOINT_ENV_VARS, S3Store, resolve_endpoint_url

# where `sdar train --publish` puts the final policy and summary.json in a run's checkpoint store, for a launcher
# on another machine to collect (sdar.launch.job)
RESULT_PREFIX = "result"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


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


__all__ = [
    "ENDPOINT_ENV_VARS", "RESULT_PREFIX", "ArtifactStore", "BucketNotFoundError", "CorruptFileError", "CredentialsError",
    "DiskFull", "LocalStore", "S3Store", "StorageError", "ensure_room", "free_bytes", "is_disk_full", "open_store",
    "resolve_endpoint_url",
]
