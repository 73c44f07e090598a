"""Atomic claim of the next queued job: SQL is the queue, the broker only wakes workers.

The claim is a compare-and-set through `transition` (`UPDATE ... WHERE status='queued'`); on
PostgreSQL the candidate rows are also locked with `FOR UPDATE SKIP LOCKED` so that racing workers
skip each other's candidates instead of queueing behind them. A duplicated or redelivered wake-up
finds nothing to claim and does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobcore.db.models import Job, Project, utcnow
from jobcore.jobs.engine import ENGINES
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.locks import lock_project
from jobcore.jobs.spec import resources_of
from jobcore.jobs.states import ACTIVE, InvalidTransition, JobStatus

# How many queued jobs one claim looks at; enough to step over a few that do not fit.
CANDIDATES = 32


def claim_next_job(
    session: Session,
    worker_id: str,
    fits: Callable[[int], bool],
    launchers: Collection[str] = ("torchrun",),
) -> Job | None:
    """Claim the highest-priority queued job (ties: oldest) for which `fits(nproc)` holds and
    whose `resources.launcher` this worker has (a worker without a Ray address skips Ray jobs,
    which wait for one that has it). A job handed to a cluster engine (Ray) needs no room here:
    the engine places it.

    Sets status `starting`, `worker_id`, `attempt + 1` and a fresh heartbeat. The caller commits.
    """
    candidates = session.execute(
        select(Job.id, Job.spec, Job.project_id)
        .where(Job.status == JobStatus.QUEUED.value)
        .order_by(Job.priority.desc(), Job.created_at, Job.id)
        .limit(CANDIDATES)
    ).all()
    postgres = session.get_bind().dialect.name == "postgresql"
    unavailable: set[str] = set()  # projects at their running limit, or being claimed from
    for job_id, spec, project_id in candidates:
        resources = resources_of(spec)
        if (
            project_id in unavailable
            or resources.launcher not in launchers
            or (resources.launcher not in ENGINES and not fits(resources.nproc_per_node))
        ):
            continue
        if not _room_in_project(session, project_id):
            unavailable.add(project_id)
            continue
        lock = select(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value)
        if postgres:
            # Lock this one row only: a racing worker skips it and takes the next candidate in
            # priority order instead of waiting, and never jumps a whole batch of locked rows.
            lock = lock.with_for_update(skip_locked=True)
        job = session.scalars(lock.execution_options(populate_existing=True)).first()
        if job is None:
            continue  # claimed (or being claimed) by another worker
        now = utcnow()
        try:
            return transition(
                session,
                job,
                JobStatus.STARTING,
                message=f"claimed by worker {worker_id} (attempt {job.attempt + 1})",
                worker_id=worker_id,
                attempt=job.attempt + 1,
                started_at=job.started_at or now,
                heartbeat_at=now,
                pids=None,
                gpu_ids=None,
            )
        except InvalidTransition:
            continue  # another worker won this one (SQLite: the compare-and-set decides)
    return None


def _room_in_project(session: Session, project_id: str) -> bool:
    """Whether the project may start one more job (`max_running_jobs`).

    The count and the claim that follows are one decision: a limited project's row is locked
    first, so racing workers cannot each see the same free place. A worker finding the row held
    by another claim (or a submit) skips the project for now instead of waiting: it takes other
    work, and waiting while holding another project's lock could deadlock with a worker that
    visits the two in the other order. The next poll or wake-up comes back to it.
    """
    limit = session.scalar(select(Project.max_running_jobs).where(Project.id == project_id))
    if limit is None:
        return True
    if not lock_project(session, project_id, skip_locked=True):
        return False
    limit = session.scalar(select(Project.max_running_jobs).where(Project.id == project_id))
    if limit is None:  # lifted in the meantime
        return True
    running = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.project_id == project_id, Job.status.in_([s.value for s in ACTIVE]))
    )
    return (running or 0) < limit
