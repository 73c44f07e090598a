"""Worker registration: each worker process is a row with its host, GPUs, slots and heartbeat.

A row's `started_at` is the OS creation time of the worker process, so another worker on the
same host can tell "that PID is still my predecessor" from "the PID was reused" (psutil reports
the creation time of whatever process holds the PID now).

That check assumes a machine name (`TWINKLE_WORKER_HOST`) stands for one machine, one PID
namespace: a worker takes the online rows of its name whose process it cannot see for dead
predecessors, and the reconciler requeues their jobs. Two machines (or containers) under one name
would do that to each other, so a worker starting under a name whose invisible rows still
heartbeat refuses to start (`worker_of_this_name_elsewhere`).
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import psutil
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import WorkerNode, utcnow
from jobcore.db.session import session_scope

ONLINE, OFFLINE, DEAD = "online", "offline", "dead"


def new_worker_id(host: str) -> str:
    return f"wkr-{host[:36]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def process_started_at(pid: int | None = None) -> datetime:
    return datetime.fromtimestamp(psutil.Process(pid or os.getpid()).create_time(), UTC)


def register(session: Session, worker_id: str, host: str, gpus: list[str], slots: int) -> WorkerNode:
    row = WorkerNode(
        id=worker_id,
        host=host,
        pid=os.getpid(),
        gpus=gpus,
        slots=slots,
        status=ONLINE,
        started_at=process_started_at(),
        heartbeat_at=utcnow(),
    )
    session.add(row)
    return row


def process_is_alive(row: WorkerNode) -> bool:
    """Whether the process this row describes still runs (call only for rows of this host)."""
    try:
        created = psutil.Process(row.pid).create_time()
    except psutil.Error:
        return False
    return abs(created - row.started_at.timestamp()) < 1.0


def _invisible_heartbeats(database_url: str, host: str, since: datetime) -> dict[str, datetime]:
    """{id: heartbeat} of the online rows of `host` that heartbeat after `since` and whose process
    this machine does not run."""
    with session_scope(database_url) as session:
        rows = session.scalars(
            select(WorkerNode).where(
                WorkerNode.host == host, WorkerNode.status == ONLINE, WorkerNode.heartbeat_at >= since
            )
        )
        return {row.id: row.heartbeat_at for row in rows if not process_is_alive(row)}


def worker_of_this_name_elsewhere(
    database_url: str,
    host: str,
    heartbeat_seconds: float,
    stale_after_seconds: float,
) -> str | None:
    """The id of a live worker registered under `host` that is not a process of this machine:
    one whose row is online, whose PID is not (or no longer) here, and whose heartbeat moves on
    within two heartbeats. None when there is none: a dead predecessor's heartbeat stands still,
    and costs a start this wait only while it is younger than `stale_after_seconds`."""
    since = utcnow() - timedelta(seconds=stale_after_seconds)
    suspects = _invisible_heartbeats(database_url, host, since)
    if not suspects:
        return None
    deadline = time.monotonic() + 2 * heartbeat_seconds + 0.5
    while time.monotonic() < deadline:
        time.sleep(min(0.5, heartbeat_seconds / 2))
        now = _invisible_heartbeats(database_url, host, since)
        for worker_id, heartbeat in now.items():
            if worker_id in suspects and heartbeat > suspects[worker_id]:
                return worker_id
    return None
