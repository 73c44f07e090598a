"""Run Alembic migrations from code (server start-up, `twinkle-jobs migrate`, tests).

The Alembic environment is the `migrations` package, found by import, so an installed wheel
migrates as well as a source checkout; no alembic.ini is needed (the one at the repository's top
is for running the `alembic` command by hand).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
