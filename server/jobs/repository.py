"""SQL queries of the job API. Every read of a job is scoped to the caller's project."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BindParameter,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Job, JobEvent, JobMetric
from jobcore.jobs.states import JobStatus
from server.common.pagination import newest_first_after
from server.common.reads import RawStatement, fetch_mappings, fetch_tuples


def get_job(session: Session, project_id: str, job_id: str) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id, Job.project_id == project_id)).one_or_none()


@dataclass(frozen=True)
class CheckpointRefs:
    """A job's newest live checkpoint and its newest live best one (either may be missing)."""

    latest: Checkpoint | None
    best: Checkpoint | None


_jobs = Job.__table__
_checkpoints = Checkpoint.__table__
assert isinstance(_jobs, Table) and isinstance(_checkpoints, Table)

# What the API presents of a job (server/jobs/present.py reads these names off the row); the
# spec, the largest field, only when asked for: a list leaves it out unless `?expand=spec`.
PRESENTED_JOB_COLUMNS = (
    *("id", "name", "status", "priority", "max_retries", "timeout_seconds", "metadata", "webhook_url"),
    *("attempt", "failed_attempts", "step", "total_steps", "epoch", "loss", "lr", "tokens_per_second"),
    *("resume_from", "engine", "engine_job_id", "engine_state", "error"),
    *("created_at", "updated_at", "started_at", "finished_at"),
)
CHECKPOINT_REF_COLUMNS = ("id", "step", "metrics", "path", "created_at")
# A succeeded job's `model.model_id`, read inside the database so that a list without
# `expand=spec` still names its `fine_tuned_model`; the spec of any other job is not touched.
MODEL_ID = "model_id"
_model_id = case(
    (_jobs.c.status == JobStatus.SUCCEEDED, _jobs.c.spec[("model", "model_id")].as_string())
).label(MODEL_ID)


def _newest_live_checkpoint_id(best_only: bool) -> Any:
    candidate = _checkpoints.alias()
    query = select(candidate.c.id).where(candidate.c.job_id == _jobs.c.id, candidate.c.deleted.is_(False))
    if best_only:
        query = query.where(candidate.c.is_best.is_(True))
    # Uses uq_checkpoints_job_step (job_id, step) backwards: one index probe per job.
    return query.order_by(candidate.c.step.desc()).limit(1).correlate(_jobs).scalar_subquery()


def _jobs_with_checkpoints(with_spec: bool) -> Select[Any]:
    """Job rows with their latest and best checkpoints joined in (one round trip for a read), as
    Core rows: `latest_<column>` and `best_<column>` beside the job's columns (no ORM entities:
    they cost more to build than the query costs to run). Correlated subqueries in the join
    condition rather than LATERAL, which SQLite lacks; on PostgreSQL each is an index probe per
    returned job (docs/benchmarks.md has the EXPLAIN)."""
    latest = _checkpoints.alias("latest_checkpoint")
    best = _checkpoints.alias("best_checkpoint")
    names = (*PRESENTED_JOB_COLUMNS, "spec") if with_spec else PRESENTED_JOB_COLUMNS
    columns = [*(_jobs.c[name] for name in names), _model_id]
    for prefix, table in (("latest", latest), ("best", best)):
        columns += [table.c[name].label(f"{prefix}_{name}") for name in CHECKPOINT_REF_COLUMNS]
    return (
        select(*columns)
        .select_from(_jobs)
        .outerjoin(latest, latest.c.id == _newest_live_checkpoint_id(best_only=False))
        .outerjoin(best, best.c.id == _newest_live_checkpoint_id(best_only=True))
    )


# Built once: constructing these aliased selects costs more than running them. The statements
# below take their values as bound parameters, so that each is built (and its cache key, which
# SQLAlchemy memoizes per statement object, computed) once per process, not once per request.
_JOB_ROWS = {True: _jobs_with_checkpoints(with_spec=True), False: _jobs_with_checkpoints(with_spec=False)}
_OF_PROJECT = _jobs.c.project_id == bindparam("project_id")
_JOB_BY_ID = RawStatement(_JOB_ROWS[True].where(_jobs.c.id == bindparam("job_id"), _OF_PROJECT))
_JOB_CURSOR = RawStatement(
    select(_jobs.c.created_at, _jobs.c.id).where(_jobs.c.id == bindparam("job_id"), _OF_PROJECT)
)

