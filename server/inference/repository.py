"""SQL reads of the inference endpoints: which checkpoint a name means, what a project can call.
Every query is scoped to the caller's project."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Job
from jobcore.jobs.states import JobStatus

# The job's `model.model_id`, read inside the database (both SQLite and PostgreSQL index JSON).
_job_model_id = Job.spec[("model", "model_id")].as_string()


def job_in_project(session: Session, project_id: str, job_id: str) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id, Job.project_id == project_id)).one_or_none()


@dataclass(frozen=True)
class JobCheckpoint:
    """What serving a job's checkpoint needs of the job, and of one of its live checkpoints (step
    and path None: the job has no such checkpoint)."""

    id: str
    name: str | None
    status: str
    spec: dict[str, Any] | None
    step: int | None
    path: str | None


def job_with_checkpoint(
    session: Session, project_id: str, job_id: str, step: int | None
) -> JobCheckpoint | None:
    """The job of the project and its live checkpoint at `step` (None: its newest), in one
    statement and without whole rows: on every inference request's way to its first token."""
    live = and_(Checkpoint.job_id == Job.id, Checkpoint.deleted.is_(False))
    if step is not None:
        live = and_(live, Checkpoint.step == step)
    query = (
        select(Job.id, Job.name, Job.status, Job.spec, Checkpoint.step, Checkpoint.path)
        .select_from(Job)
        .outerjoin(Checkpoint, live)
        .where(Job.id == job_id, Job.project_id == project_id)
        .order_by(Checkpoint.step.desc())  # no checkpoint: the one row, its step NULL
        .limit(1)
    )
    row = session.execute(query).one_or_none()
    return JobCheckpoint(*row) if row is not None else None


def checkpoint_at_path(session: Session, project_id: str, path: str) -> tuple[Job, Checkpoint] | None:
    """A live checkpoint of the project by its directory: what `fine_tuned_model` used to be."""
    query = (
        select(Job, Checkpoint)
        .join(Checkpoint, Checkpoint.job_id == Job.id)
        .where(Job.project_id == project_id, Checkpoint.path == path, Checkpoint.deleted.is_(False))
        .limit(1)
    )
    row = session.execute(query).one_or_none()
    return (row[0], row[1]) if row else None


@dataclass(frozen=True)
class FineTunedRow:
    job_id: str
    name: str | None
    model_id: str
    finished_at: datetime | None
    created_at: datetime


def fine_tuned_models(session: Session, project_id: str) -> list[FineTunedRow]:
    """Every succeeded job of the project that has a checkpoint to serve, newest first."""
    has_checkpoint = exists().where(Checkpoint.job_id == Job.id, Checkpoint.deleted.is_(False))
    query = (
        select(Job.id, Job.name, _job_model_id, Job.finished_at, Job.created_at)
        .where(Job.project_id == project_id, Job.status == JobStatus.SUCCEEDED, has_checkpoint)
        .order_by(Job.created_at.desc(), Job.id.desc())
    )
    return [FineTunedRow(*row) for row in session.execute(query)]


def base_models(session: Session, project_id: str) -> list[tuple[str, datetime]]:
    """Each `model_id` the project's jobs train, with when it was first used, oldest first."""
    first_used = func.min(Job.created_at)
    query = (
        select(_job_model_id, first_used)
        .where(Job.project_id == project_id, _job_model_id.is_not(None))
        .group_by(_job_model_id)
        .order_by(first_used)
    )
    return [(str(model_id), created) for model_id, created in session.execute(query)]


def model_in_use(session: Session, project_id: str, model_id: str) -> bool:
    query = select(Job.id).where(Job.project_id == project_id, _job_model_id == model_id).limit(1)
    return session.execute(query).first() is not None
