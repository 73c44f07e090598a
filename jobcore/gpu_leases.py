"""GPU leases shared by every process of a machine: training workers and serving hosts.

A worker keeps its own in-process ledger of which GPU runs which job (`worker.gpus`); this table
makes the same GPUs one holder's at a time across processes, so that a serving host started on a
worker's machine takes GPUs the worker then does not give to training, and the other way round.

- A taker reads what others hold (`held_elsewhere`), picks free GPUs, and inserts one row per GPU
  (`take`) in the transaction that commits its decision (a worker: the job's claim). The primary
  key (host, gpu_id) settles a race: the second insert fails, its transaction rolls back, and the
  loser chooses again.
- The owner refreshes its rows with its heartbeat (`refresh`). A row whose heartbeat is older than
  `stale_after_seconds` holds nothing (its owner died without releasing it): it is ignored by
  readers, replaced by the next taker and deleted by the reconciler (`drop_stale`).
- `release` deletes rows when a job ends or a host stops.

The GPU ids are those of the machine's pool: `TWINKLE_WORKER_GPUS` when set (tests declare pretend
ids on a CPU machine), else `CUDA_VISIBLE_DEVICES`, else `nvidia-smi` (`discover_gpus`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from jobcore.db.models import GpuLease, utcnow

JOB, SERVING = "job", "serving"


def discover_gpus(configured: str | None) -> list[str]:
    """The GPU ids of this machine's pool, in order (without importing torch)."""
    if configured is not None:
        return [g.strip() for g in configured.split(",") if g.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _fresh_since(stale_after_seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=stale_after_seconds)


def held_elsewhere(session: Session, host: str, owner: str, stale_after_seconds: float) -> set[str]:
    """The GPUs of `host` that live leases of other owners hold."""
    rows = session.scalars(
        select(GpuLease.gpu_id).where(
            GpuLease.host == host,
            GpuLease.owner != owner,
            GpuLease.heartbeat_at > _fresh_since(stale_after_seconds),
        )
    )
    return set(rows)


def take(
    session: Session,
    host: str,
    owner: str,
    holder: str,
    kind: str,
    gpu_ids: Collection[str],
    stale_after_seconds: float,
) -> None:
    """Record `gpu_ids` of `host` as `holder`'s, flushed at once: an `IntegrityError` here (or at
    commit) means another owner took one of them since `held_elsewhere` was read.

    Rows of the same GPUs that are stale, or this owner's own (left by a release that failed; the
    owner's ledger is the truth for its own GPUs), are replaced."""
    if not gpu_ids:
        return
    session.execute(
        delete(GpuLease).where(
            GpuLease.host == host,
            GpuLease.gpu_id.in_(list(gpu_ids)),
            or_(GpuLease.owner == owner, GpuLease.heartbeat_at <= _fresh_since(stale_after_seconds)),
        )
    )
    now = utcnow()
    session.add_all(
        GpuLease(
            host=host, gpu_id=g, owner=owner, holder=holder, kind=kind, acquired_at=now, heartbeat_at=now
        )
        for g in gpu_ids
    )
    session.flush()


def refresh(session: Session, owner: str, holders: Collection[str] | None = None) -> int:
    """Keep the owner's leases (of `holders` only, when given) alive; returns how many it has."""
    query = update(GpuLease).where(GpuLease.owner == owner)
    if holders is not None:
        if not holders:
            return 0
        query = query.where(GpuLease.holder.in_(list(holders)))
    return int(session.execute(query.values(heartbeat_at=utcnow())).rowcount)  # type: ignore[attr-defined]


def release(session: Session, owner: str, holder: str | None = None) -> None:
    """Give back the owner's leases (those of `holder` only, when given)."""
    query = delete(GpuLease).where(GpuLease.owner == owner)
    if holder is not None:
        query = query.where(GpuLease.holder == holder)
    session.execute(query)


def drop_stale(session: Session, stale_after_seconds: float) -> int:
    """Delete leases whose owner stopped refreshing them (it died); returns how many."""
    result = session.execute(
        delete(GpuLease).where(GpuLease.heartbeat_at <= _fresh_since(stale_after_seconds))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def serving_gpus(session: Session, stale_after_seconds: float) -> dict[str, list[str]]:
    """The GPUs live serving leases hold, by host: what the cluster view shows as serving."""
    query = (
        select(GpuLease.host, GpuLease.gpu_id)
        .where(GpuLease.kind == SERVING, GpuLease.heartbeat_at > _fresh_since(stale_after_seconds))
        .order_by(GpuLease.host, GpuLease.gpu_id)
    )
    held: dict[str, list[str]] = {}
    for host, gpu in session.execute(query):
        held.setdefault(host, []).append(gpu)
    return held


def held_by(session: Session, host: str) -> dict[str, tuple[str, str]]:
    """Every lease row of `host` (live or not): {gpu id: (kind, holder)}; for tests and operators."""
    query = select(GpuLease.gpu_id, GpuLease.kind, GpuLease.holder).where(GpuLease.host == host)
    rows = session.execute(query)
    return {gpu: (kind, holder) for gpu, kind, holder in rows}