Db = Connection | Session  # a read runs on a bare connection; the ORM paths pass their session
JobRow = Mapping[Any, Any]  # a RowMapping of the statements below, or `present.row_of` an ORM job


def read_job_row(db: Db, project_id: str, job_id: str) -> JobRow | None:
    """A job of the project with its spec and checkpoint references, in one statement."""
    rows = fetch_mappings(db, _JOB_BY_ID, {"job_id": job_id, "project_id": project_id})
    return rows[0] if rows else None  # the primary key: one row at most


def job_cursor(db: Db, project_id: str, job_id: str) -> tuple[datetime, str] | None:
    """(created_at, id) of a job of the project: where a page `after` it starts."""
    rows = fetch_tuples(db, _JOB_CURSOR, {"job_id": job_id, "project_id": project_id})
    return (rows[0][0], rows[0][1]) if rows else None


@lru_cache(maxsize=16)
def _page_statement(with_spec: bool, by_status: bool, by_name: bool, after: bool) -> RawStatement:
    """The page query for one combination of filters, with bound parameters (metadata filters,
    whose keys are part of the SQL, are added per request)."""
    query = _JOB_ROWS[with_spec].where(_OF_PROJECT)
    if by_status:
        query = query.where(_jobs.c.status.in_(bindparam("statuses", expanding=True)))
    if by_name:
        query = query.where(_jobs.c.name == bindparam("name"))
    cursor: tuple[BindParameter[Any], BindParameter[Any]] | None = None
    if after:
        cursor = (bindparam("after_created", type_=_jobs.c.created_at.type), bindparam("after_id"))
    return RawStatement(
        newest_first_after(query, _jobs.c.created_at, _jobs.c.id, cursor, None).limit(bindparam("fetch"))
    )


def list_job_rows(
    db: Db,
    project_id: str,
    *,
    statuses: Sequence[str],
    name: str | None,
    metadata: dict[str, str],
    after: tuple[datetime, str] | None,
    limit: int,
    with_spec: bool,
) -> list[JobRow]:
    """A page of the project's jobs, newest first (limit + 1 rows), each with its checkpoint refs."""
    statement = _page_statement(with_spec, bool(statuses), name is not None, after is not None)
    params: dict[str, Any] = {"project_id": project_id, "fetch": limit + 1}
    if statuses:
        params["statuses"] = list(statuses)
    if name is not None:
        params["name"] = name
    if after is not None:
        params["after_created"], params["after_id"] = after
    if metadata:  # the keys are part of the SQL: a statement per request, through Core
        query = statement.select
        for key, value in metadata.items():
            query = query.where(_jobs.c.metadata[key].as_string() == value)
        return list(db.execute(query, params).mappings())
    return fetch_mappings(db, statement, params)


def job_by_idempotency_key(session: Session, project_id: str, key: str) -> Job | None:
    query = select(Job).where(Job.project_id == project_id, Job.idempotency_key == key)
    return session.scalars(query).one_or_none()


def _filtered(
    query: Select[Any], statuses: Sequence[str], name: str | None, metadata: dict[str, str]
) -> Select[Any]:
    if statuses:
        query = query.where(_jobs.c.status.in_(list(statuses)))
    if name is not None:
        query = query.where(_jobs.c.name == name)
    for key, value in metadata.items():
        query = query.where(_jobs.c.metadata[key].as_string() == value)
    return query


def list_jobs(
    session: Session,
    project_id: str,
    *,
    statuses: Sequence[str],
    name: str | None,
    metadata: dict[str, str],
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Job]:
    """A page of the project's jobs as ORM entities (limit + 1), for callers that act on them."""
    query = _filtered(select(Job).where(Job.project_id == project_id), statuses, name, metadata)
    return list(session.scalars(newest_first_after(query, _jobs.c.created_at, _jobs.c.id, after, limit)))


def count_jobs(session: Session, project_id: str, statuses: Sequence[str]) -> int:
    query = (
        select(func.count()).select_from(Job).where(Job.project_id == project_id, Job.status.in_(statuses))
    )
    return int(session.scalar(query) or 0)


