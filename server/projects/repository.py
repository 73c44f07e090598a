"""SQL access for the admin API's lists and lookups (projects and tokens)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project
from server.common.pagination import newest_first_after


def project_by_ref(session: Session, ref: str) -> Project | None:
    """A project by id (`proj-...`) or, failing that, by name."""
    return session.scalars(
        select(Project)
        .where(or_(Project.id == ref, Project.name == ref))
        .order_by(Project.id != ref)
        .limit(1)
    ).first()


def list_projects(
    session: Session, only_id: str | None, after: tuple[datetime, str] | None, limit: int
) -> list[Project]:
    query = select(Project)
    if only_id is not None:
        query = query.where(Project.id == only_id)
    return list(session.scalars(newest_first_after(query, Project.created_at, Project.id, after, limit)))


def list_tokens(
    session: Session, project_id: str | None, after: tuple[datetime, str] | None, limit: int
) -> list[ApiToken]:
    query = select(ApiToken)
    if project_id is not None:
        query = query.where(ApiToken.project_id == project_id)
    return list(session.scalars(newest_first_after(query, ApiToken.created_at, ApiToken.id, after, limit)))
