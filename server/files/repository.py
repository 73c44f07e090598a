"""SQL access for uploaded files, scoped to a project."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import File
from server.common.pagination import newest_first_after


def get_file(session: Session, project_id: str, file_id: str) -> File | None:
    return session.scalars(
        select(File).where(File.id == file_id, File.project_id == project_id)
    ).one_or_none()


def file_by_idempotency_key(session: Session, project_id: str, key: str) -> File | None:
    query = select(File).where(File.project_id == project_id, File.idempotency_key == key)
    return session.scalars(query).one_or_none()


def list_files(
    session: Session, project_id: str, *, purpose: str | None, after: tuple[datetime, str] | None, limit: int
) -> list[File]:
    query = select(File).where(File.project_id == project_id)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    return list(session.scalars(newest_first_after(query, File.created_at, File.id, after, limit)))
