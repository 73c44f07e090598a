"""`twinkle-jobs jobs delete` and `files delete`: what the server's actions offer, from the
terminal, with a confirmation a script skips with --yes (and is refused without)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api
from test_cli_admin import client_of

from twinkle_cli import resources
from twinkle_cli.main import cli


@pytest.fixture()
def runner(api: Api, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    return CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})


def run(runner: CliRunner, *args: str, answer: str | None = None) -> Result:
    return runner.invoke(cli, list(args), input=answer, catch_exceptions=False)


def job_exists(api: Api, job_id: str) -> bool:
    return api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).status_code == 200


def test_a_script_deletes_an_ended_job_with_yes(api: Api, runner: CliRunner) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, "cancelled")
    result = run(runner, "jobs", "delete", job_id, "--yes", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"id": job_id, "object": "job", "deleted": True}
    assert not job_exists(api, job_id)


def test_without_yes_and_no_terminal_nothing_is_deleted(api: Api, runner: CliRunner) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, "failed")
    result = run(runner, "jobs", "delete", job_id)
    assert result.exit_code == 2 and "pass --yes to skip the prompt" in result.output
    assert job_exists(api, job_id)


def test_on_a_terminal_the_user_is_asked(
    api: Api, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "_interactive", lambda: True)
    job_id = api.submit()["id"]
    api.force_status(job_id, "succeeded")
    kept = run(runner, "jobs", "delete", job_id, answer="n\n")
    assert kept.exit_code == 1 and "Aborted" in kept.output and job_exists(api, job_id)
    gone = run(runner, "jobs", "delete", job_id, answer="y\n")
    assert gone.exit_code == 0 and f"deleted {job_id}" in gone.output and not job_exists(api, job_id)


def test_a_running_job_is_not_deleted_and_the_server_says_why(api: Api, runner: CliRunner) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, "running")
    result = run(runner, "jobs", "delete", job_id, "-y")
    assert result.exit_code == 1 and "409" in result.output
    assert job_exists(api, job_id)


def test_files_delete(api: Api, runner: CliRunner, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    uploaded = json.loads(run(runner, "files", "upload", str(data), "-o", "json").output)
    result = run(runner, "files", "delete", uploaded["id"], "-y")
    assert result.exit_code == 0 and f"deleted {uploaded['id']}" in result.output
    assert json.loads(run(runner, "files", "list", "-o", "json").output) == []
    missing = run(runner, "files", "delete", uploaded["id"], "-y")
    assert missing.exit_code == 1 and "404" in missing.output
