"""`twinkle-jobs tokens create|list|revoke`: API token administration.

These commands talk to the database directly (not to a server), so they work before any token
exists and need no token themselves. A plain token is printed once, by `create`; `list` shows
everything about a token except its secret, which is not stored (only its SHA-256 is).

Revocation is committed at once; a running server process keeps accepting a token it had
authenticated for at most the principal cache's TTL (`server.auth.cache.TTL_SECONDS`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project
from jobcore.settings import get_settings
from server.auth.cache import TTL_SECONDS
from server.auth.service import create_token, list_tokens, revoke_token

OUTPUT = click.option(
    "--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True
)


@click.group()
def tokens() -> None:
    """Create, list and revoke API tokens (admin; talks to the database directly)."""


def _database_url() -> str:
    from jobcore.db.migrate import upgrade

    settings = get_settings()
    upgrade(settings.resolved_database_url)  # an admin command may be the first thing ever run
    return settings.resolved_database_url


@tokens.command("create")
@click.option("--project", required=True, help="Project the token belongs to (created if new)")
@click.option("--scope", "scopes", multiple=True, default=("read", "write"), show_default=True)
@click.option("--name", default="", help="A label for the token")
@OUTPUT
def tokens_create(project: str, scopes: tuple[str, ...], name: str, output: str) -> None:
    """Create a token; it is printed once and stored only as a hash."""
    from jobcore.db.session import session_scope

    with session_scope(_database_url()) as session:
        try:
            plain, row = create_token(session, project, list(scopes), name)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        info: dict[str, Any] = {"token": plain, "id": row.id, "project": project, "scopes": row.scopes}
    click.echo(json.dumps(info) if output == "json" else f"{plain}\n(id {info['id']}, project {project})")


def _describe(token: ApiToken, project_names: dict[str, str]) -> dict[str, Any]:
    """Everything an admin needs to recognise a token, never its hash or secret."""
    return {
        "id": token.id,
        "name": token.name,
        "project": project_names.get(token.project_id, token.project_id),
        "scopes": list(token.scopes),
        "rate_limit_per_minute": token.rate_limit_per_minute,
        "created_at": _iso(token.created_at),
        "last_used_at": _iso(token.last_used_at),
        "revoked": token.revoked,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def _project_names(session: Session) -> dict[str, str]:
    return {row.id: row.name for row in session.execute(select(Project.id, Project.name))}


def _cell(column: str, value: Any) -> str:
    if column == "scopes":
        return ",".join(value)
    if column == "revoked":
        return "yes" if value else "no"
    return "-" if value is None else str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns = ("id", "name", "project", "scopes", "created_at", "last_used_at", "revoked")
    headers = ["id", "name", "project", "scopes", "created", "last used", "revoked"]
    cells = [[_cell(c, row[c]) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return lines


@tokens.command("list")
@click.option("--project", default=None, help="Only this project's tokens (default: every project)")
@click.option("--include-revoked/--live-only", default=True, show_default=True)
@OUTPUT
def tokens_list(project: str | None, include_revoked: bool, output: str) -> None:
    """List tokens (id, name, project, scopes, created, last used, revoked); never the secret."""
    from jobcore.db.session import session_scope

    with session_scope(_database_url()) as session:
        try:
            rows = list_tokens(session, project)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        names = _project_names(session)
        described = [_describe(t, names) for t in rows if include_revoked or not t.revoked]
    if output == "json":
        click.echo(json.dumps(described))
    elif not described:
        click.echo("no tokens")
    else:
        click.echo("\n".join(_table(described)))


def _find_by_name(session: Session, project: str, name: str) -> ApiToken:
    try:
        candidates = [t for t in list_tokens(session, project) if t.name == name and not t.revoked]
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if not candidates:
        raise click.ClickException(f"no live token named '{name}' in project '{project}'")
    if len(candidates) > 1:
        ids = ", ".join(t.id for t in candidates)
        raise click.ClickException(
            f"{len(candidates)} live tokens are named '{name}' in project '{project}' ({ids}); revoke by id"
        )
    return candidates[0]


@tokens.command("revoke")
@click.argument("token_id", required=False)
@click.option("--project", default=None, help="With --name: the project of the named token")
@click.option("--name", default=None, help="Revoke the project's one live token with this name")
@OUTPUT
def tokens_revoke(token_id: str | None, project: str | None, name: str | None, output: str) -> None:
    """Revoke a token by id (or by --project and --name). Idempotent for a revoked token."""
    from jobcore.db.session import session_scope

    if (token_id is None) == (name is None):
        raise click.UsageError("give either a TOKEN_ID or --project and --name")
    if name is not None and project is None:
        raise click.UsageError("--name needs --project (token names are unique only within a project)")
    with session_scope(_database_url()) as session:
        target_id = token_id if token_id is not None else _find_by_name(session, str(project), str(name)).id
        existing = session.get(ApiToken, target_id)
        was_revoked = existing is not None and existing.revoked
        try:
            token = revoke_token(session, target_id)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        info = _describe(token, _project_names(session))
    if output == "json":
        click.echo(json.dumps({**info, "already_revoked": was_revoked}))
        return
    state = "was already revoked" if was_revoked else "revoked"
    click.echo(
        f"token {info['id']} ({info['name'] or 'unnamed'}, project {info['project']}) {state}; "
        f"running servers refuse it within {TTL_SECONDS:g} s"
    )