def _ahead_of_statement() -> Select[Any]:
    """How many queued jobs a worker claims before a given one: higher priority, then older,
    then smaller id (the claim's order)."""
    priority, created_at = _jobs.c.priority, _jobs.c.created_at
    this_priority = bindparam("priority", type_=priority.type)
    this_created = bindparam("created_at", type_=created_at.type)
    ahead = or_(
        priority > this_priority,
        and_(priority == this_priority, created_at < this_created),
        and_(priority == this_priority, created_at == this_created, _jobs.c.id < bindparam("job_id")),
    )
    return select(func.count()).select_from(_jobs).where(_QUEUED, ahead)


def _queue_ranks_statement() -> Select[Any]:
    """The queue places of given jobs: the whole queue numbered once with a window function."""
    order = (_jobs.c.priority.desc(), _jobs.c.created_at.asc(), _jobs.c.id.asc())
    position = func.row_number().over(order_by=order).label("position")
    ranked = select(_jobs.c.id, position).where(_QUEUED).subquery()
    return select(ranked.c.id, ranked.c.position).where(ranked.c.id.in_(bindparam("job_ids", expanding=True)))


_QUEUED = _jobs.c.status == JobStatus.QUEUED.value
_AHEAD_OF = RawStatement(_ahead_of_statement())
_QUEUE_RANKS = _queue_ranks_statement()


def queue_positions(db: Db, jobs: Sequence[JobRow]) -> dict[str, int]:
    """Queue places (1 = claimed next) of the queued ones among `jobs` (rows with id, status,
    priority and created_at), in one query; workers claim by priority (high first), then age.

    One job: count the jobs ahead of it (an index range up to its place). Several: number the
    whole queue once, rather than one count per job (a page of the newest queued jobs sits at the
    tail, where each count would walk the whole queue).
    """
    queued_status = JobStatus.QUEUED.value
    queued = [job for job in jobs if job["status"] == queued_status]
    if not queued:
        return {}
    if len(queued) == 1:
        job = queued[0]
        params = {"priority": job["priority"], "created_at": job["created_at"], "job_id": job["id"]}
        return {job["id"]: int(fetch_tuples(db, _AHEAD_OF, params)[0][0] or 0) + 1}
    rows = db.execute(_QUEUE_RANKS, {"job_ids": [job["id"] for job in queued]})
    return {job_id: int(position) for job_id, position in rows}


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
    db: Db, job_ids: Sequence[str], name: str, count: int
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
    rows = db.execute(select(union).order_by(union.c.job_id, union.c.step.desc()))
    for job_id, step, created_at in rows:
        points[job_id].append((step, created_at))
    return points


_JOB_EXISTS = RawStatement(select(_jobs.c.id).where(_jobs.c.id == bindparam("job_id"), _OF_PROJECT))


def job_exists(db: Db, project_id: str, job_id: str) -> bool:
    return bool(fetch_tuples(db, _JOB_EXISTS, {"job_id": job_id, "project_id": project_id}))


_events = JobEvent.__table__
_metrics = JobMetric.__table__
assert isinstance(_events, Table) and isinstance(_metrics, Table)


@lru_cache(maxsize=16)
def _events_statement(by_type: bool, by_level: bool, after: bool, descending: bool) -> RawStatement:
    columns = (_events.c[name] for name in ("id", "created_at", "level", "type", "message", "data"))
    query = select(*columns).where(_events.c.job_id == bindparam("job_id"))
    if by_type:
        query = query.where(_events.c.type.in_(bindparam("types", expanding=True)))
    if by_level:
        query = query.where(_events.c.level.in_(bindparam("levels", expanding=True)))
    if after:
        cursor = bindparam("after", type_=_events.c.id.type)
        query = query.where(_events.c.id < cursor if descending else _events.c.id > cursor)
    order = _events.c.id.desc() if descending else _events.c.id.asc()
    return RawStatement(query.order_by(order).limit(bindparam("fetch")))


def list_events(
    db: Db,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    descending: bool = False,
    types: Sequence[str] = (),
    levels: Sequence[str] = (),
) -> list[Mapping[str, Any]]:
    """Up to `limit + 1` of the job's events after the cursor, as rows (id order)."""
    query = _events_statement(bool(types), bool(levels), after is not None, descending)
    params: dict[str, Any] = {"job_id": job_id, "fetch": limit + 1}
    if types:
        params["types"] = list(types)
    if levels:
        params["levels"] = list(levels)
    if after is not None:
        params["after"] = after
    return fetch_mappings(db, query, params)


