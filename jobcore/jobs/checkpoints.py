"""Reads of checkpoint rows that the server and the worker share."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint


def live_checkpoint(session: Session, job_id: str, step: int | None) -> Checkpoint | None:
    """The job's checkpoint at `step`, or its newest (None: the job's final model). Rows exist only
    for complete checkpoints (the worker records one after its COMPLETE marker), and a checkpoint
    dropped by retention is `deleted`."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.deleted.is_(False))
    if step is not None:
        query = query.where(Checkpoint.step == step)
    return session.scalars(query.order_by(Checkpoint.step.desc()).limit(1)).one_or_none()
