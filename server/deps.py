"""Request dependencies: the unit of work, the caller's identity and its scopes.

The session dependency owns the transaction: it commits after the endpoint returns (before the
response is sent, so a failed commit is never reported as success) and rolls back on any error.
Side effects that must only happen once the data is durable (waking a worker, deleting files)
are registered with `after_commit` and run right after the commit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from jobcore.settings import Settings
from server.auth.principal import Principal
from server.auth.ratelimit import RateLimiter
from server.auth.service import authenticate, cached_principal, principal_refresh_due
from server.common import after_response
from server.errors import Forbidden, RateLimited, Unauthorized

log = logging.getLogger(__name__)

T = TypeVar("T")

_AFTER_COMMIT = "after_commit"
_AFTER_ROLLBACK = "after_rollback"


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` once this session's transaction has committed (never if it rolls back)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def after_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` if the request fails and its transaction is rolled back (undo a file write)."""
    session.info.setdefault(_AFTER_ROLLBACK, []).append(callback)


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # the answer is decided; a failed side effect must not change it
            log.exception("after-transaction callback failed")


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _end(session: Session, commit: bool) -> None:
    """Commit (or roll back), close, then run the callbacks of the outcome. Blocking: in a thread."""
    committed = False
    try:
        if commit:
            session.commit()
            committed = True
    finally:
        if not committed:
            session.rollback()
        on_commit: list[Callable[[], None]] = session.info.pop(_AFTER_COMMIT, [])
        on_rollback: list[Callable[[], None]] = session.info.pop(_AFTER_ROLLBACK, [])
        session.close()
        _run_all(on_commit if committed else on_rollback)


def _idle(session: Session) -> bool:
    """Nothing to commit, roll back or call back: ending it does no I/O."""
    pending = _AFTER_COMMIT in session.info or _AFTER_ROLLBACK in session.info
    return not session.in_transaction() and not pending


async def _session(request: Request) -> AsyncIterator[Session]:
    # An async dependency: creating a Session does no I/O, so it costs no hop into the thread
    # pool (each hop is a GIL hand-over, measurable on a read). Ending it does I/O unless the
    # endpoint already ended its transaction (`run_read`); then that hop is skipped too.
    session: Session = request.app.state.session_factory()
    try:
        yield session
    except BaseException:
        with anyio.CancelScope(shield=True):  # a client that went away must not leak the connection
            await run_in_threadpool(_end, session, False)
        raise
    if _idle(session):
        session.close()
        return
    with anyio.CancelScope(shield=True):
        await run_in_threadpool(_end, session, True)


async def run_read(session: Session, work: Callable[[], T]) -> T:
    """Run a read endpoint's database work in the thread pool and end its transaction in the same
    hop, so that the session dependency has nothing left to do (one hop per request, not two).

    For reads only (the statements run in autocommit mode): nothing registered with
    `after_commit` may be pending (it would run later, from the dependency). A failure rolls
    back as usual.
    """

    def work_then_commit() -> T:
        if not session.in_transaction():
            # No BEGIN/COMMIT round trips for a read: each statement is its own snapshot (a page
            # and its queue places may be read a moment apart, as they could be a moment later).
            # A cache-miss authentication already opened a transaction: that one is committed.
            session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        result = work()
        assert _AFTER_COMMIT not in session.info, "run_read is for reads; use the session dependency"
        session.commit()
        return result

    return await run_in_threadpool(work_then_commit)


SessionDep = Annotated[Session, Depends(_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]

BEARER_DESCRIPTION = "An API token: `Authorization: Bearer <token>`"


def _authenticate_alone(
    session_factory: sessionmaker[Session], plain: str, reload: bool = False
) -> Principal | None:
    """A cache miss (or a refresh, `reload`): the token's row on a session of its own, its
    `last_used_at` stamp committed. Blocking: in a thread."""
    with session_factory() as session:
        principal = authenticate(session, plain, reload=reload)
        session.commit()
        return principal


class TokenAuth(SecurityBase):
    """The bearer-token authentication of one scope, as one dependency (`require(scope)`).

    A security scheme of its own rather than FastAPI's `HTTPBearer` plus a principal dependency
    with a request `Session` and a scope check: solving those four dependencies was the largest
    part of a cached read's CPU (docs/benchmarks.md, issue 17), and the `Session` was opened and
    closed for nothing whenever the principal came from the cache. Now a cached principal costs
    no `Session` and no I/O; a miss authenticates on a session of its own, in one thread hop,
    committed and closed before the endpoint runs; a cached principal past half its life is
    reloaded the same way after the response (`server.common.after_response`). Every router
    authenticates this way, so the endpoint's own `SessionDep` (if any) is never the
    authentication's. OpenAPI documents the same scheme as before (`HTTPBearer`).
    """

    def __init__(self, scope: str) -> None:
        self.model = HTTPBearerModel(description=BEARER_DESCRIPTION)
        self.scheme_name = "HTTPBearer"
        self.scope = scope

    async def __call__(self, request: Request) -> Principal:
        scheme, plain = get_authorization_scheme_param(request.headers.get("Authorization"))
        if scheme.lower() != "bearer" or not plain:
            raise Unauthorized(
                "missing bearer token: send 'Authorization: Bearer <token>'", code="missing_token"
            )
        engine = request.app.state.engine
        principal = cached_principal(engine, plain)
        if principal is None:
            principal = await run_in_threadpool(_authenticate_alone, request.app.state.session_factory, plain)
        elif principal_refresh_due(engine, plain):
            reload = functools.partial(
                run_in_threadpool, _authenticate_alone, request.app.state.session_factory, plain, True
            )
            after_response.defer(request, reload)
        if principal is None:
            raise Unauthorized("invalid, revoked or expired token")
        if principal.rate_limit_per_minute:
            limiter: RateLimiter = request.app.state.rate_limits
            verdict = await limiter.check(principal.token_id, principal.rate_limit_per_minute)
            request.state.rate_limit = verdict  # the X-RateLimit-* headers (server.common.ratelimit_headers)
            if not verdict.allowed:
                raise RateLimited(
                    f"rate limit of {principal.rate_limit_per_minute} requests per minute reached",
                    retry_after=verdict.retry_after or 1,
                )
        if not principal.has(self.scope):
            raise Forbidden(f"this operation needs a token with the '{self.scope}' scope")
        return principal


_AUTH = {scope: TokenAuth(scope) for scope in ("read", "write", "admin")}


def require(scope: str) -> TokenAuth:
    """A dependency that authenticates and checks that the token grants `scope`."""
    return _AUTH[scope]


ReadPrincipal = Annotated[Principal, Depends(require("read"))]
WritePrincipal = Annotated[Principal, Depends(require("write"))]
AdminPrincipal = Annotated[Principal, Depends(require("admin"))]
