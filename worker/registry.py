"""Worker registration: each worker process is a row with its host, GPUs, slots and heartbeat.

A row's `started_at` is the OS creation time of the worker process, so another worker on the
same host can tell "that PID is still my predecessor" from "the PID was reused" (psutil reports
the creation time of whatever process holds the PID now).
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

import psutil
from sqlalchemy.orm import Session

from jobcore.db.models import WorkerNode, utcnow

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