def _of_series(query: Select[Any], names: int) -> Select[Any]:
    """The series filter of a metrics statement for `names` names (0: all; 2: two or more). One
    name is a plain equality rather than an IN list of one: the dashboard asks for one series at
    a time, and a statement without an IN list runs on psycopg directly (`RawStatement`)."""
    if names == 1:
        return query.where(_metrics.c.name == bindparam("name"))
    if names > 1:
        return query.where(_metrics.c.name.in_(bindparam("names", expanding=True)))
    return query


def _series_params(job_id: str, names: Sequence[str]) -> dict[str, Any]:
    if len(names) == 1:
        return {"job_id": job_id, "name": names[0]}
    return {"job_id": job_id, "names": list(names)} if names else {"job_id": job_id}


@lru_cache(maxsize=3)
def _metrics_statement(names: int) -> RawStatement:
    query: Select[Any] = select(_metrics.c.name, _metrics.c.step, _metrics.c.value)
    query = _of_series(query.where(_metrics.c.job_id == bindparam("job_id")), names)
    return RawStatement(query.order_by(_metrics.c.name, _metrics.c.step, _metrics.c.id))


def metric_points(db: Db, job_id: str, names: Sequence[str]) -> list[tuple[str, int, float]]:
    """(name, step, value) of the job's metric points, by name then step."""
    statement = _metrics_statement(min(len(names), 2))
    return fetch_tuples(db, statement, _series_params(job_id, names))


@lru_cache(maxsize=3)
def _bucketed_metrics_statement(names: int) -> RawStatement:
    """Each series cut into at most `max_points` buckets of consecutive points, in the database:
    one row per bucket (name, its last step, the sum of its values, its size), so that a long
    series costs the API the points it returns, not all of them (`downsampled_metric_points`).

    Point r (1-based, in (step, id) order) of a series of n falls in bucket (r*m - 1) // n for
    m = `max_points`: the b with b*n // m < r <= (b+1)*n // m, the same consecutive buckets as
    `server.progress.service.downsample` slices (with n <= m, one point each). The sum is a
    running window sum in (step, id) order, so it adds the same floats in the same order as
    Python's `sum` over the slice (an aggregate's input order is not defined), and is taken at
    the bucket's last point: the one whose successor falls in the next bucket.
    """
    m = _metrics
    max_points = bindparam("max_points", type_=m.c.step.type)
    query = select(
        m.c.name,
        m.c.step,
        m.c.value,
        func.row_number().over(partition_by=m.c.name, order_by=(m.c.step, m.c.id)).label("r"),
        func.count().over(partition_by=m.c.name).label("n"),
    ).where(m.c.job_id == bindparam("job_id"))
    numbered = _of_series(query, names).subquery()
    r, n = numbered.c.r, numbered.c.n
    bucket = (r * max_points - 1) // n
    summed = select(
        numbered.c.name,
        numbered.c.step,
        r,
        n,
        bucket.label("bucket"),
        func.sum(numbered.c.value)
        .over(partition_by=(numbered.c.name, bucket), order_by=r, rows=(None, 0))
        .label("total"),
    ).subquery()
    last_of_bucket = or_(
        summed.c.r == summed.c.n, ((summed.c.r + 1) * max_points - 1) // summed.c.n > summed.c.bucket
    )
    size = summed.c.r - (summed.c.bucket * summed.c.n) // max_points  # minus the points before the bucket
    return RawStatement(
        select(summed.c.name, summed.c.step, summed.c.total, size)
        .where(last_of_bucket)
        .order_by(summed.c.name, summed.c.r)
    )


def downsampled_metric_points(
    db: Db, job_id: str, names: Sequence[str], max_points: int
) -> list[tuple[str, int, float]]:
    """(name, step, value) of the job's metric series, each averaged into at most `max_points`
    consecutive buckets (the value at a bucket's last step), by name then step: exactly what
    `server.progress.service.downsample` makes of `metric_points` (tested), read as only the
    points returned."""
    params = {**_series_params(job_id, names), "max_points": max_points}
    rows = fetch_tuples(db, _bucketed_metrics_statement(min(len(names), 2)), params)
    return [(name, step, total / size) for name, step, total, size in rows]


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
