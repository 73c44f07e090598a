"""Alembic revisions (Alembic skips this file when it reads them)."""
