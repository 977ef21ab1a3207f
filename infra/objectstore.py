"""Checkpoint directories on S3 (any S3 endpoint: AWS, MinIO, a moto server in tests) through boto3."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import boto3


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _split(uri: str) -> tuple[str, str]:
    u = urlparse(uri)
    if u.scheme != "s3" or not u.netloc:
        raise ValueError(f"not an s3://bucket/prefix URI: {uri!r}")
    return u.netloc, u.path.lstrip("/").rstrip("/")


class S3Dirs:
    def __init__(self, endpoint_url: str | None = None):
        self.s3 = boto3.client("s3", endpoint_url=endpoint_url)

    def upload_dir(self, local: Path, uri: str) -> int:
        """Upload every file under `local` to `uri/<relative path>`; returns the file count.
        A `_COMPLETE` marker goes last, so a half-uploaded checkpoint is never taken for a whole one."""
        bucket, prefix = _split(uri)
        files = sorted(p for p in Path(local).rglob("*") if p.is_file())
        for p in files:
            self.s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local).as_posix()}")
        self.s3.put_object(Bucket=bucket, Key=f"{prefix}/_COMPLETE", Body=b"")
        return len(files)

    def download_dir(self, uri: str, local: Path) -> int:
        bucket, prefix = _split(uri)
        n = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) + 1 :]
                if rel == "_COMPLETE":
                    continue
                dest = Path(local) / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, obj["Key"], str(dest))
                n += 1
        return n

    def complete(self, uri: str) -> bool:
        bucket, prefix = _split(uri)
        resp = self.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_COMPLETE", MaxKeys=1)
        return resp.get("KeyCount", 0) > 0
