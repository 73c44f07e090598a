"""`twinkle-jobs jobs logs JOB --follow`: the job's log as it is written, through a retry's new
attempt log, until the job ends; against the in-process app, with the log files written while
the command follows them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api
from test_cli_admin import client_of

from twinkle_cli import resources
from twinkle_cli.main import cli
from twinkle_client.client import Jobs


@pytest.fixture()
def runner(api: Api, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    return CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def in_background(steps: list[Callable[[], None]], pause: float = 0.6) -> threading.Thread:
    def run() -> None:
        for step in steps:
            time.sleep(pause)
            step()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def follow(runner: CliRunner, job_id: str, *args: str) -> Result:
    return runner.invoke(cli, ["jobs", "logs", job_id, "--follow", *args], catch_exceptions=False)


def first_read_of_the_log(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the follower has read the log the first time (its tail): the writer waits for it,
    or on a loaded machine a line written while the command starts would be part of the tail."""
    read = threading.Event()
    logs = Jobs.logs

    def reading(self: Jobs, *args: Any, **kwargs: Any) -> Any:
        answer = logs(self, *args, **kwargs)
        read.set()
        return answer

    monkeypatch.setattr(Jobs, "logs", reading)
    return read


def test_follow_prints_the_tail_then_each_new_line_across_a_retry(
    api: Api, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = api.submit()["id"]
    logs = api.settings.jobs_dir / job_id / "logs"
    logs.mkdir(parents=True)
    first, second = logs / "attempt-1.log", logs / "attempt-2.log"
    first.write_text("boot\nstep 1\nstep 2\n")
    api.force_status(job_id, "running", attempt=1)
    tail_read = first_read_of_the_log(monkeypatch)

    def after_the_tail() -> None:
        tail_read.wait(60)  # and on regardless: a follower that never read fails the assertion below

    writer = in_background(
        [
            after_the_tail,
            lambda: append(first, "step 3\n"),
            lambda: append(first, "rank 0 died\n"),
            lambda: api.force_status(job_id, "running", attempt=2),  # a retry, its log not yet there
            lambda: second.write_text("resumed at step 2\n"),
            lambda: append(second, "step 3\nstep 4\n"),
            lambda: api.force_status(job_id, "succeeded"),
        ]
    )
    try:
        result = follow(runner, job_id, "-n", "2")
    finally:
        writer.join()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "==> attempt-1.log <==",
        "step 1",  # the last two lines first
        "step 2",
        "step 3",
        "rank 0 died",
        "==> attempt-2.log <==",
        "resumed at step 2",  # a new attempt's log from its first line
        "step 3",
        "step 4",
    ]


def test_follow_as_json_and_of_an_ended_job_prints_what_is_there_and_returns(
    api: Api, runner: CliRunner
) -> None:
    job_id = api.submit()["id"]
    logs = api.settings.jobs_dir / job_id / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1.log").write_text("a\nb\n")
    api.force_status(job_id, "failed", attempt=1)
    result = follow(runner, job_id, "-o", "json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.output.splitlines()] == [
        {"file": "attempt-1.log", "line": "a"},
        {"file": "attempt-1.log", "line": "b"},
    ]


def test_follow_stops_at_the_timeout_with_exit_3(api: Api, runner: CliRunner) -> None:
    job_id = api.submit()["id"]  # queued: no attempt, no log yet
    result = follow(runner, job_id, "--timeout", "1")
    assert result.exit_code == 3 and f"job {job_id} did not end within 1.0 s" in result.output


def test_follow_reads_only_the_latest_attempt(runner: CliRunner, api: Api) -> None:
    job_id = api.submit()["id"]
    result = runner.invoke(cli, ["jobs", "logs", job_id, "--follow", "--attempt", "1"])
    assert result.exit_code == 2 and "--follow follows the latest attempt" in result.output


def test_the_tail_shows_the_attempts_log_once_and_a_ranks_own_files_on_request(
    api: Api, runner: CliRunner
) -> None:
    """torchrun tees every rank's lines into the attempt's log: its per-rank files would show each
    line twice, so they come only with --rank or --all."""
    job_id = api.submit()["id"]
    logs = api.settings.jobs_dir / job_id / "logs"
    ranks = logs / "attempt-1-ranks" / "none_ab12" / "attempt_0"
    for rank in (0, 1):
        (ranks / str(rank)).mkdir(parents=True)
        (ranks / str(rank) / "stderr.log").write_text(f"warning from rank {rank}\n")
    (logs / "attempt-1.log").write_text("[rank0]:warning from rank 0\n[rank1]:warning from rank 1\n")
    api.force_status(job_id, "running", attempt=1)

    def shown(*args: str) -> list[str]:
        result = runner.invoke(cli, ["jobs", "logs", job_id, *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return [line for line in result.stdout.splitlines() if line.startswith("==>")]

    assert shown() == ["==> attempt-1.log <=="]
    assert shown("--rank", "1") == ["==> attempt-1-ranks/none_ab12/attempt_0/1/stderr.log <=="]
    assert len(shown("--all")) == 3
    as_json = runner.invoke(cli, ["jobs", "logs", job_id, "-o", "json"], catch_exceptions=False)
    assert [f["name"] for f in json.loads(as_json.stdout)["files"]] == ["attempt-1.log"]
    refused = runner.invoke(cli, ["jobs", "logs", job_id, "--rank", "0", "--all"])
    assert refused.exit_code == 2

    # Nothing to show is said, not left as an empty screen: an attempt or a rank that has no log
    # is an error; a job that has not run yet simply has none.
    for args, expected in (
        (["--attempt", "9"], f"job {job_id} has no attempt 9: its attempts are 1 to 1"),
        (["--rank", "5"], f"no log files of rank 5 in attempt 1 of job {job_id}"),
    ):
        result = runner.invoke(cli, ["jobs", "logs", job_id, *args])
        assert result.exit_code == 1 and expected in result.output, result.output
    queued = api.submit()["id"]
    result = runner.invoke(cli, ["jobs", "logs", queued])
    assert result.exit_code == 0 and f"no log yet: job {queued} is queued and has not run" in result.output


def test_a_nodes_torchrun_log_holds_its_ranks_lines_and_is_shown() -> None:
    assert resources.is_combined_log("attempt-2.log")
    assert resources.is_combined_log("attempt-2-ranks/node-1/torchrun.log")
    assert not resources.is_combined_log("attempt-2-ranks/node-1/none_x/attempt_0/3/stdout.log")
