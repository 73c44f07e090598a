"""End-of-attempt state changes shared by the supervisor and the reconciler.

Every change goes through `transition`, so a user's cancel racing a worker's finish resolves to
one winner. A retry records which checkpoint the next attempt will resume from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from server.db.models import Job, JobEvent
from server.jobs.lifecycle import transition
from server.jobs.states import TERMINAL, JobStatus
from worker.checkpoints import dir_size, latest_complete_checkpoint
from worker.webhooks import enqueue_terminal_webhook

S = JobStatus
# Columns that only mean something while a worker holds the job.
RELEASED: dict[str, Any] = {"pids": None, "gpu_ids": None}


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
