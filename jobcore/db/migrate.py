"""Run Alembic migrations from code (server start-up, `twinkle-jobs migrate`, tests).

The Alembic environment is the `migrations` package, found by import, so an installed wheel
migrates as well as a source checkout; no alembic.ini is needed (the one at the repository's top
is for running the `alembic` command by hand).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
# Back-off of `wait_for_schema`: doubled per poll from the minimum up to the maximum.
WAIT_MIN_SECONDS = 1.0
WAIT_MAX_SECONDS = 30.0

log = logging.getLogger(__name__)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def schema_state(url: str) -> tuple[bool, str]:
    """Whether the database at `url` has the schema this code needs: (ready, why not / what).

    Not ready: the database cannot be reached, has no schema yet, or is at an older revision
    than this code's head (the server, which migrates at start, has not run yet or is older).
    A revision this code does not know is a newer server's: ready, said in the reason.
    """
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            current = _current_revision(connection)
    except SQLAlchemyError as exc:
        return False, f"the database is not reachable ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    finally:
        engine.dispose()
    scripts = ScriptDirectory.from_config(alembic_config(url))
    head = scripts.get_current_head()
    if current is None:
        return False, "the database has no schema yet"
    if current == head:
        return True, f"schema at {head}"
    known = {script.revision for script in scripts.walk_revisions()}
    if current in known:
        return False, f"the schema is at revision {current}, this code needs {head}"
    return True, f"schema at {current}, newer than this code's {head}"


def _current_revision(connection: Connection) -> str | None:
    # Read where Alembic keeps it rather than through a MigrationContext, whose set-up logs two
    # INFO lines ("Context impl ...") per check: every worker and serving host printed them at start.
    if not inspect(connection).has_table("alembic_version"):
        return None
    revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return None if revision is None else str(revision)


def wait_for_schema(
    url: str,
    should_stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Block until `schema_state(url)` is ready (True) or `should_stop()` (False).

    For a worker started before the server has migrated a fresh database, as an orchestrator
    starts them: it says once, per reason, what it waits for, and polls with back-off instead of
    dying on `relation "workers" does not exist`.
    """
    delay, said = WAIT_MIN_SECONDS, ""
    while not should_stop():
        ready, reason = schema_state(url)
        if ready:
            if said:
                log.info("database ready (%s)", reason)
            return True
        if reason != said:
            log.warning(
                "waiting for the database: %s; the server migrates it at start (or run "
                "`twinkle-jobs migrate`); retrying with back-off up to %.0f s",
                reason,
                WAIT_MAX_SECONDS,
            )
            said = reason
        sleep(delay)
        delay = min(delay * 2, WAIT_MAX_SECONDS)
    return False
