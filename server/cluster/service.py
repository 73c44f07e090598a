"""Cluster views: registered workers, readiness probes, Prometheus samples."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from jobcore import gpu_leases
from jobcore.db.models import Job, JobEvent, WorkerNode
from jobcore.jobs.states import ACTIVE, JobStatus
from jobcore.settings import Settings
from server.auth.principal import Principal


def _gpu_numbers(ids: Iterable[object]) -> list[int]:
    return sorted({int(str(g)) for g in ids if str(g).isdigit()})


def list_workers(
    session: Session, principal: Principal, stale_after_seconds: float
) -> list[dict[str, object]]:
    """Every worker with its GPUs, running jobs and the GPUs of its machine that serving hosts
    hold; other projects' job ids are hidden but from the operator (an admin of another project
    administers that project only)."""
    workers = list(session.scalars(select(WorkerNode).order_by(WorkerNode.host, WorkerNode.id)))
    active = [s.value for s in ACTIVE]
    running = session.execute(
        select(Job.worker_id, Job.id, Job.project_id, Job.gpu_ids).where(
            Job.status.in_(active), Job.worker_id.is_not(None)
        )
    ).all()
    serving = gpu_leases.serving_gpus(session, stale_after_seconds)
    out: list[dict[str, object]] = []
    for worker in workers:
        mine = [r for r in running if r.worker_id == worker.id]
        visible = [r.id for r in mine if principal.is_operator or r.project_id == principal.project_id]
        busy = _gpu_numbers([g for r in mine for g in (r.gpu_ids or [])])
        out.append(
            {
                "id": worker.id,
                "object": "worker",
                "host": worker.host,
                "status": worker.status,
                "gpus": list(worker.gpus),
                "busy_gpus": busy,
                "serving_gpus": _gpu_numbers(serving.get(worker.host, [])),
                "slots": worker.slots,
                "running_jobs": len(mine),
                "running_job_ids": visible,
                "started_at": worker.started_at,
                "last_heartbeat_at": worker.heartbeat_at,
            }
        )
    return out


def database_ok(session: Session) -> str | None:
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means not ready
        return f"database: {type(exc).__name__}"
    return None


def broker_ok(settings: Settings, timeout: float = 2.0) -> str | None:
    from kombu import Connection

    try:
        with Connection(settings.resolved_broker_url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, timeout=timeout)
    except Exception as exc:  # kombu raises many kinds; any of them means not ready
        return f"broker: {type(exc).__name__}"
    return None


def job_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    counts = {s.value: 0 for s in JobStatus}
    counts.update({status: int(n) for status, n in rows})
    return counts


def events_ingested(session: Session) -> int:
    # Event ids only grow, so the highest id counts every event ever written (deletes included).
    return int(session.scalar(select(func.max(JobEvent.id))) or 0)


def online_workers(session: Session) -> int:
    return int(
        session.scalar(select(func.count()).select_from(WorkerNode).where(WorkerNode.status == "online")) or 0
    )
