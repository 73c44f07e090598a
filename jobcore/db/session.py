"""Engine and session factory for the configured database.

SQLite (the embedded default) is shared by the server and worker processes, so it runs in WAL
mode with a busy timeout; without them concurrent writers fail with "database is locked".

Stale server connections (PostgreSQL restarted, a backend terminated, an idle timeout on the
way): the API server's engine does not ping on every checkout (`pool_pre_ping` costs a round
trip per request); it recycles connections after `POOL_RECYCLE_SECONDS` and, when a statement
fails on a dead connection, SQLAlchemy invalidates the whole pool and
`server.common.middleware` retries an idempotent request once, or answers 503. The worker and
the CLI (`get_engine`, `session_scope`) have no such retry, so they keep the pre-ping: their
few statements a second do not notice the extra round trip.

The API's hot reads (a job, a page of jobs, events, metrics) run on a second, asyncio engine
(`make_read_engine`) where the database is PostgreSQL: psycopg's async mode on the server's own
event loop, so a read costs no hop into the thread pool (each hop is a GIL hand-over). It runs
in autocommit mode, since it only ever reads: no BEGIN/COMMIT round trips, each statement its
own snapshot. SQLite keeps the synchronous engine (see `make_read_engine`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from pydantic_core import from_json
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session, sessionmaker


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


# Below the idle timeouts of common proxies and managed databases (30 minutes or more).
POOL_RECYCLE_SECONDS = 1800


def make_engine(url: str, *, pre_ping: bool = False) -> Engine:
    """The engine of the API server by default (no pre-ping, see above)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url, pool_pre_ping=pre_ping, pool_recycle=POOL_RECYCLE_SECONDS, pool_size=10, max_overflow=20
    )


def make_read_engine(url: str) -> AsyncEngine | None:
    """The API's asyncio engine for reads, or None where the synchronous engine serves them.

    PostgreSQL only, always through psycopg (3), whose async mode SQLAlchemy drives on the
    running event loop. SQLite: its driver has no async mode, and aiosqlite runs every call in
    a thread of its own, which would cost a thread hand-over per statement instead of one per
    request; the embedded default serves one user, so it keeps the one-hop synchronous path.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    return create_async_engine(
        parsed.set(drivername="postgresql+psycopg"),
        isolation_level="AUTOCOMMIT",
        # JSON columns decoded in Rust: the stdlib's json.loads was 15% of a list page's CPU.
        json_deserializer=from_json,
        pool_recycle=POOL_RECYCLE_SECONDS,
        pool_size=10,
        max_overflow=20,
    )


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    """The shared engine of a worker or CLI process (pings before each checkout)."""
    return make_engine(url, pre_ping=True)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A unit of work: commit on success, roll back on any exception."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
