"""Token lifecycle and authentication. Functions take a Session and never commit.

The CLI (`twinkle-jobs tokens create/list/revoke`) calls `create_token`, `list_tokens` and
`revoke_token` inside its own unit of work; the API calls `authenticate` on every request.
Authenticated principals are cached in process for a few seconds (`server.auth.cache`), so
anything that weakens a token must call `forget_principals`.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project, new_webhook_secret, utcnow
from server.auth import repository
from server.auth.cache import TtlCache, cache_for
from server.auth.principal import OPERATOR_PROJECT, Principal

SCOPES = ("read", "write", "admin")
# A scope grants itself and every weaker one: an admin token can also read and write.
IMPLIED: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"read", "write"}),
    "admin": frozenset({"read", "write", "admin"}),
}
TOKEN_PREFIX = "tj_"
DEFAULT_PROJECT = OPERATOR_PROJECT
# Writing last_used_at on every request would turn every read into a write; a minute is enough.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hash_token(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


def effective_scopes(scopes: list[str] | tuple[str, ...]) -> frozenset[str]:
    granted: set[str] = set()
    for scope in scopes:
        granted |= IMPLIED.get(scope, frozenset())
    return frozenset(granted)


def check_scopes(scopes: list[str] | tuple[str, ...]) -> list[str]:
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {', '.join(SCOPES)}; got {list(scopes)}")
    return sorted(set(scopes), key=SCOPES.index)


def get_or_create_project(session: Session, name: str) -> Project:
    project = repository.project_by_name(session, name)
    if project is not None:
        return project
    if not name or len(name) > 128:
        raise ValueError("project name must be 1 to 128 characters")
    project = Project(name=name)
    session.add(project)
    session.flush()
    return project


def create_token(
    session: Session,
    project_name: str,
    scopes: list[str] | tuple[str, ...] = ("read", "write"),
    name: str = "",
    *,
    rate_limit_per_minute: int | None = None,
    expires_at: datetime | None = None,
) -> tuple[str, ApiToken]:
    """Create a token in the project (created if missing). Returns the plain token, shown once.

    `expires_at` (timezone-aware, in the future) ends the token's life; None: it lives until revoked.
    """
    checked = check_scopes(scopes)
    if rate_limit_per_minute is not None and rate_limit_per_minute < 1:
        raise ValueError("rate_limit_per_minute must be at least 1")
    if expires_at is not None and (expires_at.tzinfo is None or expires_at <= utcnow()):
        raise ValueError("expires_at must be a timezone-aware time in the future")
    project = get_or_create_project(session, project_name)
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        project_id=project.id,
        token_hash=hash_token(plain),
        name=name,
        scopes=checked,
        rate_limit_per_minute=rate_limit_per_minute,
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return plain, token


def register_token(session: Session, plain: str, project_name: str, scopes: list[str], name: str) -> ApiToken:
    """Register a given plain token (the bootstrap token); idempotent."""
    existing = repository.token_by_hash(session, hash_token(plain))
    if existing is not None:
        return existing
    project = get_or_create_project(session, project_name)
    token = ApiToken(
        project_id=project.id, token_hash=hash_token(plain), name=name, scopes=check_scopes(scopes)
    )
    session.add(token)
    session.flush()
    return token


def list_tokens(session: Session, project_name: str | None = None) -> list[ApiToken]:
    """Tokens of one project (or all), oldest first. Hashes only; plain tokens are never stored."""
    if project_name is None:
        return repository.tokens(session)
    project = repository.project_by_name(session, project_name)
    if project is None:
        raise ValueError(f"no project named '{project_name}'")
    return repository.tokens(session, project.id)


def revoke_token(session: Session, token_id: str) -> ApiToken:
    """Revoke a token. This process stops accepting it at once; other processes within the
    principal cache's TTL (`server.auth.cache.TTL_SECONDS`)."""
    token = session.get(ApiToken, token_id)
    if token is None:
        raise ValueError(f"no token with id '{token_id}'")
    token.revoked = True
    session.flush()
    forget_principals(session)
    return token


def set_project_limits(
    session: Session, project_name: str, *, max_running_jobs: int | None, max_queued_jobs: int | None
) -> Project:
    """Limits on a project's concurrently running and waiting jobs (None = unlimited)."""
    for field, value in (("max_running_jobs", max_running_jobs), ("max_queued_jobs", max_queued_jobs)):
        if value is not None and value < 0:
            raise ValueError(f"{field} must be >= 0 or unset")
    project = get_or_create_project(session, project_name)
    project.max_running_jobs = max_running_jobs
    project.max_queued_jobs = max_queued_jobs
    session.flush()
    return project


def rotate_webhook_secret(session: Session, project: Project) -> str:
    """A new signing secret for the project's webhooks, returned once. Deliveries attempted from
    now on (retries of earlier ones included) are signed with it; the old one stops at once."""
    project.webhook_secret = new_webhook_secret()
    session.flush()
    return project.webhook_secret


def _cache(session: Session) -> TtlCache[Principal]:
    bind = session.get_bind()
    return cache_for(bind if isinstance(bind, Engine) else bind.engine)


def forget_principals(session: Session) -> None:
    """Drop this process's cached principals of the session's database, now and after its commit.

    Call it from anything that weakens a token (revoke, fewer scopes, a lower rate limit, a
    deleted project). Clearing again after the commit closes the window in which a concurrent
    request reads the old row before the commit and caches it (the cache's generation check
    refuses that put; this clears anything put before the first clear).
    """
    cache = _cache(session)
    cache.invalidate()
    event.listen(session, "after_commit", lambda _session: cache.invalidate(), once=True)


def cached_principal(engine: Engine, plain: str) -> Principal | None:
    """The principal from this process's cache of the engine's database, without a session or
    any I/O (None: ask the database, `authenticate`)."""
    if not plain or len(plain) > 512:
        return None
    principal = cache_for(engine).get(hash_token(plain))
    return None if principal is None or principal.expired(utcnow()) else principal


def principal_refresh_due(engine: Engine, plain: str) -> bool:
    """True for one request once the token's cached principal is past half its life: that request
    reloads it after its response (`authenticate(..., reload=True)`), so steady use never meets
    an expired entry (`server.common.ttl_cache`)."""
    return cache_for(engine).claim_refresh(hash_token(plain))


def authenticate(session: Session, plain: str, *, reload: bool = False) -> Principal | None:
    """The principal for a bearer token, or None when it is unknown or revoked.

    Served from the per-process cache (`server.auth.cache`: a revocation by another process is
    honoured within its TTL) or else loaded with one joined query; `reload` skips the cache (a
    refresh ahead of expiry), and a token found gone leaves it at once. `last_used_at` is written
    at most once per LAST_USED_RESOLUTION per token, and only when the row is read.
    """
    if not plain or len(plain) > 512:
        return None
    digest = hash_token(plain)
    cache = _cache(session)
    now = utcnow()
    principal = None if reload else cache.get(digest)
    if principal is not None:
        return None if principal.expired(now) else principal
    generation = cache.generation
    row = repository.principal_row(session, digest)
    if row is None or (row.expires_at is not None and now >= row.expires_at):
        cache.discard(digest)
        return None
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        repository.touch_token(session, row.id, now)
    principal = Principal(
        token_id=row.id,
        project_id=row.project_id,
        project_name=row.project_name,
        scopes=effective_scopes(list(row.scopes)),
        rate_limit_per_minute=row.rate_limit_per_minute,
        expires_at=row.expires_at,
    )
    cache.put(digest, principal, generation)
    return principal
