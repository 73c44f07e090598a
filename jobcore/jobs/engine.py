"""The cluster engine a job was handed to (Ray, Slurm): its id there and its state there.

A worker that hands a job to an engine records what the engine says about it on the job row, so
`GET /v1/jobs/{id}` and the job page show it without asking the engine. Only changes are written,
each with a `message` event, so a poll loop that sees the same state again costs no write.
"""

from __future__ import annotations

from typing import Literal, get_args

from sqlalchemy.orm import Session

from jobcore.db.models import Job, JobEvent

Engine = Literal["ray", "slurm"]
ENGINES: tuple[str, ...] = get_args(Engine)


def record_engine_state(
    session: Session, job: Job, *, engine: Engine, engine_job_id: str | None, state: str | None
) -> bool:
    """Set the job's engine, engine job id and engine state; True when anything changed.

    The caller commits. `state` is the engine's own word (Slurm's PENDING, RUNNING, PREEMPTED...,
    Ray's placement group or job state), kept as the engine spells it.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    current = (job.engine, job.engine_job_id, job.engine_state)
    if current == (engine, engine_job_id, state):
        return False
    job.engine, job.engine_job_id, job.engine_state = engine, engine_job_id, state
    session.add(
        JobEvent(
            job_id=job.id,
            level="info",
            type="message",
            message=f"{engine} job {engine_job_id or '?'}: {state or 'unknown'}",
            data={"engine": engine, "engine_job_id": engine_job_id, "engine_state": state},
        )
    )
    return True
