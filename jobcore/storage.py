"""Where checkpoints live: the data dir (a local or shared file system, the default) or an
S3-compatible object store configured by URL (`TWINKLE_ARTIFACT_URL=s3://bucket/prefix`,
`TWINKLE_S3_ENDPOINT_URL` for MinIO/Ceph/moto, credentials from the usual AWS variables).

Runners always write checkpoints to the job dir. With an object store the worker uploads a
checkpoint after its COMPLETE marker exists and records the `s3://` location; the marker object is
uploaded last, so a listing of a half-uploaded checkpoint never looks complete. Resume downloads
the chosen checkpoint back into the job dir (marker last again) before torchrun starts.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobcore.settings import Settings
from twinkle_core.checkpoint import CHECKPOINTS_DIR, COMPLETE_MARKER, is_complete

S3_SCHEME = "s3://"


def is_remote(location: str | None) -> bool:
    return bool(location) and str(location).startswith(S3_SCHEME)


def split_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); ValueError naming the setting."""
    if not url.startswith(S3_SCHEME) or not url[len(S3_SCHEME) :].split("/", 1)[0]:
        raise ValueError(f"TWINKLE_ARTIFACT_URL: expected s3://bucket[/prefix], got '{url}'")
    bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class StoredFile:
    relative: str
    size: int


class S3Store:
    """Checkpoints as objects under `<prefix>/jobs/<job id>/checkpoints/<step-N>/<file>`."""

    def __init__(self, url: str, endpoint_url: str | None = None) -> None:
        import boto3  # imported here: deployments on a file system never need it

        self.bucket, self.prefix = split_s3_url(url)
        self.client: Any = boto3.client("s3", endpoint_url=endpoint_url)

    def location(self, job_id: str, name: str) -> str:
        key = "/".join(p for p in (self.prefix, "jobs", job_id, "checkpoints", name) if p)
        return f"{S3_SCHEME}{self.bucket}/{key}"

    def _key_prefix(self, location: str) -> str:
        bucket, key = split_s3_url(location)
        if bucket != self.bucket:
            raise ValueError(f"checkpoint location '{location}' is not in bucket '{self.bucket}'")
        return key + "/"

    def upload_checkpoint(self, job_id: str, local_dir: Path) -> str:
        """Upload a complete checkpoint directory; returns its `s3://` location."""
        location = self.location(job_id, local_dir.name)
        key = self._key_prefix(location)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file() and not p.is_symlink())
        # The marker goes last: a reader that sees it sees every other object too.
        files.sort(key=lambda p: p.name == COMPLETE_MARKER)
        for path in files:
            self.client.upload_file(str(path), self.bucket, key + path.relative_to(local_dir).as_posix())
        return location

    def list_files(self, location: str) -> list[StoredFile]:
        key = self._key_prefix(location)
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=key):
            for obj in page.get("Contents", []):
                found.append(StoredFile(obj["Key"][len(key) :], int(obj["Size"])))
        return sorted(found, key=lambda f: f.relative)

    def is_complete(self, location: str) -> bool:
        return any(f.relative == COMPLETE_MARKER for f in self.list_files(location))

    def open(self, location: str, relative: str) -> IO[bytes]:
        """A streaming reader of one object (not read into memory)."""
        body = self.client.get_object(Bucket=self.bucket, Key=self._key_prefix(location) + relative)["Body"]
        return body

    def download(self, location: str, target: Path) -> Path:
        """Fetch a complete checkpoint into `target` (replacing it); the marker is written last."""
        files = self.list_files(location)
        if not any(f.relative == COMPLETE_MARKER for f in files):
            raise FileNotFoundError(f"checkpoint {location} is incomplete or gone")
        partial = target.parent / f".download-{target.name}-{uuid.uuid4().hex[:8]}"
        key = self._key_prefix(location)
        try:
            for stored in sorted(files, key=lambda f: f.relative == COMPLETE_MARKER):
                dest = partial / stored.relative
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, key + stored.relative, str(dest))
            if target.exists():
                shutil.rmtree(target)
            os.replace(partial, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return target

    def delete(self, location: str) -> None:
        keys = [{"Key": self._key_prefix(location) + f.relative} for f in self.list_files(location)]
        for start in range(0, len(keys), 1000):  # the API's batch limit
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[start : start + 1000]})


def artifact_store(settings: Settings) -> S3Store | None:
    """The configured object store, or None for checkpoints on the (shared) file system."""
    if not settings.artifact_url:
        return None
    return S3Store(settings.artifact_url, settings.s3_endpoint_url)


def store_for(location: str, settings: Settings) -> S3Store:
    """A client for the bucket a recorded location names (it may predate the current setting)."""
    bucket, _ = split_s3_url(location)
    return S3Store(f"{S3_SCHEME}{bucket}", settings.s3_endpoint_url)


def local_copy(location: str, job_dir: Path, store: S3Store | None, settings: Settings) -> Path:
    """A checkpoint of object storage as `<job_dir>/checkpoints/step-N` on this host: downloaded
    (marker last) unless a complete copy is already there. A resuming worker (node 0 and the other
    nodes of a gang), an export and a serving host all read a stored checkpoint through it."""
    target = job_dir / CHECKPOINTS_DIR / location.rstrip("/").rsplit("/", 1)[-1]
    if not is_complete(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        (store or store_for(location, settings)).download(location, target)
    return target
