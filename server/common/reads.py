"""Running a read endpoint's queries: on the event loop where the database allows it.

A read is a function of one `Connection` (Core statements, rows out). On PostgreSQL it runs on
the app's asyncio engine (`jobcore.db.session.make_read_engine`) through `run_sync`, which
drives the same synchronous code on the event loop with greenlets: no thread hop, no second copy
of the queries. On SQLite it runs in one hop into the thread pool on the synchronous engine.
Either way in autocommit mode: no BEGIN/COMMIT round trips; each statement is its own snapshot
(a page and its queue places may be read a moment apart, as they could be a moment later).

A lost connection surfaces as SQLAlchemy's `DBAPIError` with `connection_invalidated`, as on the
synchronous engine, so `server.common.middleware` retries the request once or answers 503.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic_core import to_json
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.concurrency import run_in_threadpool

from server.common.middleware import lost_connection

log = logging.getLogger(__name__)

T = TypeVar("T")

Read = Callable[[Connection], T]


def _read_in_thread(engine: Engine, read: Read[T]) -> T:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return read(conn)


async def _read_once(request: Request, read: Read[T]) -> T:
    read_engine: AsyncEngine | None = request.app.state.read_engine
    if read_engine is None:
        engine: Engine = request.app.state.engine
        return await run_in_threadpool(_read_in_thread, engine, read)
    async with read_engine.connect() as conn:
        return await conn.run_sync(read)


async def run_read(request: Request, read: Read[T]) -> T:
    """`read(connection)` on the app's read engine, or in one thread hop without one.

    A read that finds its pooled connection dead is run once more on a fresh one (SQLAlchemy
    has invalidated the pool by then): it only reads, so running it again is safe, and the
    request-level retry of the middleware stays for the authentication's statement, which runs
    on the other engine's pool and may meet a dead connection of its own.
    """
    try:
        return await _read_once(request, read)
    except DBAPIError as exc:
        if not lost_connection(exc):
            raise
        log.warning("database connection lost during a read; reading again on a fresh one")
    return await _read_once(request, read)


def json_body(payload: Any, status_code: int = 200) -> Response:
    """A JSON response of a payload that is already in its documented shape (plain dicts and
    lists, datetimes), encoded by pydantic-core as a `response_model` would be, without the
    model: FastAPI neither validates nor re-serializes a `Response` an endpoint returns."""
    return Response(to_json(payload), status_code=status_code, media_type="application/json")
