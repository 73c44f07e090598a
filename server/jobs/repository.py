"""SQL queries of the job API. Every read of a job is scoped to the caller's project."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, or_, select, union_all
from sqlalchemy.orm import Session, aliased

from jobcore.db.models import Checkpoint, Job, JobEvent, JobMetric
from jobcore.jobs.states import JobStatus
from server.common.pagination import newest_first_after


def get_job(session: Session, project_id: str, job_id: str) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id, Job.project_id == project_id)).one_or_none()


@dataclass(frozen=True)
class CheckpointRefs:
    """A job's newest live checkpoint and its newest live best one (either may be missing)."""

    latest: Checkpoint | None
    best: Checkpoint | None


_latest = aliased(Checkpoint, name="latest_checkpoint")
_best = aliased(Checkpoint, name="best_checkpoint")


def _newest_live_checkpoint_id(best_only: bool) -> Any:
    candidate = aliased(Checkpoint)
    query = select(candidate.id).where(candidate.job_id == Job.id, candidate.deleted.is_(False))
    if best_only:
        query = query.where(candidate.is_best.is_(True))
    # Uses uq_checkpoints_job_step (job_id, step) backwards: one index probe per job.
    return query.order_by(candidate.step.desc()).limit(1).correlate(Job).scalar_subquery()


# Jobs with their latest and best checkpoints joined in (one round trip for a read). Correlated
# subqueries in the join condition rather than LATERAL, which SQLite lacks; on PostgreSQL each is
# an index probe per returned job (docs/benchmarks.md has the EXPLAIN). Built once: constructing
# these aliased selects costs more than running them.
_JOBS_WITH_CHECKPOINTS = (
    select(Job, _latest, _best)
    .select_from(Job)
    .outerjoin(_latest, _latest.id == _newest_live_checkpoint_id(best_only=False))
    .outerjoin(_best, _best.id == _newest_live_checkpoint_id(best_only=True))
)


def _read_rows(
    session: Session, query: Select[Job, Checkpoint, Checkpoint]
) -> list[tuple[Job, CheckpointRefs]]:
    return [(job, CheckpointRefs(latest, best)) for job, latest, best in session.execute(query)]


def read_job(session: Session, project_id: str, job_id: str) -> tuple[Job, CheckpointRefs] | None:
    """A job of the project with its checkpoint references, in one query."""
    rows = _read_rows(session, _JOBS_WITH_CHECKPOINTS.where(Job.id == job_id, Job.project_id == project_id))
    return rows[0] if rows else None


def job_by_idempotency_key(session: Session, project_id: str, key: str) -> Job | None:
    query = select(Job).where(Job.project_id == project_id, Job.idempotency_key == key)
    return session.scalars(query).one_or_none()


def list_jobs(
    session: Session,
    project_id: str,
    *,
    statuses: Sequence[str],
    name: str | None,
    metadata: dict[str, str],
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[tuple[Job, CheckpointRefs]]:
    """A page of the project's jobs, newest first (limit + 1 rows), each with its checkpoint refs."""
    query = _JOBS_WITH_CHECKPOINTS.where(Job.project_id == project_id)
    if statuses:
        query = query.where(Job.status.in_(list(statuses)))
    if name is not None:
        query = query.where(Job.name == name)
    for key, value in metadata.items():
        query = query.where(Job.metadata_[key].as_string() == value)
    query = newest_first_after(query, Job.created_at, Job.id, after, limit)
    return _read_rows(session, query)


def count_jobs(session: Session, project_id: str, statuses: Sequence[str]) -> int:
    query = (
        select(func.count()).select_from(Job).where(Job.project_id == project_id, Job.status.in_(statuses))
    )
    return int(session.scalar(query) or 0)


def _ahead_of(job: Any) -> Any:
    """Queued jobs a worker claims before `job`: higher priority, then older, then smaller id."""
    return or_(
        Job.priority > job.priority,
        and_(Job.priority == job.priority, Job.created_at < job.created_at),
        and_(Job.priority == job.priority, Job.created_at == job.created_at, Job.id < job.id),
    )


def queue_position(session: Session, job: Job) -> int:
    """1-based place in the global queue; workers claim by priority (high first), then age."""
    ahead = select(func.count()).select_from(Job).where(Job.status == JobStatus.QUEUED.value, _ahead_of(job))
    return int(session.scalar(ahead) or 0) + 1


def queue_positions(session: Session, jobs: Sequence[Job]) -> dict[str, int]:
    """Queue places of the queued ones among `jobs`, in one query.

    One job: count the jobs ahead of it (an index range up to its place). Several: number the
    whole queue once with a window function, rather than one count per job (a page of the
    newest queued jobs sits at the tail, where each count would walk the whole queue).
    """
    queued = [job for job in jobs if job.status == JobStatus.QUEUED.value]
    if len(queued) <= 1:
        return {job.id: queue_position(session, job) for job in queued}
    order = (Job.priority.desc(), Job.created_at.asc(), Job.id.asc())
    ranked = (
        select(Job.id, func.row_number().over(order_by=order).label("position"))
        .where(Job.status == JobStatus.QUEUED.value)
        .subquery()
    )
    query = select(ranked.c.id, ranked.c.position).where(ranked.c.id.in_([job.id for job in queued]))
    return {job_id: int(position) for job_id, position in session.execute(query)}


def live_checkpoints(session: Session, job_ids: Sequence[str]) -> list[Checkpoint]:
    if not job_ids:
        return []
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id.in_(list(job_ids)), Checkpoint.deleted.is_(False))
        .order_by(Checkpoint.job_id, Checkpoint.step)
    )
    return list(session.scalars(query))


