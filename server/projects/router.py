"""HTTP routes of the admin API: `/v1/projects` and `/v1/tokens` (scope `admin`).

Two flat resources beside `/v1/jobs` and `/v1/files` rather than an `/v1/admin/...` tree: a
project admin manages its own project and tokens through the same routes an operator uses for
every project, and a token id is global, so it needs no project in its path.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT
from server.deps import AdminPrincipal, SessionDep
from server.errors import error_responses
from server.projects import service
from server.projects.schemas import (
    ProjectCreate,
    ProjectList,
    ProjectOut,
    ProjectUpdate,
    ProjectWithSecret,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenOut,
)

projects_router = APIRouter(prefix="/v1/projects", tags=["projects"])
tokens_router = APIRouter(prefix="/v1/tokens", tags=["tokens"])

ProjectRef = Annotated[str, Path(max_length=128, description="A project id (proj-...) or its name")]
TokenId = Annotated[str, Path(max_length=64, description="A token id (tok-...)")]
AUTH_ERRORS = (401, 403, 429)
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]


def _with_secret(project: ProjectOut, secret: str) -> ProjectWithSecret:
    return ProjectWithSecret(**project.model_dump(), webhook_secret=secret)


@projects_router.post(
    "",
    operation_id="createProject",
    status_code=201,
    response_model=ProjectWithSecret,
    responses=error_responses(*AUTH_ERRORS, 409, 422),
)
def create_project(body: ProjectCreate, session: SessionDep, principal: AdminPrincipal) -> ProjectWithSecret:
    """Create a project (operator only). The answer holds its webhook secret, the only time it is shown."""
    project = service.create_project(session, principal, body)
    return _with_secret(service.present_project(project), project.webhook_secret)


@projects_router.get(
    "", operation_id="listProjects", response_model=ProjectList, responses=error_responses(*AUTH_ERRORS, 422)
)
def list_projects(
    session: SessionDep,
    principal: AdminPrincipal,
    after: Annotated[
        str | None, Query(max_length=128, description="The last project id of the previous page")
    ] = None,
    limit: Limit = DEFAULT_LIMIT,
) -> ProjectList:
    """The projects this token administers (an operator: all of them), newest first; no secrets."""
    rows, has_more = service.list_projects(session, principal, after, limit)
    data = [service.present_project(p) for p in rows]
    return ProjectList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@projects_router.get(
    "/{project_id}",
    operation_id="getProject",
    response_model=ProjectOut,
    responses=error_responses(*AUTH_ERRORS, 404),
)
def get_project(project_id: ProjectRef, session: SessionDep, principal: AdminPrincipal) -> ProjectOut:
    """A project, without its webhook secret (never readable after creation or rotation)."""
    return service.present_project(service.get_project(session, principal, project_id))


@projects_router.patch(
    "/{project_id}",
    operation_id="updateProject",
    response_model=ProjectOut,
    responses=error_responses(*AUTH_ERRORS, 404, 422),
)
def update_project(
    project_id: ProjectRef, body: ProjectUpdate, session: SessionDep, principal: AdminPrincipal
) -> ProjectOut:
    """Change the quotas and the Slurm account (operator only) or the default webhook URL; fields not
    sent stay as they are."""
    return service.present_project(service.update_project(session, principal, project_id, body))


@projects_router.post(
    "/{project_id}/rotate-webhook-secret",
    operation_id="rotateProjectWebhookSecret",
    response_model=ProjectWithSecret,
    responses=error_responses(*AUTH_ERRORS, 404),
)
def rotate_webhook_secret(
    project_id: ProjectRef, session: SessionDep, principal: AdminPrincipal
) -> ProjectWithSecret:
    """Replace the webhook secret; the answer holds the new one, the only time it is shown.
    Deliveries attempted from now on are signed with it, and the old one is forgotten."""
    project, secret = service.rotate_webhook_secret(session, principal, project_id)
    return _with_secret(service.present_project(project), secret)


@tokens_router.post(
    "",
    operation_id="createToken",
    status_code=201,
    response_model=TokenCreated,
    responses=error_responses(*AUTH_ERRORS, 404, 422),
)
def create_token(body: TokenCreate, session: SessionDep, principal: AdminPrincipal) -> TokenCreated:
    """Create a token in a project this token administers; the plain token is shown only here."""
    plain, token = service.create_token(session, principal, body)
    return TokenCreated(**service.present_token(token).model_dump(), token=plain)


@tokens_router.get(
    "", operation_id="listTokens", response_model=TokenList, responses=error_responses(*AUTH_ERRORS, 404, 422)
)
def list_tokens(
    session: SessionDep,
    principal: AdminPrincipal,
    project: Annotated[
        str | None,
        Query(
            max_length=128, description="Project id or name; default: every project this token administers"
        ),
    ] = None,
    after: Annotated[
        str | None, Query(max_length=64, description="The last token id of the previous page")
    ] = None,
    limit: Limit = DEFAULT_LIMIT,
) -> TokenList:
    """Tokens, revoked ones included, newest first; never a secret (only hashes are stored)."""
    rows, has_more = service.list_tokens(session, principal, project, after, limit)
    data = [service.present_token(t) for t in rows]
    return TokenList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@tokens_router.get(
    "/{token_id}",
    operation_id="getToken",
    response_model=TokenOut,
    responses=error_responses(*AUTH_ERRORS, 404),
)
def get_token(token_id: TokenId, session: SessionDep, principal: AdminPrincipal) -> TokenOut:
    return service.present_token(service.get_token(session, principal, token_id))


@tokens_router.post(
    "/{token_id}/revoke",
    operation_id="revokeToken",
    response_model=TokenOut,
    responses=error_responses(*AUTH_ERRORS, 404),
)
def revoke_token(token_id: TokenId, session: SessionDep, principal: AdminPrincipal) -> TokenOut:
    """Revoke a token (idempotent). Refused at once by this server process, by the others within
    the principal cache's 5 seconds."""
    return service.present_token(service.revoke_token(session, principal, token_id))
