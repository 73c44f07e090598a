"""Export use cases: request an export of a checkpoint, read and list exports, package one.

An export is made by a worker (GPU/CPU work, never the API process's): the request inserts a
`pending` row and, after the commit, sends the broker's `worker.export` task. It is idempotent
per (checkpoint, kind): asking again answers with the export already there, and a failed one is
queued again. The folder is served like a checkpoint download: a tar built once next to the
folder (`<job dir>/exports/<export id>.tar`, so deleting the job deletes it), then sent from disk
with HTTP Range support.
"""

from __future__ import annotations

import os
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore import storage
from jobcore.db.models import Checkpoint, Export, Job
from jobcore.jobs.spec import job_spec
from jobcore.settings import Settings
from server.auth.principal import Principal
from server.common.pagination import split_page
from server.deps import after_commit
from server.errors import Conflict, InvalidRequest, NotFound
from server.exports import repository
from server.exports.schemas import ExportOut
from server.jobs import service as jobs
from twinkle_core.checkpoint import is_complete

ExportDispatch = Callable[[str], None]


def present(export: Export) -> ExportOut:
    return ExportOut(
        id=export.id,
        job_id=export.job_id,
        checkpoint_id=export.checkpoint_id,
        step=export.step,
        kind=export.kind,
        merged=export.kind == "merged",
        status=export.status,
        error=export.error,
        size_bytes=export.size_bytes,
        created_at=export.created_at,
        started_at=export.started_at,
        finished_at=export.finished_at,
    )


def request_export(
    session: Session,
    settings: Settings,
    principal: Principal,
    job_id: str,
    step: int,
    merge: bool | None,
    dispatch: ExportDispatch,
) -> tuple[Export, bool]:
    """The export of the job's checkpoint at `step`; True when it was (re)queued by this call."""
    job = jobs.get_job(session, principal, job_id)
    checkpoint = repository.checkpoint_by_step(session, job.id, step)
    if checkpoint is None:
        raise NotFound(f"no checkpoint at step {step} of job '{job_id}'", param="step")
    _check_complete(settings, checkpoint)
    kind = export_kind(job, merge)
    export = repository.export_of(session, checkpoint.id, kind)
    if export is not None and export.status != "failed":
        return export, False
    if export is not None:  # failed before: try again, from scratch
        export.status, export.error, export.worker_id = "pending", None, None
        export.started_at = export.finished_at = export.heartbeat_at = None
    else:
        export, inserted = _insert(session, job, checkpoint, kind)
        if not inserted:  # a concurrent request inserted it first and dispatches it
            return export, False
    session.flush()
    export_id = export.id
    after_commit(session, lambda: dispatch(export_id))
    return export, True


def export_kind(job: Job, merge: bool | None) -> str:
    """What `merge` means for this job: LoRA merged (default) or alone; a full model as it is."""
    spec = job_spec(job.spec)
    if spec.adapter is None:
        if merge is False:
            raise InvalidRequest(
                f"merge: job '{job.id}' fine-tuned the full model; there is no adapter to export alone",
                param="merge",
            )
        return "full"
    if merge is False:
        return "adapter"
    if spec.model.model_id is None:
        raise InvalidRequest(
            f"merge: job '{job.id}' built its base model from a config alone (no model_id): there are "
            "no base weights to merge into; export the adapter alone with merge=false",
            param="merge",
        )
    return "merged"


def _check_complete(settings: Settings, checkpoint: Checkpoint) -> None:
    if storage.is_remote(checkpoint.path):
        return  # uploaded after its marker (jobcore.storage); the worker fetches it
    source = Path(os.path.realpath(checkpoint.path))
    if not source.is_relative_to(settings.data_dir) or not source.is_dir():
        raise NotFound(f"the files of checkpoint '{checkpoint.id}' are no longer on disk", param="step")
    if not is_complete(source):
        raise Conflict(
            f"checkpoint at step {checkpoint.step} is incomplete (no COMPLETE marker): it is being "
            "written or removed",
            code="checkpoint_incomplete",
            param="step",
        )


def _insert(session: Session, job: Job, checkpoint: Checkpoint, kind: str) -> tuple[Export, bool]:
    export = Export(job_id=job.id, checkpoint_id=checkpoint.id, step=checkpoint.step, kind=kind)
    try:
        with session.begin_nested():
            session.add(export)
    except IntegrityError:  # uq_exports_checkpoint_kind: the other request's row is the export
        existing = repository.export_of(session, checkpoint.id, kind)
        assert existing is not None
        return existing, False
    return export, True


def get_export(session: Session, principal: Principal, export_id: str) -> Export:
    export = repository.get_export(session, principal.project_id, export_id)
    if export is None:
        raise NotFound(f"no export '{export_id}' in this project", param="export_id")
    return export


def list_exports(
    session: Session, principal: Principal, job_id: str, *, after: str | None, limit: int
) -> tuple[list[Export], bool]:
    job = jobs.get_job(session, principal, job_id)
    cursor = None
    if after is not None:
        anchor = repository.get_export(session, principal.project_id, after)
        if anchor is None or anchor.job_id != job.id:
            raise InvalidRequest(f"after: no export '{after}' of this job", param="after")
        cursor = (anchor.created_at, anchor.id)
    return split_page(repository.list_exports(session, job.id, after=cursor, limit=limit), limit)


def archive_name(export: Export) -> str:
    return f"{export.job_id}-step-{export.step}-{export.kind}.tar"


def export_archive(settings: Settings, export: Export) -> Path:
    """The tar of the exported folder, built on the first download (an export never changes)."""
    if export.status != "succeeded" or export.path is None:
        raise Conflict(
            f"export '{export.id}' is {export.status}"
            + (f": {export.error}" if export.error else "; download it once it has succeeded"),
            code="export_not_ready",
        )
    source = Path(os.path.realpath(export.path))
    if not source.is_relative_to(settings.data_dir) or not source.is_dir():
        raise NotFound(f"the files of export '{export.id}' are no longer on disk")
    target = source.parent / f"{source.name}.tar"
    if target.is_file():
        return target
    partial = source.parent / f".{source.name}.{uuid.uuid4().hex}.partial"
    root = archive_name(export).removesuffix(".tar")
    try:
        with tarfile.open(partial, "w") as tar:
            for path in sorted(source.rglob("*")):
                if path.is_symlink():  # never follow a link out of the export
                    continue
                tar.add(path, arcname=f"{root}/{path.relative_to(source).as_posix()}", recursive=False)
        os.replace(partial, target)  # two concurrent first downloads both produce the same archive
    finally:
        partial.unlink(missing_ok=True)
    return target
