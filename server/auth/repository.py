"""SQL access for projects and tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project


def project_by_name(session: Session, name: str) -> Project | None:
    return session.scalars(select(Project).where(Project.name == name)).one_or_none()


def project_by_id(session: Session, project_id: str) -> Project | None:
    return session.get(Project, project_id)


def token_by_hash(session: Session, token_hash: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.token_hash == token_hash)).one_or_none()


def principal_row(session: Session, token_hash: str) -> Row[Any] | None:
    """What authentication needs of a live token and its project, in one round trip (no ORM objects)."""
    query = (
        select(
            ApiToken.id,
            ApiToken.project_id,
            Project.name.label("project_name"),
            ApiToken.scopes,
            ApiToken.rate_limit_per_minute,
            ApiToken.last_used_at,
            ApiToken.expires_at,
        )
        .join(Project, Project.id == ApiToken.project_id)
        .where(ApiToken.token_hash == token_hash, ApiToken.revoked.is_(False))
    )
    return session.execute(query).one_or_none()


def touch_token(session: Session, token_id: str, now: datetime) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))


def token_in_project(session: Session, project_id: str, token_id: str) -> ApiToken | None:
    return session.scalars(
        select(ApiToken).where(ApiToken.id == token_id, ApiToken.project_id == project_id)
    ).one_or_none()


def tokens(session: Session, project_id: str | None = None) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    if project_id is not None:
        query = query.where(ApiToken.project_id == project_id)
    return list(session.scalars(query))
