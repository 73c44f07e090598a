"""`twinkle-jobs jobs wait JOB_ID`: a pipeline that submitted in one step waits in a later one, and
the command exits as `submit --wait` does (0 succeeded, 1 failed, 2 cancelled, 3 timeout)."""

from __future__ import annotations

import json
import threading

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


def wait(runner: CliRunner, job_id: str, *args: str) -> Result:
    return runner.invoke(cli, ["jobs", "wait", job_id, *args], catch_exceptions=False)


def test_wait_returns_0_once_the_job_it_watches_succeeds(api: Api, runner: CliRunner) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, "running")
    finished = threading.Timer(1.5, lambda: api.force_status(job_id, "succeeded"))
    finished.start()
    try:
        result = wait(runner, job_id, "-o", "json")
    finally:
        finished.join()
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "succeeded"  # the final job object alone


@pytest.mark.parametrize("follow", [False, True])
def test_wait_exits_1_with_the_error_for_a_failed_job(api: Api, runner: CliRunner, follow: bool) -> None:
    job_id = api.submit()["id"]
    error = {"code": "user_error", "message": "train.jsonl line 2: bad JSON"}
    api.force_status(job_id, "failed", error=error)
    result = wait(runner, job_id, *(["--follow"] if follow else []))
    assert result.exit_code == 1
    assert f"job {job_id} failed: train.jsonl line 2: bad JSON" in result.output


def test_wait_exits_2_for_a_cancelled_job_and_3_at_the_timeout(api: Api, runner: CliRunner) -> None:
    cancelled = api.submit()["id"]
    api.force_status(cancelled, "cancelled")
    assert wait(runner, cancelled).exit_code == 2

    queued = api.submit()["id"]
    result = wait(runner, queued, "--timeout", "0.5")
    assert result.exit_code == 3
    assert f"job {queued} is still queued after the 0.5 s timeout" in result.output


def test_wait_for_an_unknown_job_is_a_failed_step_naming_it(runner: CliRunner) -> None:
    result = wait(runner, "job-does-not-exist")
    assert result.exit_code == 1 and "404" in result.output and "job-does-not-exist" in result.output
