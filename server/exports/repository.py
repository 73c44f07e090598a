"""SQL access for exports (the caller has already checked the job belongs to its project)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Export, Job
from server.common.pagination import newest_first_after


def checkpoint_by_step(session: Session, job_id: str, step: int) -> Checkpoint | None:
    query = select(Checkpoint).where(
        Checkpoint.job_id == job_id, Checkpoint.step == step, Checkpoint.deleted.is_(False)
    )
    return session.scalars(query).one_or_none()


def export_of(session: Session, checkpoint_id: str, kind: str) -> Export | None:
    query = select(Export).where(Export.checkpoint_id == checkpoint_id, Export.kind == kind)
    return session.scalars(query).one_or_none()


def get_export(session: Session, project_id: str, export_id: str) -> Export | None:
    """The export if its job belongs to the project (another project's is as good as absent)."""
    query = (
        select(Export)
        .join(Job, Job.id == Export.job_id)
        .where(Export.id == export_id, Job.project_id == project_id)
    )
    return session.scalars(query).one_or_none()


def list_exports(
    session: Session, job_id: str, *, after: tuple[datetime, str] | None, limit: int
) -> list[Export]:
    query = select(Export).where(Export.job_id == job_id)
    return list(session.scalars(newest_first_after(query, Export.created_at, Export.id, after, limit)))
