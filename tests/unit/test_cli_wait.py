"""`twinkle-jobs jobs wait JOB_ID`: a pipeline that submitted in one step waits in a later one, and
the command exits as `submit --wait` does (0 succeeded, 1 failed, 2 cancelled, 3 timeout)."""

from __future__ import annotations

import json
import threading

import httpx
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

    paused = api.submit()["id"]
    api.force_status(paused, "paused")
    result = wait(runner, paused, "--timeout", "0.5")
    assert result.exit_code == 3
    assert f"waiting for a resume: twinkle-jobs jobs resume {paused}" in result.output


def test_wait_for_an_unknown_job_is_a_failed_step_naming_it(runner: CliRunner) -> None:
    result = wait(runner, "job-does-not-exist")
    assert result.exit_code == 1 and "404" in result.output and "job-does-not-exist" in result.output


def test_wait_outlives_a_server_it_cannot_reach_for_a_while(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart or a deploy of the server must not end a pipeline's wait as a failed job."""
    job_id = api.submit()["id"]
    api.force_status(job_id, "running")
    client = client_of(api, BOOTSTRAP)
    reads = 0
    real_get = client.jobs.get

    def flaky_get(wanted: str) -> dict[str, object]:
        nonlocal reads
        reads += 1
        if reads in (2, 3):  # down for two reads, after the first
            raise httpx.ConnectError("[Errno 111] Connection refused")
        if reads == 4:
            api.force_status(job_id, "succeeded")
        return real_get(wanted)

    monkeypatch.setattr(client.jobs, "get", flaky_get)
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, _token: client)
    monkeypatch.setattr(resources, "UNREACHABLE_RETRY_SECONDS", 0.05)
    result = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP}).invoke(cli, ["jobs", "wait", job_id])
    assert result.exit_code == 0, result.output
    assert result.output.count("cannot reach the server") == 1  # said once, not per try


def test_ctrl_c_stops_the_wait_with_130_saying_the_job_goes_on(
    api: Api, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = api.submit()["id"]

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # as Ctrl-C arrives, in the wait's next read

    monkeypatch.setattr(resources, "_read_through_restarts", interrupted)
    result = wait(runner, job_id)
    assert result.exit_code == 130
    assert f"job {job_id} goes on (stop it: twinkle-jobs jobs cancel {job_id})" in result.output


def test_an_empty_job_id_is_refused_before_any_request(runner: CliRunner) -> None:
    """`JOB=$(... submit ...)` that failed leaves JOB empty; `/v1/jobs/` is the list, not a job."""
    for command in (["jobs", "wait", ""], ["jobs", "get", " "], ["jobs", "delete", "..", "--yes"]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 1 and "not an id" in result.output, (command, result.output)


def test_jobs_list_takes_a_limit_above_the_servers_page(api: Api, runner: CliRunner) -> None:
    """--limit is how many jobs to show; the pages under it are at most the server's 100."""
    ids = [api.submit()["id"] for _ in range(3)]
    result = runner.invoke(cli, ["jobs", "list", "--limit", "500", "-o", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [job["id"] for job in json.loads(result.output)] == ids[::-1]
    two = runner.invoke(cli, ["jobs", "list", "--limit", "2", "-o", "json"], catch_exceptions=False)
    assert len(json.loads(two.output)) == 2
