"""Job use cases: submit, read, act on. Services flush but never commit (the request does).

Every status change goes through `jobcore.jobs.lifecycle.transition`; waking a worker is
registered to run after the commit so a worker never looks for a row that is not there yet.
Whether a user's action applies, and what it does, is `jobcore.jobs.states.ACTIONS`'s to say.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Job, JobEvent, Project
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.locks import lock_project
from jobcore.jobs.states import (
    TERMINAL,
    InvalidTransition,
    JobAction,
    JobStatus,
    already_requested,
    check_action,
)
from jobcore.settings import Settings
from jobcore.trained_base import jobs_training_from
from server.auth.service import Principal
from server.common.pagination import split_page
from server.deps import after_commit
from server.errors import Conflict, InvalidRequest, NotFound, RateLimited, validation_error_of
from server.inference import plans
from server.jobs import repository
from server.jobs.present import present_jobs as present_jobs  # re-exported: the actions' view
from server.jobs.present import present_rows
from server.jobs.references import check_spec
from server.jobs.schemas import JobClone, JobCreate
from twinkle_core.spec import JobSpec, merge_spec

Dispatch = Callable[[str], None]
S = JobStatus
QUEUE_LIMIT_RETRY_SECONDS = 30


def request_hash(body: JobCreate | JobClone, clone_of: str | None = None) -> str:
    payload = body.model_dump(mode="json")
    if clone_of is not None:
        # A clone of another job with the same overrides is another request.
        payload = {"clone_of": clone_of, **payload}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def get_job(session: Session, principal: Principal, job_id: str) -> Job:
    job = repository.get_job(session, principal.project_id, job_id)
    if job is None:
        raise NotFound(f"no job '{job_id}' in this project", param="job_id")
    return job


def _check_queue_limit(session: Session, project_id: str) -> None:
    """Refuse a new queued job when the project is at `max_queued_jobs`.

    The count and the insert that follows must be one critical section, or two concurrent
    submits both count N-1 and both insert. So the project row is locked first, in the
    transaction that then inserts the job (the request's, committed after it), and a concurrent
    submit of the same project waits here until that commit and then counts the new job.
    Unlimited projects take no lock.
    """
    if session.scalar(select(Project.max_queued_jobs).where(Project.id == project_id)) is None:
        return
    lock_project(session, project_id)
    limit = session.scalar(select(Project.max_queued_jobs).where(Project.id == project_id))
    if limit is None:  # lifted in the meantime
        return
    waiting = repository.count_jobs(session, project_id, [S.QUEUED.value])
    if waiting >= limit:
        raise RateLimited(
            f"the project already has {waiting} queued jobs, its limit (max_queued_jobs = {limit}); "
            "submit again when one has started",
            retry_after=QUEUE_LIMIT_RETRY_SECONDS,
            code="project_queue_limit",
        )


def _insert_job(session: Session, principal: Principal, values: dict[str, Any], dispatch: Dispatch) -> Job:
    job = Job(project_id=principal.project_id, status=S.QUEUED.value, **values)
    session.add(job)
    session.flush()
    session.add(JobEvent(job_id=job.id, type="status", message="job queued", data={"to": S.QUEUED.value}))
    session.flush()
    job_id = job.id
    after_commit(session, lambda: dispatch(job_id))
    return job


def create_job(
    session: Session,
    settings: Settings,
    principal: Principal,
    body: JobCreate,
    dispatch: Dispatch,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Returns (job, created). With an idempotency key seen before, the earlier job (created=False)."""
    digest = request_hash(body)
    earlier = _earlier(session, principal, idempotency_key, digest)
    if earlier is not None:
        return earlier, False
    check_spec(body.spec, session, principal.project_id, settings)
    _check_queue_limit(session, principal.project_id)
    values = {
        "name": body.name,
        "spec": body.spec.model_dump(mode="json"),
        "priority": body.priority,
        "max_retries": body.max_retries,
        "timeout_seconds": body.timeout_seconds,
        "metadata_": body.metadata,
        "webhook_url": body.webhook_url or _default_webhook_url(session, principal.project_id),
        "idempotency_key": idempotency_key,
        "request_hash": digest,
    }
    return _insert_once(session, principal, values, dispatch)


def _default_webhook_url(session: Session, project_id: str) -> str | None:
    """The project's default webhook, copied onto the job: the job shows where it will report, and
    a later change of the default does not redirect jobs already submitted."""
    return session.scalar(select(Project.webhook_url).where(Project.id == project_id))


def _earlier(session: Session, principal: Principal, key: str | None, digest: str) -> Job | None:
    """The job an earlier request with this Idempotency-Key made (409 if its body differed)."""
    if key is None:
        return None
    earlier = repository.job_by_idempotency_key(session, principal.project_id, key)
    return None if earlier is None else _replay(earlier, digest)


def _insert_once(
    session: Session, principal: Principal, values: dict[str, Any], dispatch: Dispatch
) -> tuple[Job, bool]:
    key = values.get("idempotency_key")
    try:
        return _insert_job(session, principal, values, dispatch), True
    except IntegrityError:
        if key is None:
            raise
        # A concurrent request with the same key won the insert; nothing else was written yet,
        # so dropping this transaction loses nothing, and the winner's job is the answer.
        session.rollback()
        session.info.pop("after_commit", None)
        earlier = _earlier(session, principal, key, values["request_hash"])
        if earlier is None:
            raise
        return earlier, False


def _replay(earlier: Job, digest: str) -> Job:
    if earlier.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was already used with a different request body",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    return earlier


def _target(job: Job, action: JobAction) -> JobStatus:
    """Where `action` moves the job (ACTIONS' rule), or InvalidTransition (a 409)."""
    target = check_action(job.status, action)
    assert target is not None, f"{action} changes the job's status"
    return target


# How many times a pause or cancel is decided again when a worker moved the job between the
# request's read and its write (queued -> starting, starting -> running). Each try reads the status
# that beat it, and the worker moves a job a few steps at most, so three is plenty; a job still
# moving after that gets the 409 naming where it is.
ACTION_TRIES = 3


def cancel_job(session: Session, principal: Principal, job_id: str) -> Job:
    # Nothing runs yet (or any more): cancelled at once. Otherwise the worker stops the processes.
    return _ask(session, get_job(session, principal, job_id), JobAction.CANCEL)


def pause_job(session: Session, principal: Principal, job_id: str) -> Job:
    return _ask(session, get_job(session, principal, job_id), JobAction.PAUSE)


def _ask(session: Session, job: Job, action: JobAction) -> Job:
    """Apply a pause or cancel to the job's status as the database has it when the write lands.

    A worker's own step in between (a Slurm job seen running, a claim) changes which status the
    action moves the job to, not whether the user may ask: starting and running both accept a
    cancel, so a cancel sent while the worker marks the run started must not answer 409.
    """
    tries_left = ACTION_TRIES
    while True:
        if already_requested(job.status, action):
            return job
        target = _target(job, action)  # the 409 when the status found no longer takes the action
        try:
            return transition(session, job, target, action=action.value, message=f"{action.value} requested")
        except InvalidTransition:
            tries_left -= 1
            if not tries_left:
                raise
            # `transition` read the job again: decide from the status that beat this request.


def resume_job(
    session: Session, principal: Principal, job_id: str, checkpoint_id: str | None, dispatch: Dispatch
) -> Job:
    job = get_job(session, principal, job_id)
    # retrying -> queued is the worker's path, not a user's resume.
    target = _target(job, JobAction.RESUME)
    _check_queue_limit(session, principal.project_id)  # a resumed job joins the queue as well
    checkpoints = repository.live_checkpoints(session, [job.id])
    chosen: Checkpoint | None
    if checkpoint_id is not None:
        chosen = next((c for c in checkpoints if c.id == checkpoint_id), None)
        if chosen is None:
            raise NotFound(f"no checkpoint '{checkpoint_id}' of job '{job.id}'", param="checkpoint")
    else:
        chosen = checkpoints[-1] if checkpoints else None
    message = f"resume from checkpoint {chosen.id} (step {chosen.step})" if chosen else "resume from scratch"
    # Resuming a failed or cancelled job is a new attempt: fresh retry and time budgets. A paused
    # job is the same run going on, so it keeps what it has spent.
    fresh = job.status in TERMINAL
    budgets: dict[str, Any] = {"failed_attempts": 0, "run_seconds": 0.0} if fresh else {}
    job = transition(
        session,
        job,
        target,
        action="resume",
        message=message,
        resume_from=chosen.path if chosen else None,
        error=None,
        finished_at=None,
        **budgets,
    )
    job_key = job.id
    after_commit(session, lambda: dispatch(job_key))
    return job


def clone_job(
    session: Session,
    settings: Settings,
    principal: Principal,
    job_id: str,
    body: JobClone,
    dispatch: Dispatch,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Returns (job, created), like `create_job`: a retried clone with its key makes one job."""
    digest = request_hash(body, clone_of=job_id)
    earlier = _earlier(session, principal, idempotency_key, digest)
    if earlier is not None:
        return earlier, False
    source = get_job(session, principal, job_id)
    check_action(source.status, JobAction.CLONE)
    merged = merge_spec(source.spec, body.spec)
    try:
        spec = JobSpec.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        param, message = validation_error_of({**first, "loc": ("spec", *first["loc"])})
        raise InvalidRequest(message, param=param) from exc
    check_spec(spec, session, principal.project_id, settings)
    _check_queue_limit(session, principal.project_id)

    def pick(value: Any, fallback: Any) -> Any:
        return fallback if value is None else value

    values = {
        "name": pick(body.name, source.name),
        "spec": spec.model_dump(mode="json"),
        "priority": pick(body.priority, source.priority),
        "max_retries": pick(body.max_retries, source.max_retries),
        "timeout_seconds": pick(body.timeout_seconds, source.timeout_seconds),
        "metadata_": pick(body.metadata, source.metadata_),
        "webhook_url": pick(body.webhook_url, source.webhook_url),
        "idempotency_key": idempotency_key,
        "request_hash": digest,
    }
    job, created = _insert_once(session, principal, values, dispatch)
    if created:
        session.add(JobEvent(job_id=job.id, type="message", message=f"cloned from {source.id}"))
        session.flush()
    return job, created


def job_dir(settings: Settings, job: Job) -> Path:
    return Path(job.job_dir) if job.job_dir else settings.jobs_dir / job.id


def remove_under_data_dir(settings: Settings, path: Path) -> None:
    """Delete a job's artifacts, but never anything outside the service's data dir."""
    real = Path(os.path.realpath(path))
    if real != settings.data_dir and real.is_relative_to(settings.data_dir):
        if real.is_dir():
            shutil.rmtree(real, ignore_errors=True)
        elif real.exists():
            real.unlink(missing_ok=True)


def delete_job(session: Session, settings: Settings, principal: Principal, job_id: str) -> None:
    job = get_job(session, principal, job_id)
    try:
        check_action(job.status, JobAction.DELETE)
    except InvalidTransition as exc:
        hint = "cancel it first (only a job whose run ended is deleted)"
        raise Conflict(f"{exc}; {hint}", code="invalid_state") from exc
    users = jobs_training_from(session, principal.project_id, job.id)
    if users:
        names = ", ".join(f"{j.id} ({j.status})" for j in users[:5])
        raise Conflict(f"jobs still to train from this job's model: {names}", code="model_in_use")
    artifacts = [job_dir(settings, job)]
    artifacts += [
        settings.archives_dir / f"{c.id}.tar" for c in repository.live_checkpoints(session, [job.id])
    ]
    # Events, metrics and checkpoints go with the row (ON DELETE CASCADE).
    session.delete(job)
    session.flush()
    plans.forget_models(session)  # its model stops resolving in this process at once

    def remove_artifacts() -> None:
        for path in artifacts:
            remove_under_data_dir(settings, path)

    after_commit(session, remove_artifacts)


# ------------------------------------------------------------------------------- reads


def read_job(db: repository.Db, principal: Principal, job_id: str) -> dict[str, Any]:
    """GET of one job, as `JobOut` serializes it: the job and its checkpoints in one statement
    (two more only for a queued or running job: its queue place, its pace)."""
    row = repository.read_job_row(db, principal.project_id, job_id)
    if row is None:
        raise NotFound(f"no job '{job_id}' in this project", param="job_id")
    return present_rows(db, [row])[0]


def _cursor(db: repository.Db, principal: Principal, after: str | None) -> tuple[datetime, str] | None:
    if after is None:
        return None
    cursor = repository.job_cursor(db, principal.project_id, after)
    if cursor is None:
        raise InvalidRequest(f"after: no job '{after}' in this project", param="after")
    return cursor


def list_jobs(
    session: Session,
    principal: Principal,
    *,
    statuses: list[str],
    name: str | None,
    metadata: dict[str, str],
    after: str | None,
    limit: int,
) -> tuple[list[Job], bool]:
    """A page of ORM jobs, for callers that present them their own way (the OpenAI mapping)."""
    jobs = repository.list_jobs(
        session,
        principal.project_id,
        statuses=statuses,
        name=name,
        metadata=metadata,
        after=_cursor(session, principal, after),
        limit=limit,
    )
    return split_page(jobs, limit)


def read_jobs(
    db: repository.Db,
    principal: Principal,
    *,
    statuses: list[str],
    name: str | None,
    metadata: dict[str, str],
    after: str | None,
    limit: int,
    expand_spec: bool = False,
) -> tuple[list[dict[str, Any]], bool]:
    """A presented page of jobs: one statement for the jobs and their checkpoints, plus at most
    one for queue places and one for the pace of running jobs (and one for an `after` cursor).
    The spec only with `expand_spec`: decoding and re-encoding it was most of a page's CPU."""
    rows = repository.list_job_rows(
        db,
        principal.project_id,
        statuses=statuses,
        name=name,
        metadata=metadata,
        after=_cursor(db, principal, after),
        limit=limit,
        with_spec=expand_spec,
    )
    page, has_more = split_page(rows, limit)
    return present_rows(db, page), has_more
