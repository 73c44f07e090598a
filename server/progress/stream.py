"""Server-Sent Events of a job's history, resumable with `Last-Event-ID`.

The stream polls SQL (the worker writes events there from another process, so there is nothing
in-process to subscribe to). It reads the job's status *before* the events: when that status is
terminal, every event up to the end is already committed, so a short read means the stream is
complete and may close.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from pydantic_core import to_json
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Job
from jobcore.jobs.states import TERMINAL, JobStatus
from server.jobs import repository
from server.progress.service import present_event

BATCH = 500
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamTiming:
    poll_seconds: float = 0.5
    keepalive_seconds: float = 15.0


def format_event(event_id: int | None, name: str, data: str) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


def _read(
    session_factory: Callable[[], Session], job_id: str, after: int
) -> tuple[str | None, list[str], int, bool]:
    """(status, formatted events, new cursor, whether every event so far was read)."""
    with session_factory() as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        rows = repository.list_events(session, job_id, after=after, limit=BATCH)
        drained = len(rows) <= BATCH
        chunks = []
        for row in rows[:BATCH]:
            payload = to_json(present_event(row)).decode()
            chunks.append(format_event(row["id"], row["type"], payload))
            after = row["id"]
        return status, chunks, after, drained


async def job_event_stream(
    session_factory: Callable[[], Session], job_id: str, last_event_id: int, timing: StreamTiming
) -> AsyncIterator[str]:
    after = last_event_id
    quiet = 0.0
    yield "retry: 2000\n\n"
    while True:
        try:
            status, chunks, after, drained = await anyio.to_thread.run_sync(
                _read, session_factory, job_id, after
            )
        except Exception:
            # The 200 is already sent: say so in the stream; the client reconnects with Last-Event-ID.
            log.exception("event stream of %s failed", job_id)
            yield format_event(None, "error", json.dumps({"message": "stream interrupted; reconnect"}))
            return
        for chunk in chunks:
            yield chunk
        if status is None or (drained and JobStatus(status) in TERMINAL):
            yield format_event(None, "end", json.dumps({"status": status}))
            return
        if chunks:
            quiet = 0.0
            continue
        await anyio.sleep(timing.poll_seconds)
        quiet += timing.poll_seconds
        if quiet >= timing.keepalive_seconds:
            quiet = 0.0
            yield ": keep-alive\n\n"
