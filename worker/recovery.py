"""End-of-attempt state changes shared by the supervisor and the reconciler.

Every change goes through `transition`, so a user's cancel racing a worker's finish resolves to
one winner. A retry records which checkpoint the next attempt will resume from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from jobcore.db.models import Job, JobEvent
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.spec import training_of
from jobcore.jobs.states import TERMINAL, JobStatus
from jobcore.storage import S3Store
from twinkle_core import checkpoint as ckpt
from twinkle_core.checkpoint import latest_complete_checkpoint
from twinkle_core.progress import PROGRESS_FILE, ProgressReader
from worker.checkpoints import dir_size
from worker.ingest import Observed, ingest_events
from worker.webhooks import enqueue_terminal_webhook

S = JobStatus
# Columns that only mean something while a worker holds the job.
RELEASED: dict[str, Any] = {"pids": None, "gpu_ids": None}


def succeed_if_finished(
    session: Session, job: Job, job_dir: Path, store: S3Store | None, reason: str
) -> Observed | None:
    """Record a lost attempt that had in fact finished; what its last lines showed, if it had.

    A worker killed between its runner's `done` and writing `succeeded` leaves a job that looks
    lost but is over: `progress.jsonl` past the job's cursor ends the run with `done`, and the
    final checkpoint it names is complete. Those lines are ingested and the job succeeds, instead
    of spending a retry (or failing, out of retries) on an attempt that would only reload the
    final checkpoint. Call it inside the transaction that would otherwise requeue the job, and
    remove the checkpoints the ingestion pruned (`Observed.dirs_to_remove`, `objects_to_remove`)
    once it committed.
    """
    if S(job.status) not in (S.STARTING, S.RUNNING, S.PAUSING):
        return None  # a cancel in flight wins; paused and terminal jobs are not lost
    reader = ProgressReader(job_dir / PROGRESS_FILE, offset=job.progress_cursor or 0)
    events = reader.read_new()  # nothing when the file is missing or holds no new line
    done = next((e for e in reversed(events) if e.get("event") == "done"), None)
    final = str(done.get("final_checkpoint") or "") if done else ""
    if not final or not ckpt.is_complete(final):
        return None
    if job.status == S.STARTING:
        transition(session, job, S.RUNNING, message="runner started")
    seen, values = ingest_events(session, job.id, events, training_of(job.spec).save_total_limit, store)
    for column, value in values.items():
        setattr(job, column, value)
    job.progress_cursor = reader.offset
    finish(
        session,
        job,
        job_dir,
        S.SUCCEEDED,
        message=f"succeeded: attempt {job.attempt} had finished (final checkpoint {final}) before "
        f"its end was recorded ({reason})",
        error=None,
    )
    return seen


def retry_or_fail(
    session: Session,
    job: Job,
    job_dir: Path,
    reason: str,
    error: dict[str, Any],
    charge_retry: bool = True,
) -> Job:
    """After an infra failure of an active job: requeue from the latest checkpoint, or fail.

    A job being cancelled ends `cancelled`; one being paused ends `paused` (its latest checkpoint
    is where a resume continues), since that is what the user asked for.
    """
    latest = latest_complete_checkpoint(job_dir)
    resume = str(latest) if latest else None
    if job.status == S.CANCELLING:
        return finish(session, job, job_dir, S.CANCELLED, message=f"cancelled ({reason})")
    if job.status == S.PAUSING:
        return finish(session, job, job_dir, S.PAUSED, message=f"paused ({reason})", resume_from=resume)
    failures = job.failed_attempts + (1 if charge_retry else 0)
    transition(
        session,
        job,
        S.RETRYING,
        message=f"attempt {job.attempt} failed: {reason}",
        level="warn",
        failed_attempts=failures,
        **RELEASED,
    )
    if failures > job.max_retries:
        return finish(
            session,
            job,
            job_dir,
            S.FAILED,
            message=f"giving up after {failures} failed attempts (max_retries={job.max_retries})",
            level="error",
            error={**error, "kind": "infra", "attempts": job.attempt, "failed_attempts": failures},
        )
    where = f"checkpoint {resume}" if resume else "the beginning (no complete checkpoint yet)"
    why = f"retry {failures}/{job.max_retries}" if charge_retry else "handed back (no retry charged)"
    session.add(
        JobEvent(
            job_id=job.id,
            type="message",
            level="warn",
            message=f"{why}: attempt {job.attempt + 1} resumes from {where}",
            data={
                "resume_from": resume,
                "attempt": job.attempt,
                "failed_attempts": failures,
                "reason": reason,
            },
        )
    )
    return transition(session, job, S.QUEUED, message="requeued for retry", resume_from=resume, error=error)


def finish(
    session: Session,
    job: Job,
    job_dir: Path,
    target: JobStatus,
    *,
    message: str,
    level: str = "info",
    **fields: Any,
) -> Job:
    """Move the job to `target` (paused or terminal), releasing the worker's columns."""
    values = {**RELEASED, **fields}
    if job_dir.exists():
        values.setdefault("disk_bytes", dir_size(job_dir))
    # Paths that states allow only through an intermediate state (running -> pausing -> paused).
    if target == S.PAUSED and job.status in (S.STARTING, S.RUNNING):
        transition(session, job, S.PAUSING, message="pausing")
    transition(session, job, target, message=message, level=level, **values)
    if S(job.status) in TERMINAL:
        enqueue_terminal_webhook(session, job)
    return job
