"""The API view of jobs, built straight from database rows.

A row is a mapping with the job's columns (`repository.PRESENTED_JOB_COLUMNS`, plus `spec` when
it was read) and its checkpoint references (`latest_<column>`, `best_<column>`). The read
endpoints serialize what `present_rows` returns as it is: building `JobOut` models, or ORM
entities before them, cost more CPU than the queries (docs/benchmarks.md). `JobOut` stays the
documented shape; `present_jobs` validates through it for the paths that act on ORM jobs, and
the tests hold both paths to the same output.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from jobcore import model_names as names
from jobcore.db.models import Checkpoint, Job
from jobcore.jobs.states import TERMINAL, JobStatus, actions_for
from server.jobs import repository
from server.jobs.schemas import JobOut

ETA_WINDOW = 20  # logged steps the ETA's pace is taken over

_TERMINAL = frozenset(status.value for status in TERMINAL)
_RUNNING = JobStatus.RUNNING.value  # an enum member's .value is a descriptor call, per row
_SUCCEEDED = JobStatus.SUCCEEDED.value
_REF_KEYS = {
    prefix: tuple((name, f"{prefix}_{name}") for name in repository.CHECKPOINT_REF_COLUMNS)
    for prefix in ("latest", "best")
}
# Column name -> ORM attribute (`metadata` is `Job.metadata_`: `metadata` is taken in SQLAlchemy).
_JOB_ATTRIBUTES = {prop.columns[0].name: prop.key for prop in inspect(Job).column_attrs}

Row = repository.JobRow


def _checkpoint_ref(row: Row, prefix: str) -> dict[str, Any] | None:
    keys = _REF_KEYS[prefix]
    if row[keys[0][1]] is None:
        return None
    return {name: row[key] for name, key in keys}


def _has_eta(row: Row) -> bool:
    total = row["total_steps"]
    return row["status"] == _RUNNING and bool(total) and row["step"] < total


def _eta_seconds(row: Row, points: list[tuple[int, datetime]] | None) -> float | None:
    """Seconds left at the recent pace: the median seconds per step between the last few logged
    steps (newest first, stamped with the runner's clock), so that the gap of a pause or a retry
    among them does not count as training time."""
    if not points or len(points) < 2:
        return None
    paces = []
    for (step, at), (earlier_step, earlier_at) in itertools.pairwise(points):
        steps, seconds = step - earlier_step, (at - earlier_at).total_seconds()
        if steps > 0 and seconds > 0:
            paces.append(seconds / steps)
    if not paces:
        return None
    return round(statistics.median(paces) * (row["total_steps"] - row["step"]), 1)


def _fine_tuned_model(row: Row) -> str | None:
    """The name the inference endpoints call the job's final weights by, once it succeeded with a
    checkpoint left to serve (what `/v1/models` lists and the OpenAI layer's `fine_tuned_model`)."""
    if row["status"] != _SUCCEEDED or row["latest_id"] is None:
        return None
    return names.fine_tuned_model_name(row["id"], row[repository.MODEL_ID] or "", row["name"])


def _error(value: Mapping[str, Any] | None) -> dict[str, str] | None:
    if not value:
        return None
    return {"kind": str(value.get("kind", "infra")), "message": str(value.get("message", ""))}


def present_row(
    row: Row,
    queue_position: int | None,
    pace: list[tuple[int, datetime]] | None,
    with_spec: bool = True,
    actions: list[str] | None = None,
) -> dict[str, Any]:
    """One job as `JobOut` serializes it; `spec` null unless the row was read with it; `actions`
    as `actions_for(status)` gives them, when the caller has them already."""
    status = row["status"]
    step, total = row["step"], row["total_steps"]
    engine = row["engine"]
    return {
        "id": row["id"],
        "object": "job",
        "name": row["name"],
        "status": status,
        # Asked per call (or per page, by present_rows), not cached at import: ACTIONS is the one
        # table of actions.
        "actions": actions_for(status) if actions is None else actions,
        "terminal": status in _TERMINAL,
        "spec": row["spec"] if with_spec else None,
        "priority": row["priority"],
        "max_retries": row["max_retries"],
        "timeout_seconds": row["timeout_seconds"],
        "metadata": row["metadata"],
        "webhook_url": row["webhook_url"],
        "attempt": row["attempt"],
        "failed_attempts": row["failed_attempts"],
        "progress": {
            "step": step,
            "total_steps": total,
            "epoch": row["epoch"],
            "percent": round(min(100.0, 100.0 * step / total), 2) if total else None,
            "loss": row["loss"],
            "lr": row["lr"],
            "tokens_per_second": row["tokens_per_second"],
            "eta_seconds": _eta_seconds(row, pace) if total else None,
        },
        "queue_position": queue_position,
        "latest_checkpoint": _checkpoint_ref(row, "latest"),
        "best_checkpoint": _checkpoint_ref(row, "best"),
        "fine_tuned_model": _fine_tuned_model(row),
        "resume_from": row["resume_from"],
        "engine": None
        if engine is None
        else {"name": engine, "job_id": row["engine_job_id"], "state": row["engine_state"]},
        "error": _error(row["error"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
    }


def present_rows(db: repository.Db, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Jobs as the API shows them. At most two statements for any number of rows: the queue
    places of the queued ones and the recent pace of the running ones."""
    positions = repository.queue_positions(db, rows)
    paces = repository.recent_metric_points(db, [r["id"] for r in rows if _has_eta(r)], "loss", ETA_WINDOW)
    with_spec = bool(rows) and "spec" in rows[0]  # once: a missing key is a slow path on a Row
    # Once per status on the page, not per job (about 0.85 us each: 17 us of a page of 20).
    offered = {status: actions_for(status) for status in {row["status"] for row in rows}}
    return [
        present_row(row, positions.get(row["id"]), paces.get(row["id"]), with_spec, offered[row["status"]])
        for row in rows
    ]


# ------------------------------------------------------------------- from ORM entities


def _checkpoint_refs(session: Session, jobs: Sequence[Job]) -> dict[str, repository.CheckpointRefs]:
    latest: dict[str, Checkpoint] = {}
    best: dict[str, Checkpoint] = {}
    for ckpt in repository.live_checkpoints(session, [j.id for j in jobs]):  # by step: last seen is latest
        latest[ckpt.job_id] = ckpt
        if ckpt.is_best:
            best[ckpt.job_id] = ckpt
    return {j.id: repository.CheckpointRefs(latest.get(j.id), best.get(j.id)) for j in jobs}


def row_of(job: Job, refs: repository.CheckpointRefs) -> dict[str, Any]:
    """The row `repository.read_job_row` would read for `job` (spec included)."""
    row = {name: getattr(job, _JOB_ATTRIBUTES[name]) for name in (*repository.PRESENTED_JOB_COLUMNS, "spec")}
    model = (job.spec or {}).get("model") if job.status == _SUCCEEDED else None  # as the SQL reads it
    row[repository.MODEL_ID] = model.get("model_id") if isinstance(model, dict) else None
    for prefix, checkpoint in (("latest", refs.latest), ("best", refs.best)):
        for name, key in _REF_KEYS[prefix]:
            row[key] = None if checkpoint is None else getattr(checkpoint, name)
    return row


def present_jobs(session: Session, jobs: Sequence[Job]) -> list[JobOut]:
    """The API view of ORM jobs (after an action, for the OpenAI mapping): three statements."""
    refs = _checkpoint_refs(session, jobs)
    rows = [row_of(job, refs[job.id]) for job in jobs]
    return [JobOut.model_validate(item) for item in present_rows(session, rows)]
