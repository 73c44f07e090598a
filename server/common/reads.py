"""Running a read endpoint's queries: on the event loop where the database allows it.

A read is a function of one `Connection` (Core statements, rows out). On PostgreSQL it runs on
the app's asyncio engine (`jobcore.db.session.make_read_engine`) in a greenlet, as `run_sync`
does, which drives the same synchronous code on the event loop: no thread hop, no second copy
of the queries. On SQLite it runs in one hop into the thread pool on the synchronous engine.
Either way in autocommit mode: no BEGIN/COMMIT round trips; each statement is its own snapshot
(a page and its queue places may be read a moment apart, as they could be a moment later).

A lost connection surfaces as SQLAlchemy's `DBAPIError` with `connection_invalidated`, as on the
synchronous engine, so `server.common.middleware` retries the request once or answers 503.

The hottest statements (`RawStatement`: the job read, the list page, the event and metric pages)
skip SQLAlchemy's execution and result layers on that engine and run straight on its psycopg
connection (`fetch_tuples`, `fetch_mappings`): compiled once, rows as psycopg's tuples. Anywhere
else (SQLite, an ORM session) they run through Core as any statement does, with the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from fastapi import Request, Response
from psycopg.rows import tuple_row
from pydantic_core import to_json
from sqlalchemy import Connection, Dialect, Engine, Select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import await_, greenlet_spawn
from starlette.concurrency import run_in_threadpool

from server.common.middleware import lost_connection

log = logging.getLogger(__name__)

T = TypeVar("T")

Read = Callable[[Connection], T]


def _read_in_thread(engine: Engine, read: Read[T]) -> T:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return read(conn)


def _read_in_greenlet(engine: Engine, read: Read[T]) -> T:
    with engine.connect() as conn:  # the read engine is in autocommit mode
        return read(conn)


async def _read_once(request: Request, read: Read[T]) -> T:
    read_engine: AsyncEngine | None = request.app.state.read_engine
    if read_engine is None:
        engine: Engine = request.app.state.engine
        return await run_in_threadpool(_read_in_thread, engine, read)
    # The checkout, the read and the checkin in one greenlet, as `AsyncConnection.run_sync`
    # runs a read; `async with read_engine.connect()` around it would spawn two more.
    return await greenlet_spawn(_read_in_greenlet, read_engine.sync_engine, read)


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


class RawStatement:
    """A Core select that a hot read runs on every request, for `fetch_tuples`/`fetch_mappings`.

    Build it once (at import or in an `lru_cache`d builder, like the statements it wraps): its
    PostgreSQL text is compiled on first use and kept. A statement with an `expanding` IN list
    always runs through Core: its placeholders are only known per execution.
    """

    def __init__(self, select: Select[Any]) -> None:
        self.select = select
        self.keys = tuple(select.selected_columns.keys())
        self._compiled: tuple[str, dict[str, Any]] | None = None
        self._expanding = False

    def compiled(self, db: Connection) -> tuple[str, dict[str, Any]] | None:
        """(SQL with psycopg's `%(name)s` placeholders, the values of its constant parameters),
        or None for a statement that only Core can run."""
        if self._compiled is None and not self._expanding:
            compiled = self.select.compile(dialect=db.dialect)
            assert isinstance(compiled, SQLCompiler)  # what a select compiles to
            self._expanding = bool(compiled.post_compile_params)
            defaults = {
                key: _as_driver_takes_it(compiled, db.dialect, key, value)
                for key, value in compiled.params.items()
                if value is not None
            }
            self._compiled = None if self._expanding else (compiled.string, defaults)
        return self._compiled


def _as_driver_takes_it(compiled: SQLCompiler, dialect: Dialect, key: str, value: Any) -> Any:
    """A constant of the statement as the driver takes it: SQLAlchemy runs each bound value through
    its type's bind processor before execution, and so must a read that skips SQLAlchemy (a JSON
    path is a Python tuple until PostgreSQL's processor makes it the `text[]` literal `#>>` takes;
    psycopg alone would send the tuple as a record)."""
    bind = compiled.binds.get(key)
    process = None if bind is None else bind.type.dialect_impl(dialect).bind_processor(dialect)
    return value if process is None else process(value)


async def _fetch(
    conn: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    async with conn.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(sql, params)
        return await cursor.fetchall()


def _raw_connection(db: Connection | Session) -> psycopg.AsyncConnection[Any] | None:
    """The psycopg connection under a read engine's connection (None: run through Core)."""
    if not isinstance(db, Connection) or not db.dialect.is_async or db.dialect.driver != "psycopg":
        return None
    driver = db.connection.driver_connection
    return driver if isinstance(driver, psycopg.AsyncConnection) else None


def fetch_tuples(
    db: Connection | Session, statement: RawStatement, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """The rows of `statement` as tuples in its column order.

    On the read engine, straight through psycopg on the event loop (`await_` from the
    `run_sync` greenlet). Should that fail, the statement is run once more through Core, which
    raises what any statement raises (a lost connection: `DBAPIError` with
    `connection_invalidated`, the pool invalidated, so `run_read` reads again on a fresh one).
    """
    raw = _raw_connection(db)
    compiled = statement.compiled(db) if raw is not None and isinstance(db, Connection) else None
    if raw is not None and compiled is not None:
        sql, defaults = compiled
        try:
            return await_(_fetch(raw, sql, {**defaults, **params}))
        except psycopg.Error:
            log.debug(
                "a raw read failed; running it through SQLAlchemy for its error handling", exc_info=True
            )
        except BaseException:
            # Cancelled mid-statement (the client went away): a result may still be pending on
            # the connection, so it is not pooled again; SQLAlchemy does the same for its own.
            db.invalidate()
            raise
    return [tuple(row) for row in db.execute(statement.select, params)]


def fetch_mappings(
    db: Connection | Session, statement: RawStatement, params: dict[str, Any]
) -> list[Mapping[str, Any]]:
    """The rows of `statement` as mappings of its column names (`fetch_tuples` as dicts)."""
    keys = statement.keys
    return [dict(zip(keys, row, strict=True)) for row in fetch_tuples(db, statement, params)]
