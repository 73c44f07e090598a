#!/usr/bin/env python3
"""Container health checks: `twinkle-healthcheck server` and `twinkle-healthcheck worker`.

server: GET /healthz on the API inside the container (the slim image has no curl).

worker: a worker is healthy when this container holds a live worker process whose row in the
`workers` table has a heartbeat younger than `TWINKLE_STALE_AFTER_SECONDS`, the same age at which
the reconciler declares a worker lost. This checks what matters (the worker's loop is running and
reaches the database) on every broker; `celery inspect ping` needs broadcast, which the embedded
SQLite broker lacks, and would only prove that the broker connection is alive.

Exit status 0 = healthy, 1 = unhealthy; the one line printed ends up in `docker inspect`.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_SERVER_URL = "http://127.0.0.1:8000/healthz"


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    reason: str


def check_server(url: str, timeout: float = 5.0) -> Verdict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return Verdict(False, f"{url} answered {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        return Verdict(False, f"{url} unreachable: {exc}")
    if status != 200:
        return Verdict(False, f"{url} answered {status}")
    return Verdict(True, f"{url} answered 200")


def process_alive(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """True when `pid` is a running (not zombie) process in this PID namespace."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may contain spaces.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def check_worker(
    database_url: str, host: str, stale_after_seconds: float, now: datetime | None = None
) -> Verdict:
    """Healthy when a worker row of `host` belongs to a live local process and heartbeated recently."""
    from sqlalchemy import select

    from jobcore.db.models import WorkerNode
    from jobcore.db.session import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(WorkerNode.id, WorkerNode.pid, WorkerNode.heartbeat_at).where(WorkerNode.host == host)
            ).all()
    except Exception as exc:  # any driver error means the worker cannot reach its database either
        return Verdict(False, f"database unreachable: {type(exc).__name__}: {exc}")
    finally:
        engine.dispose()
    now = now or datetime.now(UTC)  # after the query, so a heartbeat written meanwhile is not "in the future"
    live = [row for row in rows if process_alive(row.pid)]
    if not live:
        return Verdict(False, f"no live worker process of host {host!r} is registered in the workers table")
    newest = max(live, key=lambda row: _as_utc(row.heartbeat_at))
    age = (now - _as_utc(newest.heartbeat_at)).total_seconds()
    if age > stale_after_seconds:
        return Verdict(
            False, f"worker {newest.id} heartbeat is {age:.0f} s old (limit {stale_after_seconds:.0f} s)"
        )
    return Verdict(True, f"worker {newest.id} (pid {newest.pid}) heartbeat {age:.1f} s ago")


def _as_utc(value: datetime) -> datetime:
    # The column type already returns aware UTC values; this guard keeps a naive value (a hand-made
    # row, another writer) from raising on the subtraction instead of being judged.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["server"]:
        verdict = check_server(os.environ.get("TWINKLE_HEALTHCHECK_URL", DEFAULT_SERVER_URL))
    elif args == ["worker"]:
        from jobcore.settings import Settings

        settings = Settings()
        verdict = check_worker(
            settings.resolved_database_url, settings.worker_host, settings.stale_after_seconds
        )
    else:
        print("usage: twinkle-healthcheck server|worker", file=sys.stderr)
        return 2
    print(("healthy: " if verdict.healthy else "unhealthy: ") + verdict.reason)
    return 0 if verdict.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
