"""`alembic upgrade head` on an empty database gives exactly the models' schema; downgrade works.

Runs on SQLite and (when configured) PostgreSQL. A model change without its migration, or a
migration that drifts from the models, fails here with the list of differences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from jobcore.db import migrate
from jobcore.db.models import Base


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def schema_differences(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "render_as_batch": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_there_is_one_head() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1, f"several Alembic heads: {script.get_heads()}"


def test_upgrade_head_matches_the_models_and_downgrade_base_empties(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    assert schema_differences(empty_db_url) == []
    assert set(Base.metadata.tables) <= tables(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    assert tables(empty_db_url) <= {"alembic_version"}
    migrate.upgrade(empty_db_url)  # and back up again: downgrades leave nothing behind that blocks it
    assert schema_differences(empty_db_url) == []


def test_schema_state_says_what_is_missing(empty_db_url: str) -> None:
    head = ScriptDirectory.from_config(migrate.alembic_config(empty_db_url)).get_current_head()
    assert migrate.schema_state(empty_db_url) == (False, "the database has no schema yet")
    migrate.upgrade(empty_db_url, "0001")
    ready, reason = migrate.schema_state(empty_db_url)
    assert (
        not ready and reason.startswith("the schema is at revision 0001") and reason.endswith(f"needs {head}")
    )
    migrate.upgrade(empty_db_url)
    assert migrate.schema_state(empty_db_url) == (True, f"schema at {head}")
    # A revision this code does not know is a newer server's: a worker may run on it.
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'from_the_future'")
    finally:
        engine.dispose()
    assert migrate.schema_state(empty_db_url)[0] is True


def test_an_unreachable_database_is_not_ready() -> None:
    ready, reason = migrate.schema_state("postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert not ready and reason.startswith("the database is not reachable")


def test_wait_for_schema_polls_with_back_off_until_migrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'late.db'}"
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the server migrates while the worker sleeps a third time
        slept.append(seconds)
        if len(slept) == 3:
            migrate.upgrade(url)

    with caplog.at_level("INFO", logger="jobcore.db.migrate"):
        assert migrate.wait_for_schema(url, sleep=sleep) is True
    assert slept == [1.0, 2.0, 4.0]
    waiting = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(waiting) == 1 and waiting[0].startswith("waiting for the database: the database has no schema")
    assert migrate.wait_for_schema(f"sqlite:///{tmp_path / 'never.db'}", should_stop=lambda: True) is False
