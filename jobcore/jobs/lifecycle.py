"""The one function that changes a job's status, used by the API, the worker and the reconciler.

A transition is a compare-and-set: `UPDATE jobs SET status=:new WHERE id=:id AND status=:old`.
Two actors racing (a user's cancel and a worker's finish) cannot both win, and the loser sees the
state the winner left. Each transition also records a `status` event in the same transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from jobcore.db.models import Job, JobEvent, utcnow
from jobcore.jobs.states import TERMINAL, InvalidTransition, JobStatus, check_transition

# States a job can be in while its runner (once it reported running) is still alive.
RUNNER_ALIVE = frozenset({JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.CANCELLING})


def transition(
    session: Session,
    job: Job,
    target: JobStatus | str,
    *,
    action: str | None = None,
    message: str | None = None,
    level: str = "info",
    **fields: Any,
) -> Job:
    """Move `job` to `target` if the table allows it and nobody changed it meanwhile.

    Extra keyword arguments are column values written in the same UPDATE (error, worker_id, …).
    Raises InvalidTransition (with the state found in the database) otherwise. Does not commit:
    the caller's unit of work owns the transaction.
    """
    current = job.status
    new = check_transition(current, str(target), action)
    now = utcnow()
    values: dict[str, Any] = {"status": new.value, "updated_at": now, **fields}
    if new in TERMINAL:
        values.setdefault("finished_at", now)
    if new == JobStatus.RUNNING:
        values.setdefault("running_since", now)
    elif new not in RUNNER_ALIVE and job.running_since is not None:
        # The attempt's runner is gone: bank its running time (see Job.run_seconds).
        elapsed = max(0.0, (now - job.running_since).total_seconds())
        values.setdefault("run_seconds", (job.run_seconds or 0.0) + elapsed)
        values.setdefault("running_since", None)
    result = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == current)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.refresh(job)
        raise InvalidTransition(job.status, new.value, action)
    session.add(
        JobEvent(
            job_id=job.id,
            level=level,
            type="status",
            message=message or f"status {current} -> {new.value}",
            data={"from": current, "to": new.value},
        )
    )
    session.flush()
    session.refresh(job)
    return job
