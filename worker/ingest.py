"""Progress ingestion: `progress.jsonl` lines become job events, metric points, checkpoint rows
and the job's progress columns, written in one transaction per batch together with the byte
cursor, so a worker that dies mid-batch re-reads exactly the lines it had not committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Job, JobEvent, JobMetric, lock_jobs_for_events, utcnow
from jobcore.storage import S3Store, is_remote
from twinkle_core.checkpoint import COMPLETE_MARKER
from worker.checkpoints import dir_size, prune_checkpoints

METRIC_FIELDS = ("loss", "lr", "grad_norm", "tokens_per_second")
PROGRESS_FIELDS = ("step", "total_steps", "epoch", "loss", "lr", "tokens_per_second")


@dataclass
class Observed:
    """What a batch of progress events told the supervisor."""

    started: bool = False
    done: bool = False
    stopped_reason: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    last_checkpoint: str | None = None
    final_checkpoint: str | None = None  # named by the `done` event
    dirs_to_remove: list[Path] = field(default_factory=list)  # pruned checkpoints on disk
    objects_to_remove: list[str] = field(default_factory=list)  # pruned checkpoints in object storage
    count: int = 0

    def merge(self, other: Observed) -> None:
        self.started |= other.started
        self.done |= other.done
        self.stopped_reason = other.stopped_reason or self.stopped_reason
        self.error_kind = other.error_kind or self.error_kind
        self.error_message = other.error_message or self.error_message
        self.last_checkpoint = other.last_checkpoint or self.last_checkpoint
        self.final_checkpoint = other.final_checkpoint or self.final_checkpoint
        self.count += other.count


class OwnershipLost(Exception):
    """The job row no longer names this worker and attempt: another actor took the job over."""


def fenced_job_update(session: Session, job_id: str, worker_id: str, attempt: int, **values: Any) -> None:
    """Update the job only while this worker's attempt still owns it (a fencing token)."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.attempt == attempt)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise OwnershipLost(job_id)


@dataclass
class _Rows:
    """The event and metric rows of one batch, in the order the runner wrote them."""

    job_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def event(self, type_: str, message: str, data: dict[str, Any], level: str = "info") -> None:
        self.events.append(
            {"job_id": self.job_id, "type": type_, "level": level, "message": message[:4000], "data": data}
        )

    def metric(self, name: str, step: int, value: float, record: dict[str, Any]) -> None:
        """A point stamped with when the runner logged it: ingestion stores a batch of steps at
        once, and a job's ETA is paced from these stamps."""
        point = {"job_id": self.job_id, "name": name, "step": step, "value": value}
        self.metrics.append({**point, "created_at": _runner_time(record)})

    def write(self, session: Session) -> None:
        """One multi-row INSERT per table. Core inserts skip the ORM's unit of work, which was most
        of ingestion's CPU (docs/benchmarks.md); they also skip its flush hook, so the job row is
        locked here, as every writer of a job's events does (see `lock_jobs_for_events`)."""
        if self.events:
            lock_jobs_for_events(session, [self.job_id])
            session.execute(insert(JobEvent), self.events)
        if self.metrics:
            session.execute(insert(JobMetric), self.metrics)


def ingest_events(
    session: Session,
    job_id: str,
    events: list[dict[str, Any]],
    save_total_limit: int | None,
    store: S3Store | None = None,
) -> tuple[Observed, dict[str, Any]]:
    """Write rows for `events`; return what was observed and the job columns to update.

    With an object `store`, each checkpoint is uploaded before its row is written, and the row
    records the `s3://` location. Rows the session already holds (a status change just before)
    are flushed first, so the job's event ids keep the order things happened in.
    """
    seen = Observed(count=len(events))
    job_values: dict[str, Any] = {}
    if not events:
        return seen, job_values
    session.flush()
    rows = _Rows(job_id)
    for record in events:
        kind = record.get("event")
        if kind == "step":
            _ingest_step(rows, record, job_values)
        elif kind == "eval":
            _ingest_eval(rows, record)
        elif kind == "sample":
            _ingest_sample(rows, record)
        elif kind == "checkpoint":
            seen.last_checkpoint = _ingest_checkpoint(session, rows, record, store)
            for location in prune_checkpoints(session, job_id, save_total_limit):
                if is_remote(location):
                    seen.objects_to_remove.append(location)
                else:
                    seen.dirs_to_remove.append(Path(location))
        elif kind == "started":
            seen.started = True
            start = int(record.get("start_step") or 0)
            # A runner starting at step N (0 included: a retry before any checkpoint) recomputes
            # what follows: points past N are from an interrupted run (an earlier attempt, or a
            # Slurm requeue within one attempt of ours), or the charts would show those steps twice.
            rows.metrics = [m for m in rows.metrics if m["step"] <= start]
            forget_metrics_after(session, job_id, start)
            if record.get("total_steps") is not None:
                job_values["total_steps"] = int(record["total_steps"])
            rows.event(
                "message",
                f"runner started: world size {record.get('world_size')}, "
                f"from step {record.get('start_step', 0)}"
                + (f", resumed from {record['resumed_from']}" if record.get("resumed_from") else ""),
                record,
            )
        elif kind == "done":
            seen.done = True
            if record.get("final_checkpoint"):
                seen.final_checkpoint = str(record["final_checkpoint"])
            rows.event("message", f"training finished at step {record.get('step')}", record)
        elif kind == "stopped":
            seen.stopped_reason = str(record.get("reason") or "unknown")
            if record.get("checkpoint"):
                seen.last_checkpoint = str(record["checkpoint"])
            rows.event("message", f"runner stopped ({seen.stopped_reason})", record)
        elif kind == "error":
            seen.error_kind = str(record.get("kind") or "infra")
            seen.error_message = str(record.get("message") or "")
            rows.event("message", f"{seen.error_kind} error: {seen.error_message}", record, "error")
        elif kind == "message":
            level = str(record.get("level") or "info")
            rows.event("message", str(record.get("message") or ""), record, level)
    rows.write(session)
    return seen, job_values


