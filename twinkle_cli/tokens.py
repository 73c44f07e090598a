"""`twinkle-jobs tokens create|list|revoke`: API token administration.

Two ways, one output. Given an admin API token (`--token` or TWINKLE_TOKEN, with `--url` or
TWINKLE_URL) they call the server's `/v1/tokens` (the token's tenancy applies: an admin of the
project "default" manages every project, another admin its own). Without one, or with
`--database`, they talk to the database directly (TWINKLE_DATABASE_URL), so they work before any
token exists: that is how the first one is made. A plain token is printed once, by `create`;
`list` shows everything about a token except its secret, which is not stored (only its SHA-256 is).

Revocation is committed at once; a running server process keeps accepting a token it had
authenticated for at most the principal cache's TTL (`server.auth.cache.TTL_SECONDS`).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from click.core import ParameterSource
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import ApiToken, Project
from jobcore.settings import get_settings, redacted_url
from server.auth.cache import TTL_SECONDS
from server.auth.service import SCOPES, create_token, list_tokens, revoke_token
from twinkle_cli.resources import handle_api_errors
from twinkle_client import TwinkleClient

OUTPUT = click.option(
    "--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True
)


class Via:
    """How the commands reach the tokens: a server (a client) or the database (None)."""

    def __init__(self, client: TwinkleClient | None) -> None:
        self.client = client


@click.group()
@click.option(
    "--url", envvar="TWINKLE_URL", default="http://127.0.0.1:8000", show_default=True, show_envvar=True
)
@click.option(
    "--token",
    envvar="TWINKLE_TOKEN",
    default=None,
    show_envvar=True,
    help="Admin API token: go through the server",
)
@click.option("--database", is_flag=True, help="Use the database directly even if a token is given")
@click.pass_context
def tokens(ctx: click.Context, url: str, token: str | None, database: bool) -> None:
    """Create, list and revoke API tokens (admin). Through the server when an API token is given
    (--token or TWINKLE_TOKEN), else directly in the database (the first token is made so)."""
    if not token and not database and ctx.get_parameter_source("url") != ParameterSource.DEFAULT:
        # A server was named but no token given: the database here may not be that server's (a
        # token made in a fresh local one would be refused there), so the choice is the user's.
        where = redacted_url(get_settings().resolved_database_url)
        raise click.UsageError(
            f"no API token for the server at {url}: give --token (or TWINKLE_TOKEN), or --database "
            f"to use the database directly ({where})"
        )
    ctx.obj = Via(None if database or not token else TwinkleClient(url, token))


def _http(ctx: click.Context) -> TwinkleClient | None:
    via = ctx.find_object(Via)
    return None if via is None else via.client


# What --expires-at reads: a day, or a day and a time to the minute or the second (UTC).
EXPIRY_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def expiry(expires_in: str | None, expires_at: datetime | None) -> datetime | None:
    """`--expires-in 30d` (s, m, h, d) or `--expires-at 2027-01-01T00:00` (UTC)."""
    if expires_in is not None and expires_at is not None:
        raise click.UsageError("give --expires-in or --expires-at, not both")
    if expires_in is not None:
        match = _DURATION.match(expires_in.strip())
        if match is None:
            raise click.BadParameter("a number and a unit: 90s, 30m, 12h, 30d", param_hint="--expires-in")
        return datetime.now(UTC) + timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    if expires_at is None:
        return None
    ends = expires_at if expires_at.tzinfo is not None else expires_at.replace(tzinfo=UTC)
    if ends <= datetime.now(UTC):
        shown = ends.strftime("%Y-%m-%d %H:%M UTC")
        raise click.BadParameter(
            f"{shown} is in the past; a token's end must be ahead", param_hint="--expires-at"
        )
    return ends


def _database_url() -> str:
    from jobcore.db.migrate import upgrade

    settings = get_settings()
    upgrade(settings.resolved_database_url)  # an admin command may be the first thing ever run
    return settings.resolved_database_url


@tokens.command("create")
@click.option(
    "--project",
    default=None,
    help="Project the token belongs to (database: required, created if new; server: default the caller's)",
)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(SCOPES),
    default=("read", "write"),
    show_default=True,
)
@click.option("--name", default="", help="A label for the token")
@click.option("--rate-limit", type=click.IntRange(min=1), default=None, help="Requests per minute")
@click.option("--expires-in", default=None, help="Lifetime: 90s, 30m, 12h, 30d (default: until revoked)")
@click.option(
    "--expires-at",
    type=click.DateTime(formats=EXPIRY_FORMATS),
    default=None,
    help="End of life, e.g. 2027-01-01 or 2027-01-01T12:00 (UTC)",
)
@OUTPUT
@click.pass_context
@handle_api_errors
def tokens_create(
    ctx: click.Context,
    project: str | None,
    scopes: tuple[str, ...],
    name: str,
    rate_limit: int | None,
    expires_in: str | None,
    expires_at: datetime | None,
    output: str,
) -> None:
    """Create a token; it is printed once and stored only as a hash."""
    ends = expiry(expires_in, expires_at)
    client = _http(ctx)
    if client is not None:
        made = client.tokens.create(
            project=project, name=name, scopes=scopes, rate_limit_per_minute=rate_limit, expires_at=ends
        )
        project_name = project or client.projects.get(made["project_id"])["name"]
        info: dict[str, Any] = {
            "token": made["token"],
            "id": made["id"],
            "project": project_name,
            "scopes": made["scopes"],
        }
        info |= {"rate_limit_per_minute": made["rate_limit_per_minute"], "expires_at": made["expires_at"]}
    else:
        if project is None:
            raise click.UsageError("--project is required when talking to the database (no --token)")
        from jobcore.db.session import session_scope

        with session_scope(_database_url()) as session:
            try:
                plain, row = create_token(
                    session, project, list(scopes), name, rate_limit_per_minute=rate_limit, expires_at=ends
                )
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
            info = {"token": plain, "id": row.id, "project": project, "scopes": row.scopes}
            info |= {"rate_limit_per_minute": row.rate_limit_per_minute, "expires_at": _iso(row.expires_at)}
    plain = info["token"]
    click.echo(
        json.dumps(info) if output == "json" else f"{plain}\n(id {info['id']}, project {info['project']})"
    )


def _describe(token: ApiToken, project_names: dict[str, str]) -> dict[str, Any]:
    """Everything an admin needs to recognise a token, never its hash or secret."""
    return {
        "id": token.id,
        "name": token.name,
        "project": project_names.get(token.project_id, token.project_id),
        "scopes": list(token.scopes),
        "rate_limit_per_minute": token.rate_limit_per_minute,
        "expires_at": _iso(token.expires_at),
        "created_at": _iso(token.created_at),
        "last_used_at": _iso(token.last_used_at),
        "revoked": token.revoked,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def _describe_api(token: dict[str, Any], project_names: dict[str, str]) -> dict[str, Any]:
    """The same description from the API's token object."""

    def iso(value: str | None) -> str | None:
        return None if value is None else _iso(datetime.fromisoformat(value))

    fields = ("id", "name", "scopes", "rate_limit_per_minute", "revoked")
    described = {key: token[key] for key in fields}
    described["project"] = project_names.get(token["project_id"], token["project_id"])
    for key in ("expires_at", "created_at", "last_used_at"):
        described[key] = iso(token[key])
    return described


