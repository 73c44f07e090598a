"""`twinkle-jobs tokens create|list|revoke` against the API's real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import ApiToken
from jobcore.settings import get_settings
from server.auth.cache import TTL_SECONDS, cache_for
from server.auth.service import hash_token
from twinkle_cli.main import cli


@pytest.fixture()
def admin_cli(api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CLI runner whose settings point at the test app's database."""
    monkeypatch.setenv("TWINKLE_DATABASE_URL", str(api.settings.database_url))
    monkeypatch.setenv("TWINKLE_DATA_DIR", str(api.settings.data_dir))
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def run(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(cli, ["tokens", *args], catch_exceptions=False)


def create(runner: CliRunner, project: str, name: str, *scopes: str) -> dict[str, Any]:
    scope_args = [arg for scope in scopes for arg in ("--scope", scope)]
    result = run(runner, "create", "--project", project, "--name", name, *scope_args, "-o", "json")
    assert result.exit_code == 0, result.output
    created: dict[str, Any] = json.loads(result.output)
    return created


def bearer(plain: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {plain}"}


def test_list_shows_every_field_but_never_the_secret(api: Api, admin_cli: CliRunner) -> None:
    ci = create(admin_cli, "team-a", "ci", "read")
    bot = create(admin_cli, "team-b", "bot", "write")
    assert api.client.get("/v1/jobs", headers=bearer(ci["token"])).status_code == 200  # sets last used

    mine = json.loads(run(admin_cli, "list", "--project", "team-a", "-o", "json").output)
    assert [t["id"] for t in mine] == [ci["id"]]
    row = mine[0]
    assert row["name"] == "ci" and row["project"] == "team-a" and row["scopes"] == ["read"]
    assert row["revoked"] is False and row["created_at"] and row["last_used_at"]

    everyone = json.loads(run(admin_cli, "list", "-o", "json").output)
    listed = {t["id"]: t for t in everyone}
    assert {ci["id"], bot["id"]} <= set(listed)
    assert listed[bot["id"]]["project"] == "team-b" and listed[bot["id"]]["last_used_at"] is None

    text = run(admin_cli, "list").output
    header = text.splitlines()[0].split()
    assert header == ["id", "name", "project", "scopes", "created", "last", "used", "expires", "revoked"]
    assert ci["id"] in text and bot["id"] in text
    for secret in (ci["token"], bot["token"], hash_token(ci["token"]), hash_token(bot["token"])):
        assert secret not in text and secret not in json.dumps(everyone)


def test_list_of_an_unknown_project_fails(admin_cli: CliRunner) -> None:
    result = run(admin_cli, "list", "--project", "nobody")
    assert result.exit_code == 1 and "no project named 'nobody'" in result.output


def test_revoke_by_id_is_honoured_by_the_api_within_the_cache_ttl(api: Api, admin_cli: CliRunner) -> None:
    cached = create(admin_cli, "team", "cached")
    fresh = create(admin_cli, "team", "fresh")
    # The server's principal cache runs on a clock the test moves: the documented bound, exactly.
    now = [1000.0]
    cache_for(api.app.state.engine).clock = lambda: now[0]
    assert api.client.get("/v1/jobs", headers=bearer(cached["token"])).status_code == 200

    for token in (cached, fresh):
        result = run(admin_cli, "revoke", token["id"], "-o", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["revoked"] is True

    # Never authenticated by this server: refused at once.
    refused = api.client.get("/v1/jobs", headers=bearer(fresh["token"]))
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    # Authenticated a moment before the revocation (by another process): honoured for at most the TTL.
    now[0] += TTL_SECONDS
    assert api.client.get("/v1/jobs", headers=bearer(cached["token"])).status_code == 401

    listed = json.loads(run(admin_cli, "list", "--project", "team", "-o", "json").output)
    assert all(t["revoked"] for t in listed)
    live = json.loads(run(admin_cli, "list", "--project", "team", "--live-only", "-o", "json").output)
    assert live == []
    again = run(admin_cli, "revoke", cached["id"])
    assert again.exit_code == 0 and "already revoked" in again.output


def test_revoke_of_an_unknown_token_fails_clearly(admin_cli: CliRunner) -> None:
    result = run(admin_cli, "revoke", "tok-doesnotexist")
    assert result.exit_code == 1 and "no token with id 'tok-doesnotexist'" in result.output
    unnamed = run(admin_cli, "revoke", "--project", "team", "--name", "ghost")
    assert unnamed.exit_code == 1 and "no project named 'team'" in unnamed.output
    assert run(admin_cli, "revoke").exit_code == 2  # neither an id nor a name: a usage error
    assert run(admin_cli, "revoke", "--name", "ci").exit_code == 2  # a name needs its project


def test_revoke_by_name_within_a_project(api: Api, admin_cli: CliRunner) -> None:
    mine = create(admin_cli, "team-a", "ci")
    theirs = create(admin_cli, "team-b", "ci")
    result = run(admin_cli, "revoke", "--project", "team-a", "--name", "ci")
    assert result.exit_code == 0 and mine["id"] in result.output
    assert api.client.get("/v1/jobs", headers=bearer(mine["token"])).status_code == 401
    assert api.client.get("/v1/jobs", headers=bearer(theirs["token"])).status_code == 200  # other project

    missing = run(admin_cli, "revoke", "--project", "team-a", "--name", "ci")  # the only one is revoked
    assert missing.exit_code == 1 and "no live token named 'ci'" in missing.output
    create(admin_cli, "team-b", "ci")
    ambiguous = run(admin_cli, "revoke", "--project", "team-b", "--name", "ci")
    assert ambiguous.exit_code == 1 and "revoke by id" in ambiguous.output
    assert api.client.get("/v1/jobs", headers=bearer(theirs["token"])).status_code == 200


def test_create_refuses_an_unknown_scope(admin_cli: CliRunner) -> None:
    result = run(admin_cli, "create", "--project", "team", "--scope", "root")
    assert result.exit_code == 2  # a usage error: refused before the database is touched
    assert "'root' is not one of 'read', 'write', 'admin'" in result.output


def test_a_named_server_without_a_token_is_not_swapped_for_the_local_database(
    api: Api, admin_cli: CliRunner
) -> None:
    """TWINKLE_URL set and the token forgotten: a token made in this machine's database (maybe a
    fresh one) would be refused by that server, so the command asks which was meant."""
    refused = admin_cli.invoke(cli, ["tokens", "list"], env={"TWINKLE_URL": "http://gpu-box:8000"})
    assert refused.exit_code == 2
    assert (
        "no API token for the server at http://gpu-box:8000" in refused.output
        and "--database" in refused.output
    )
    chosen = admin_cli.invoke(
        cli, ["tokens", "--database", "list"], env={"TWINKLE_URL": "http://gpu-box:8000"}
    )
    assert chosen.exit_code == 0, chosen.output


def test_live_only_leaves_out_expired_tokens_and_the_table_shows_expiry(
    api: Api, admin_cli: CliRunner
) -> None:
    lasting = create(admin_cli, "team-x", "lasting")
    made = run(
        admin_cli, "create", "--project", "team-x", "--name", "past", "--expires-at", "2099-01-01T00:00"
    )
    assert made.exit_code == 0, made.output  # a day and a time to the minute, as the help shows
    gone = run(admin_cli, "create", "--project", "team-x", "--name", "old", "--expires-at", "2020-01-01")
    assert gone.exit_code == 2 and "2020-01-01 00:00 UTC is in the past" in gone.output
    past = create(admin_cli, "team-x", "past-its-time")
    with api.session() as session, session.begin():  # its expiry has passed since
        session.get(ApiToken, past["id"]).expires_at = datetime(2020, 1, 1, tzinfo=UTC)  # type: ignore[union-attr]
    live = json.loads(run(admin_cli, "list", "--project", "team-x", "--live-only", "-o", "json").output)
    assert past["id"] not in {t["id"] for t in live} and lasting["id"] in {t["id"] for t in live}
    table = run(admin_cli, "list", "--project", "team-x").output.splitlines()
    assert "expires" in table[0].split()
    assert any("2099-01-01T00:00:00" in line for line in table[1:])
