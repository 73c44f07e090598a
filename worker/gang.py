"""Gang start of multi-node jobs (`resources.nnodes > 1`), in SQL.

The worker that claims a queued multi-node job becomes node 0: it owns the job row (as for any
job) and inserts the gang's first `gang_members` row, publishing its rendezvous address and a
free port. Workers on other hosts join by inserting the next node rank while the job is
`starting`; the unique constraints (job, attempt, rank) and (job, attempt, host) make each join
atomic. Every node launches torchrun only once all `nnodes` rows exist and node 0 has marked its
row `launching` (its spec, resume point and port are final by then). The rows are the leases:
deleting them ends the attempt on every node.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore.db.models import GangMember, Job, utcnow
from jobcore.jobs.spec import resources_of
from jobcore.jobs.states import JobStatus
from worker.claim import CANDIDATES
from worker.launch import free_port

JOINED, LAUNCHING, EXITED, FAILED = "joined", "launching", "exited", "failed"
LEFT = "left"  # the node's worker was stopped (deploy, SIGTERM): not the job's fault


def lead(session: Session, job: Job, worker_id: str, host: str, address: str) -> GangMember:
    """Insert node 0's row for the attempt just claimed (rows of earlier attempts are dropped)."""
    session.execute(delete(GangMember).where(GangMember.job_id == job.id))
    row = GangMember(
        job_id=job.id,
        attempt=job.attempt,
        node_rank=0,
        worker_id=worker_id,
        host=host,
        address=address,
        # Chosen here, on node 0's machine, so that every node reads the same port from SQL.
        port=free_port(),
    )
    session.add(row)
    session.flush()
    return row


def join_forming_gang(
    session: Session, worker_id: str, host: str, fits: Callable[[int], bool]
) -> tuple[Job, GangMember] | None:
    """Join a `starting` multi-node job that still misses nodes and has none on this host."""
    forming = session.execute(
        select(Job.id, Job.spec, Job.attempt)
        .where(Job.status == JobStatus.STARTING.value)
        .order_by(Job.priority.desc(), Job.created_at, Job.id)
        .limit(CANDIDATES)
    ).all()
    postgres = session.get_bind().dialect.name == "postgresql"
    for job_id, spec, attempt in forming:
        resources = resources_of(spec)
        nnodes = resources.nnodes
        if nnodes <= 1 or not fits(resources.nproc_per_node):
            continue
        lock = select(Job).where(
            Job.id == job_id, Job.status == JobStatus.STARTING.value, Job.attempt == attempt
        )
        if postgres:
            # Serialises a join with node 0 giving the gang up (it updates this row).
            lock = lock.with_for_update()
        if session.scalars(lock.execution_options(populate_existing=True)).first() is None:
            continue
        rows = members(session, job_id, attempt)
        if not rows or rows[0].node_rank != 0 or len(rows) >= nnodes or any(r.host == host for r in rows):
            continue
        taken = {r.node_rank for r in rows}
        rank = min(r for r in range(1, nnodes) if r not in taken)
        row = GangMember(job_id=job_id, attempt=attempt, node_rank=rank, worker_id=worker_id, host=host)
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            continue  # another worker took this rank, or this host is in the gang already
        job = session.get(Job, job_id)
        assert job is not None
        return job, row
    return None


def members(session: Session, job_id: str, attempt: int) -> list[GangMember]:
    query = (
        select(GangMember)
        .where(GangMember.job_id == job_id, GangMember.attempt == attempt)
        .order_by(GangMember.node_rank)
        .execution_options(populate_existing=True)
    )
    return list(session.scalars(query))


def count(session: Session, job_id: str, attempt: int) -> int:
    query = select(func.count()).where(GangMember.job_id == job_id, GangMember.attempt == attempt)
    return int(session.scalar(query) or 0)


def release(session: Session, job_id: str, attempt: int) -> None:
    """End the gang: every node sees its row gone and stops its processes."""
    session.execute(delete(GangMember).where(GangMember.job_id == job_id, GangMember.attempt == attempt))


def release_member(session: Session, member_id: str) -> None:
    session.execute(delete(GangMember).where(GangMember.id == member_id))


def update_member(session: Session, member_id: str, **values: Any) -> bool:
    """Update one node's row; False when it is gone (the gang was released)."""
    result = session.execute(
        update(GangMember)
        .where(GangMember.id == member_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def broken_member(rows: list[GangMember], nnodes: int, stale_after_seconds: float) -> str | None:
    """Why the running gang is broken (a node failed, went silent or left), or None if it is whole."""
    if len(rows) < nnodes:
        return f"only {len(rows)} of {nnodes} nodes remain in the gang"
    stale = utcnow() - timedelta(seconds=stale_after_seconds)
    for row in rows[1:]:  # node 0 is the caller
        if row.status == FAILED and row.exit_code is None:
            return f"node {row.node_rank} ({row.host}) failed before its torchrun ran (its event says why)"
        if row.status == FAILED:
            return f"node {row.node_rank} ({row.host}) failed with exit code {row.exit_code}"
        if row.status == LEFT:
            return f"node {row.node_rank} ({row.host}) left: its worker is shutting down"
        # A node whose ranks all finished (exit 0) stops heartbeating while node 0 may still be
        # saving the final checkpoint: that silence is not a failure.
        if row.status != EXITED and row.heartbeat_at < stale:
            return f"node {row.node_rank} ({row.host}) lost (no heartbeat for {stale_after_seconds:.0f} s)"
    return None
