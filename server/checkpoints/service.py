"""Checkpoint use cases: list, and package one as a tar archive for download.

The archive is built once into `<data_dir>/archives/<checkpoint id>.tar` (checkpoints never
change after their completion marker) and then served from disk, which gives HTTP Range
requests, so an interrupted multi-GB download resumes instead of starting over. It is left
uncompressed: weights barely compress and gzip would cost minutes of CPU per download.
A checkpoint in object storage (`s3://` location) is archived the same way, each object streamed
from the store into the tar without a local copy of the checkpoint.
"""

from __future__ import annotations

import os
import tarfile
import uuid
from pathlib import Path

from sqlalchemy.orm import Session

from jobcore import storage
from jobcore.db.models import Checkpoint
from jobcore.settings import Settings
from server.auth.principal import Principal
from server.checkpoints import repository
from server.checkpoints.schemas import CheckpointOut
from server.common.pagination import split_page
from server.errors import InvalidRequest, NotFound
from server.jobs import service as jobs
from twinkle_core.checkpoint import COMPLETE_MARKER


def present(checkpoint: Checkpoint) -> CheckpointOut:
    return CheckpointOut(
        id=checkpoint.id,
        job_id=checkpoint.job_id,
        step=checkpoint.step,
        metrics=checkpoint.metrics,
        size_bytes=checkpoint.size_bytes,
        is_best=checkpoint.is_best,
        created_at=checkpoint.created_at,
    )


def list_checkpoints(
    session: Session, principal: Principal, job_id: str, *, after: str | None, limit: int
) -> tuple[list[Checkpoint], bool]:
    job = jobs.get_job(session, principal, job_id)
    before_step = None
    if after is not None:
        anchor = repository.get_checkpoint(session, job.id, after)
        if anchor is None:
            raise InvalidRequest(f"after: no checkpoint '{after}' of this job", param="after")
        before_step = anchor.step
    return split_page(
        repository.list_checkpoints(session, job.id, before_step=before_step, limit=limit), limit
    )


def get_checkpoint(session: Session, principal: Principal, job_id: str, checkpoint_id: str) -> Checkpoint:
    job = jobs.get_job(session, principal, job_id)
    checkpoint = repository.get_checkpoint(session, job.id, checkpoint_id)
    if checkpoint is None:
        raise NotFound(f"no checkpoint '{checkpoint_id}' of job '{job_id}'", param="checkpoint_id")
    return checkpoint


def archive_name(checkpoint: Checkpoint) -> str:
    return f"{checkpoint.job_id}-step-{checkpoint.step}.tar"


def checkpoint_archive(settings: Settings, checkpoint: Checkpoint) -> Path:
    """The tar of the checkpoint directory (or objects), built on first request."""
    remote = storage.is_remote(checkpoint.path)
    source = Path(os.path.realpath(checkpoint.path)) if not remote else None
    if source is not None and (not source.is_relative_to(settings.data_dir) or not source.is_dir()):
        raise NotFound(f"the files of checkpoint '{checkpoint.id}' are no longer on disk")
    archives = settings.archives_dir
    archives.mkdir(parents=True, exist_ok=True)
    target = archives / f"{checkpoint.id}.tar"
    if target.is_file():
        return target
    partial = archives / f".{checkpoint.id}.{uuid.uuid4().hex}.partial"
    root = archive_name(checkpoint).removesuffix(".tar")
    try:
        with tarfile.open(partial, "w") as tar:
            if source is not None:
                _add_directory(tar, source, root)
            else:
                _add_objects(tar, settings, checkpoint, root)
        os.replace(partial, target)  # two concurrent first downloads both produce the same archive
    finally:
        partial.unlink(missing_ok=True)
    return target


def _add_directory(tar: tarfile.TarFile, source: Path, root: str) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_symlink():  # never follow a link out of the checkpoint
            continue
        tar.add(path, arcname=f"{root}/{path.relative_to(source).as_posix()}", recursive=False)


def _add_objects(tar: tarfile.TarFile, settings: Settings, checkpoint: Checkpoint, root: str) -> None:
    store = storage.store_for(checkpoint.path, settings)
    files = store.list_files(checkpoint.path)
    if not any(f.relative == COMPLETE_MARKER for f in files):
        raise NotFound(f"the objects of checkpoint '{checkpoint.id}' are no longer in storage")
    for stored in files:
        relative = Path(stored.relative)
        if relative.is_absolute() or ".." in relative.parts:  # a hostile key never escapes the root
            continue
        info = tarfile.TarInfo(f"{root}/{relative.as_posix()}")
        info.size = stored.size
        info.mode = 0o644
        body = store.open(checkpoint.path, stored.relative)
        try:
            tar.addfile(info, body)
        finally:
            body.close()