def recent_metric_points(
    session: Session, job_ids: Sequence[str], name: str, count: int
) -> dict[str, list[tuple[int, datetime]]]:
    """(step, created_at) of each job's newest `count` points of a metric, newest first; one query.

    A UNION ALL of one LIMITed index scan (ix_job_metrics_job_name_step, backwards) per job,
    so a long run's thousands of points are never read to find its last few.
    """
    if not job_ids:
        return {}
    parts = [
        select(JobMetric.job_id, JobMetric.step, JobMetric.created_at)
        .where(JobMetric.job_id == job_id, JobMetric.name == name)
        .order_by(JobMetric.step.desc())
        .limit(count)
        .subquery()
        for job_id in job_ids
    ]
    # Each LIMITed part is wrapped as its own subquery: SQLite refuses ORDER BY/LIMIT directly
    # on the members of a compound select.
    union = union_all(*(select(part) for part in parts)).subquery()
    points: dict[str, list[tuple[int, datetime]]] = {job_id: [] for job_id in job_ids}
    rows = session.execute(select(union).order_by(union.c.job_id, union.c.step.desc()))
    for job_id, step, created_at in rows:
        points[job_id].append((step, created_at))
    return points


def list_events(
    session: Session,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    descending: bool = False,
    types: Sequence[str] = (),
    levels: Sequence[str] = (),
) -> list[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id)
    if types:
        query = query.where(JobEvent.type.in_(list(types)))
    if levels:
        query = query.where(JobEvent.level.in_(list(levels)))
    if after is not None:
        query = query.where(JobEvent.id < after if descending else JobEvent.id > after)
    order = JobEvent.id.desc() if descending else JobEvent.id.asc()
    return list(session.scalars(query.order_by(order).limit(limit + 1)))


def metric_points(session: Session, job_id: str, names: Sequence[str]) -> list[JobMetric]:
    query = select(JobMetric).where(JobMetric.job_id == job_id)
    if names:
        query = query.where(JobMetric.name.in_(list(names)))
    return list(session.scalars(query.order_by(JobMetric.name, JobMetric.step, JobMetric.id)))


def jobs_using_file(session: Session, project_id: str, file_id: str, statuses: Sequence[str]) -> list[Job]:
    """Live jobs of the project whose spec names the file (checked in Python: JSON is per backend)."""
    query = select(Job).where(Job.project_id == project_id, Job.status.in_(list(statuses)))
    found = []
    for job in session.scalars(query):
        model = job.spec.get("model") or {}
        data = job.spec.get("data") or {}
        refs = {
            data.get("train_file"),
            data.get("validation_file"),
            model.get("model_id"),
            model.get("tokenizer_id"),
        }
        if file_id in refs:
            found.append(job)
    return found
