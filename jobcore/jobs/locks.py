"""The project lock: one critical section for counting a project's jobs and adding one."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobcore.db.models import Project


def lock_project(session: Session, project_id: str, *, skip_locked: bool = False) -> bool:
    """Hold the project row until the transaction ends, so that counting the project's jobs and
    adding one (a submit under `max_queued_jobs`, a claim under `max_running_jobs`) is one
    critical section. Returns False only with `skip_locked`, when another transaction holds it.

    PostgreSQL: `FOR NO KEY UPDATE` (waits for another holder, or skips it; does not block inserts
    of rows that merely reference the project). SQLite has no row locks and starts a transaction
    only at the first write: a no-op UPDATE takes its one write lock now, before the count, so the
    count sees every job committed before it and none can be committed until this one ends.
    """
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Project)
            .where(Project.id == project_id)
            .values(max_queued_jobs=Project.max_queued_jobs)
            .execution_options(synchronize_session=False)
        )
        return True
    lock = (
        select(Project.id)
        .where(Project.id == project_id)
        .with_for_update(key_share=True, skip_locked=skip_locked)
    )
    return session.scalar(lock) is not None
