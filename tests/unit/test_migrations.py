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
