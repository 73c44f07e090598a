"""`twinkle-jobs projects ...` and `twinkle-jobs tokens ...` through the server (an admin token
given), and the client's `projects`/`tokens` namespaces they use, against the in-process app."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api

from twinkle_cli import resources, tokens
from twinkle_cli.main import cli
from twinkle_client import APIError, TwinkleClient


def client_of(api: Api, token: str) -> TwinkleClient:
    def forward(request: httpx.Request) -> httpx.Response:
        answer = api.client.request(
            request.method, str(request.url), headers=request.headers, content=request.read()
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    return TwinkleClient("http://testserver", token, transport=httpx.MockTransport(forward), max_retries=0)


@pytest.fixture()
def runner(api: Api, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """The CLI, its clients wired to the test app; TWINKLE_TOKEN decides who calls."""
    for module in (resources, tokens):
        monkeypatch.setattr(module, "TwinkleClient", lambda _url, token: client_of(api, token))
    return CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})


def run(runner: CliRunner, *args: str, token: str | None = None) -> Result:
    env = {"TWINKLE_TOKEN": token} if token else None
    return runner.invoke(cli, list(args), env=env, catch_exceptions=False)


def out(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_projects_commands_over_http(api: Api, runner: CliRunner) -> None:
    made = out(
        run(
            runner,
            "projects",
            "create",
            "team",
            "--max-queued-jobs",
            "3",
            "--webhook-url",
            "https://h.example/t",
            "--slurm-account",
            "team-hpc",
            "-o",
            "json",
        )
    )
    assert made["webhook_secret"].startswith("whsec_") and made["max_queued_jobs"] == 3
    assert made["slurm_account"] == "team-hpc"
    text = run(runner, "projects", "get", "team")
    assert text.exit_code == 0 and "unlimited" in text.output and made["webhook_secret"] not in text.output
    assert "slurm_account     team-hpc" in text.output
    updated = out(
        run(
            runner,
            "projects",
            "update",
            "team",
            "--max-queued-jobs",
            "none",
            "--max-running-jobs",
            "2",
            "-o",
            "json",
        )
    )
    assert updated["max_queued_jobs"] is None and updated["max_running_jobs"] == 2
    assert updated["webhook_url"] == "https://h.example/t" and updated["slurm_account"] == "team-hpc"
    cleared = out(run(runner, "projects", "update", "team", "--slurm-account", "none", "-o", "json"))
    assert cleared["slurm_account"] is None
    bad = run(runner, "projects", "update", "team", "--slurm-account", "a b")
    assert bad.exit_code == 1 and "slurm_account" in bad.output
    rotated = out(run(runner, "projects", "rotate-secret", made["id"], "-o", "json"))
    assert rotated["webhook_secret"] not in (None, made["webhook_secret"])
    assert {p["name"] for p in out(run(runner, "projects", "list", "-o", "json"))} >= {"default", "team"}
    refused = run(runner, "projects", "update", "team", "--max-queued-jobs", "many")
    assert refused.exit_code == 2
    missing = run(runner, "projects", "get", "nobody")
    assert missing.exit_code == 1 and "404" in missing.output


def test_tokens_commands_over_http_follow_the_callers_tenancy(api: Api, runner: CliRunner) -> None:
    out(run(runner, "projects", "create", "team", "-o", "json"))
    owner = out(
        run(
            runner,
            "tokens",
            "create",
            "--project",
            "team",
            "--scope",
            "admin",
            "--name",
            "owner",
            "-o",
            "json",
        )
    )
    assert owner["project"] == "team" and owner["scopes"] == ["admin"]
    # the project's admin makes a limited, expiring token in its own project (the default)
    bot = out(
        run(
            runner,
            "tokens",
            "create",
            "--name",
            "bot",
            "--scope",
            "read",
            "--rate-limit",
            "30",
            "--expires-in",
            "7d",
            "-o",
            "json",
            token=owner["token"],
        )
    )
    assert bot["project"] == "team" and bot["rate_limit_per_minute"] == 30 and bot["expires_at"]
    listed = out(run(runner, "tokens", "list", "-o", "json", token=owner["token"]))
    assert [t["name"] for t in listed] == ["owner", "bot"] and all(t["project"] == "team" for t in listed)
    assert bot["token"] not in json.dumps(listed)
    # it cannot reach the operator's project
    assert run(runner, "tokens", "list", "--project", "default", token=owner["token"]).exit_code == 1
    assert run(runner, "projects", "create", "mine", token=owner["token"]).exit_code == 1

    revoked = out(
        run(
            runner,
            "tokens",
            "revoke",
            "--project",
            "team",
            "--name",
            "bot",
            "-o",
            "json",
            token=owner["token"],
        )
    )
    assert revoked["revoked"] is True and revoked["already_revoked"] is False
    again = out(run(runner, "tokens", "revoke", bot["id"], "-o", "json"))
    assert again["already_revoked"] is True
    assert api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {bot['token']}"}).status_code == 401


def test_the_database_path_stays_for_the_first_token(
    api: Api, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_DATABASE_URL", str(api.settings.database_url))
    monkeypatch.setenv("TWINKLE_DATA_DIR", str(api.settings.data_dir))
    from jobcore.settings import get_settings

    get_settings.cache_clear()
    try:
        first = out(
            run(
                runner,
                "tokens",
                "--database",
                "create",
                "--project",
                "fresh",
                "--expires-in",
                "1h",
                "-o",
                "json",
            )
        )
        assert first["project"] == "fresh" and first["expires_at"]
        missing = runner.invoke(cli, ["tokens", "--database", "create"], env={"TWINKLE_TOKEN": ""})
        assert missing.exit_code == 2 and "--project is required" in missing.output
    finally:
        get_settings.cache_clear()
    assert (
        api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {first['token']}"}).status_code == 200
    )


def test_client_namespaces(api: Api) -> None:
    client = client_of(api, BOOTSTRAP)
    project = client.projects.create("lab", max_running_jobs=1)
    assert "webhook_secret" in project and "webhook_secret" not in client.projects.get("lab")
    assert client.projects.update("lab", webhook_url="https://h.example/lab")["max_running_jobs"] == 1
    assert client.projects.update("lab", max_running_jobs=None)["max_running_jobs"] is None
    assert client.projects.update("lab", slurm_account="lab-hpc")["slurm_account"] == "lab-hpc"
    assert client.projects.update("lab", slurm_account=None)["slurm_account"] is None
    assert client.projects.create("lab2", slurm_account="lab2")["slurm_account"] == "lab2"
    assert client.projects.rotate_webhook_secret("lab")["webhook_secret"] != project["webhook_secret"]
    made = client.tokens.create(project="lab", name="ci", scopes=["read"])
    assert [t["id"] for t in client.tokens.list("lab")] == [made["id"]]
    assert client.tokens.revoke(made["id"])["revoked"] is True
    with pytest.raises(APIError) as refused:
        client.tokens.create(project="lab", scopes=["root"])
    assert refused.value.status_code == 422 and refused.value.param == "scopes.0"
