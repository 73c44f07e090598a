"""SQL access for checkpoints (the caller has already checked the job belongs to its project)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint


def get_checkpoint(session: Session, job_id: str, checkpoint_id: str) -> Checkpoint | None:
    query = select(Checkpoint).where(
        Checkpoint.id == checkpoint_id, Checkpoint.job_id == job_id, Checkpoint.deleted.is_(False)
    )
    return session.scalars(query).one_or_none()


def list_checkpoints(
    session: Session, job_id: str, *, before_step: int | None, limit: int
) -> list[Checkpoint]:
    """Newest (highest step) first; steps are unique per job, so the step is the cursor."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.deleted.is_(False))
    if before_step is not None:
        query = query.where(Checkpoint.step < before_step)
    return list(session.scalars(query.order_by(Checkpoint.step.desc()).limit(limit + 1)))
