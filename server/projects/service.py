"""Admin use cases: projects and tokens. Services flush but never commit (the request does).

Tenancy: an admin token administers its own project; an admin token of the operator project
("default", where the bootstrap token lives) administers every project and alone may create
projects and set quotas. Anything of a project the caller may not administer answers 404, as if
it did not exist.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project
from server.auth import service as auth
from server.auth.principal import OPERATOR_PROJECT, Principal
from server.common.pagination import split_page
from server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from server.projects import repository
from server.projects.schemas import ProjectCreate, ProjectOut, ProjectUpdate, TokenCreate, TokenOut

QUOTAS = ("max_queued_jobs", "max_running_jobs")
# What the cluster charges a project's Slurm jobs to: the operator's to set, like a quota (an
# admin of the project could otherwise charge another team's account).
OPERATOR_FIELDS = (*QUOTAS, "slurm_account")


def _operator_only(principal: Principal, what: str) -> None:
    if not principal.is_operator:
        raise Forbidden(
            f"{what} needs an admin token of the operator project '{OPERATOR_PROJECT}'", code="operator_only"
        )


def get_project(session: Session, principal: Principal, ref: str, param: str = "project_id") -> Project:
    """The project named by id or name, if the caller administers it; else 404."""
    project = repository.project_by_ref(session, ref)
    if project is None or not (principal.is_operator or project.id == principal.project_id):
        raise NotFound(f"no project '{ref}' that this token administers", param=param)
    return project


def present_project(project: Project) -> ProjectOut:
    return ProjectOut(
        id=project.id,
        name=project.name,
        max_queued_jobs=project.max_queued_jobs,
        max_running_jobs=project.max_running_jobs,
        webhook_url=project.webhook_url,
        slurm_account=project.slurm_account,
        created_at=project.created_at,
    )


def create_project(session: Session, principal: Principal, body: ProjectCreate) -> Project:
    _operator_only(principal, "creating a project")
    if session.scalar(select(Project.id).where(Project.name == body.name)) is not None:
        raise Conflict(f"a project named '{body.name}' exists", param="name", code="project_exists")
    project = Project(
        name=body.name,
        max_queued_jobs=body.max_queued_jobs,
        max_running_jobs=body.max_running_jobs,
        webhook_url=body.webhook_url,
        slurm_account=body.slurm_account,
    )
    session.add(project)
    try:
        session.flush()
    except IntegrityError:  # two creates of one name at once: the loser wrote nothing else
        session.rollback()
        raise Conflict(f"a project named '{body.name}' exists", param="name", code="project_exists") from None
    return project


def list_projects(
    session: Session, principal: Principal, after: str | None, limit: int
) -> tuple[list[Project], bool]:
    only = None if principal.is_operator else principal.project_id
    cursor = None
    if after is not None:
        # An unknown cursor is bad input (422), as in every other list of the API.
        try:
            anchor = get_project(session, principal, after, param="after")
        except NotFound:
            raise InvalidRequest(
                f"after: no project '{after}' that this token administers", param="after"
            ) from None
        cursor = (anchor.created_at, anchor.id)
    return split_page(repository.list_projects(session, only, cursor, limit), limit)


def update_project(session: Session, principal: Principal, ref: str, body: ProjectUpdate) -> Project:
    project = get_project(session, principal, ref)
    changed = body.model_fields_set
    reserved = [field for field in OPERATOR_FIELDS if field in changed]
    if reserved and not principal.is_operator:
        what = "a quota" if reserved[0] in QUOTAS else "the account Slurm charges the project's jobs to"
        raise Forbidden(
            f"{reserved[0]} is {what}: only an admin of the operator project '{OPERATOR_PROJECT}' sets it",
            param=reserved[0],
            code="operator_only",
        )
    for field in (*OPERATOR_FIELDS, "webhook_url"):
        if field in changed:
            setattr(project, field, getattr(body, field))
    session.flush()
    return project


def rotate_webhook_secret(session: Session, principal: Principal, ref: str) -> tuple[Project, str]:
    project = get_project(session, principal, ref)
    return project, auth.rotate_webhook_secret(session, project)


def present_token(token: ApiToken) -> TokenOut:
    return TokenOut(
        id=token.id,
        project_id=token.project_id,
        name=token.name,
        scopes=list(token.scopes),
        rate_limit_per_minute=token.rate_limit_per_minute,
        expires_at=token.expires_at,
        created_at=token.created_at,
        last_used_at=token.last_used_at,
        revoked=token.revoked,
    )


def create_token(session: Session, principal: Principal, body: TokenCreate) -> tuple[str, ApiToken]:
    project = (
        get_project(session, principal, body.project, param="project")
        if body.project is not None
        else get_project(session, principal, principal.project_id)
    )
    try:
        return auth.create_token(
            session,
            project.name,
            list[str](body.scopes),
            body.name,
            rate_limit_per_minute=body.rate_limit_per_minute,
            expires_at=body.expires_at,
        )
    except ValueError as exc:  # only the expiry can still be wrong here: the schema checked the rest
        raise InvalidRequest(str(exc), param="expires_at") from None


def get_token(session: Session, principal: Principal, token_id: str, param: str = "token_id") -> ApiToken:
    token = session.get(ApiToken, token_id)
    if token is None or not (principal.is_operator or token.project_id == principal.project_id):
        raise NotFound(f"no token '{token_id}' that this token administers", param=param)
    return token


def list_tokens(
    session: Session, principal: Principal, project: str | None, after: str | None, limit: int
) -> tuple[list[ApiToken], bool]:
    if project is not None:
        project_id: str | None = get_project(session, principal, project, param="project").id
    else:
        project_id = None if principal.is_operator else principal.project_id
    cursor: tuple[datetime, str] | None = None
    if after is not None:
        try:
            anchor = get_token(session, principal, after, param="after")
        except NotFound:
            raise InvalidRequest(
                f"after: no token '{after}' that this token administers", param="after"
            ) from None
        cursor = (anchor.created_at, anchor.id)
    return split_page(repository.list_tokens(session, project_id, cursor, limit), limit)


def revoke_token(session: Session, principal: Principal, token_id: str) -> ApiToken:
    token = get_token(session, principal, token_id)
    return auth.revoke_token(session, token.id)
