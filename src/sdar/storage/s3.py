"""`S3Store`: a bucket and prefix on S3 or MinIO (boto3), with the endpoint and region from the standard places."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from sdar.storage.base import TMP_TAG, ArtifactStore, clean_rel, join_key
from sdar.storage.errors import (
    BucketNotFoundError,
    CredentialsError,
    StorageError,
)

ENDPOINT_ENV_VARS = ("SDAR_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
DEFAULT_REGION = "us-east-1"


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
        self.prefix = clean_rel(prefix, allow_empty=True)
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
        return join_key(self.prefix, key)

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
        tmp = local.with_name(f".{local.name}{TMP_TAG}{os.getpid()}")
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


