"""Retention: directories of deleted jobs are removed, and each job's disk usage is reported.

`save_total_limit` itself is enforced as checkpoints arrive (see `worker.ingest`); this sweep
catches what happens outside a running job: a job row deleted through the API leaves its
directory (checkpoints, logs) behind, and a finished job's disk usage changes when files go.
"""

from __future__ import annotations

import logging
import shutil
import time

from sqlalchemy import select, update

from jobcore.db.models import Job
from jobcore.db.session import session_scope
from jobcore.jobs.states import ACTIVE
from jobcore.settings import Settings
from worker.checkpoints import dir_size

log = logging.getLogger(__name__)

# A directory younger than this may belong to a job whose row this sweep cannot see yet.
MIN_AGE_SECONDS = 60.0


def sweep_deleted_jobs(settings: Settings, min_age_seconds: float = MIN_AGE_SECONDS) -> list[str]:
    """Remove job directories whose job row no longer exists; returns the removed job ids."""
    root = settings.jobs_dir
    if not root.is_dir():
        return []
    on_disk = {p.name: p for p in root.iterdir() if p.is_dir() and p.name.startswith("job-")}
    if not on_disk:
        return []
    with session_scope(settings.resolved_database_url) as session:
        known = set(session.scalars(select(Job.id).where(Job.id.in_(list(on_disk)))).all())
    removed = []
    now = time.time()
    for job_id, path in on_disk.items():
        if job_id in known or now - path.stat().st_mtime < min_age_seconds:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(job_id)
        log.info("retention: removed the directory of deleted job %s", job_id)
    return removed


def refresh_disk_usage(settings: Settings, limit: int = 200) -> int:
    """Record the disk usage of active jobs (finished jobs are measured when they finish)."""
    with session_scope(settings.resolved_database_url) as session:
        ids = session.scalars(
            select(Job.id).where(Job.status.in_([s.value for s in ACTIVE])).limit(limit)
        ).all()
    sizes = {job_id: dir_size(settings.jobs_dir / job_id) for job_id in ids}
    with session_scope(settings.resolved_database_url) as session:
        for job_id, size in sizes.items():
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(disk_bytes=size)
                .execution_options(synchronize_session=False)
            )
    return len(sizes)