def _runner_time(record: dict[str, Any]) -> datetime:
    """The event's `time` (the runner's clock, seconds since the epoch); now when it has none."""
    stamp = record.get("time")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        try:
            return datetime.fromtimestamp(stamp, UTC)
        except (OverflowError, OSError, ValueError):
            pass
    return utcnow()


def _ingest_step(rows: _Rows, record: dict[str, Any], job_values: dict[str, Any]) -> None:
    step = int(record.get("step") or 0)
    for name in METRIC_FIELDS:
        value = record.get(name)
        if isinstance(value, int | float):
            rows.metric(name, step, float(value), record)
    for name in PROGRESS_FIELDS:
        if record.get(name) is not None:
            job_values[name] = record[name]
    summary = ", ".join(
        f"{k}={record[k]:.4g}" for k in ("loss", "lr") if isinstance(record.get(k), int | float)
    )
    rows.event("metrics", f"step {step}" + (f": {summary}" if summary else ""), record)


def _ingest_eval(rows: _Rows, record: dict[str, Any]) -> None:
    step = int(record.get("step") or 0)
    value = record.get("eval_loss")
    if isinstance(value, int | float):
        rows.metric("eval_loss", step, float(value), record)
    rows.event("metrics", f"eval at step {step}: eval_loss={value}", record)


def _ingest_sample(rows: _Rows, record: dict[str, Any]) -> None:
    """Generations of the sample prompts at a step: one event, the pairs in its data."""
    step = int(record.get("step") or 0)
    samples = record.get("samples")
    pairs = [
        {"prompt": str(s.get("prompt", "")), "completion": str(s.get("completion", ""))}
        for s in (samples if isinstance(samples, list) else [])
        if isinstance(s, dict)
    ]
    rows.event("sample", f"samples at step {step}", {"step": step, "samples": pairs})


def _ingest_checkpoint(session: Session, rows: _Rows, record: dict[str, Any], store: S3Store | None) -> str:
    job_id = rows.job_id
    step = int(record.get("step") or 0)
    path = str(record.get("path") or "")
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    size = dir_size(Path(path)) if path else 0
    if store is not None and path and (Path(path) / COMPLETE_MARKER).exists():
        path = store.upload_checkpoint(job_id, Path(path))
    row = session.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step))
    if row is None:
        session.add(
            Checkpoint(
                job_id=job_id,
                step=step,
                path=path,
                metrics=metrics or {},
                size_bytes=size,
                is_best=bool(record.get("is_best")),
            )
        )
    else:  # the same step saved again by a retried attempt replaces the old one
        row.path, row.metrics, row.size_bytes, row.deleted = path, metrics or {}, size, False
        row.is_best = bool(record.get("is_best"))
    if record.get("is_best"):
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.job_id == job_id, Checkpoint.step != step)
            .values(is_best=False)
            .execution_options(synchronize_session=False)
        )
    session.flush()
    rows.event("checkpoint", f"checkpoint saved at step {step}", record)
    return path


def forget_metrics_after(session: Session, job_id: str, step: int) -> None:
    """A retry resumes at `step`: drop metric points the lost attempt wrote past it (recomputed)."""
    session.execute(delete(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step > step))