def _api_project_names(client: TwinkleClient) -> dict[str, str]:
    return {p["id"]: p["name"] for p in client.projects.list()}


def _project_names(session: Session) -> dict[str, str]:
    return {row.id: row.name for row in session.execute(select(Project.id, Project.name))}


def _live(described: dict[str, Any]) -> bool:
    """Neither revoked nor past its expiry: a token the server still accepts."""
    ends = described["expires_at"]
    if ends is not None:
        moment = datetime.fromisoformat(ends)
        if (moment if moment.tzinfo else moment.replace(tzinfo=UTC)) <= datetime.now(UTC):
            return False
    return not described["revoked"]


def _cell(column: str, value: Any) -> str:
    if column == "scopes":
        return ",".join(value)
    if column == "revoked":
        return "yes" if value else "no"
    return "-" if value is None else str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns = ("id", "name", "project", "scopes", "created_at", "last_used_at", "expires_at", "revoked")
    headers = ["id", "name", "project", "scopes", "created", "last used", "expires", "revoked"]
    cells = [[_cell(c, row[c]) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return lines


@tokens.command("list")
@click.option("--project", default=None, help="Only this project's tokens (default: every project)")
@click.option(
    "--include-revoked/--live-only",
    default=True,
    show_default=True,
    help="--live-only: only the tokens the server accepts (not revoked, not expired)",
)
@OUTPUT
@click.pass_context
@handle_api_errors
def tokens_list(ctx: click.Context, project: str | None, include_revoked: bool, output: str) -> None:
    """List tokens (id, name, project, scopes, created, last used, expires, revoked); never the secret."""
    client = _http(ctx)
    if client is not None:
        names = _api_project_names(client)
        found = sorted(client.tokens.list(project), key=lambda t: (t["created_at"], t["id"]))
        described = [_describe_api(t, names) for t in found]
    else:
        from jobcore.db.session import session_scope

        with session_scope(_database_url()) as session:
            try:
                rows = list_tokens(session, project)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
            db_names = _project_names(session)
            described = [_describe(t, db_names) for t in rows]
    if not include_revoked:
        described = [d for d in described if _live(d)]
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
@click.pass_context
@handle_api_errors
def tokens_revoke(
    ctx: click.Context, token_id: str | None, project: str | None, name: str | None, output: str
) -> None:
    """Revoke a token by id (or by --project and --name). Idempotent for a revoked token."""
    from jobcore.db.session import session_scope

    if (token_id is None) == (name is None):
        raise click.UsageError("give either a TOKEN_ID or --project and --name")
    if name is not None and project is None:
        raise click.UsageError("--name needs --project (token names are unique only within a project)")
    client = _http(ctx)
    if client is not None:
        _revoke_through(client, token_id, str(project), name, output)
        return
    with session_scope(_database_url()) as session:
        target_id = token_id if token_id is not None else _find_by_name(session, str(project), str(name)).id
        existing = session.get(ApiToken, target_id)
        was_revoked = existing is not None and existing.revoked
        try:
            token = revoke_token(session, target_id)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        info = _describe(token, _project_names(session))
    _report_revoked(info, was_revoked, output)


def _revoke_through(
    client: TwinkleClient, token_id: str | None, project: str, name: str | None, output: str
) -> None:
    if token_id is None:
        live = [t for t in client.tokens.list(project) if t["name"] == name and not t["revoked"]]
        if not live:
            raise click.ClickException(f"no live token named '{name}' in project '{project}'")
        if len(live) > 1:
            ids = ", ".join(t["id"] for t in live)
            named = f"{len(live)} live tokens are named '{name}' in project '{project}'"
            raise click.ClickException(f"{named} ({ids}); revoke by id")
        token_id = str(live[0]["id"])
    was_revoked = bool(client.tokens.get(token_id)["revoked"])
    info = _describe_api(client.tokens.revoke(token_id), _api_project_names(client))
    _report_revoked(info, was_revoked, output)


def _report_revoked(info: dict[str, Any], was_revoked: bool, output: str) -> None:
    if output == "json":
        click.echo(json.dumps({**info, "already_revoked": was_revoked}))
        return
    state = "was already revoked" if was_revoked else "revoked"
    click.echo(
        f"token {info['id']} ({info['name'] or 'unnamed'}, project {info['project']}) {state}; "
        f"running servers refuse it within {TTL_SECONDS:g} s"
    )
