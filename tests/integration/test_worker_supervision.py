"""Supervision on the embedded stack (SQLite + SQLite broker) with a fake runner under real torchrun."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from test_worker_support import WorkerEnv, fake_runner, fake_spec, job_processes, sqlite_env

from jobcore.broker import send_wakeup
from jobcore.db.models import Checkpoint, JobMetric
from jobcore.db.session import session_scope

pytestmark = pytest.mark.slow


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(tmp_path, TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)))


def test_job_runs_to_success_with_progress_recorded(env: WorkerEnv) -> None:
    env.start_worker()
    job_id = env.submit(fake_spec(max_steps=4, nproc=2, save_every=2), name="ok")
    job = env.wait_status(job_id, "succeeded", "failed")
    assert job.status == "succeeded", job.error
    assert job.attempt == 1
    assert (job.step, job.total_steps) == (4, 4)
    assert job.loss == pytest.approx(0.25)
    assert job.pids is None and job.finished_at is not None and job.disk_bytes
    with session_scope(env.database_url) as session:
        losses = session.scalars(
            select(JobMetric.step).where(JobMetric.job_id == job_id, JobMetric.name == "loss")
        )
        assert sorted(losses) == [1, 2, 3, 4]
        steps = session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)).all()
        assert sorted(steps) == [2, 4]
    statuses = [e.data["to"] for e in env.events(job_id) if e.type == "status"]
    assert statuses == ["starting", "running", "succeeded"]
    job_dir = env.data_dir / "jobs" / job_id
    assert (job_dir / "spec.json").exists()
    assert (job_dir / "logs" / "attempt-1.log").exists()
    assert list((job_dir / "logs" / "attempt-1-ranks").rglob("stdout.log")), "per-rank logs"
    assert job_processes(env) == []
    for _ in range(2):  # a redelivered or duplicated wake-up finds nothing to claim
        send_wakeup(job_id, env.settings())
    time.sleep(2)
    assert env.job(job_id).attempt == 1
    assert [e.data["to"] for e in env.events(job_id) if e.type == "status"].count("starting") == 1


def test_cancel_mid_step_stops_every_process_within_the_grace_period(env: WorkerEnv) -> None:
    env.start_worker()
    job_id = env.submit(fake_spec(max_steps=400, nproc=2, step_seconds=0.5))
    env.wait_for(job_id, lambda j: j.status == "running" and j.step >= 1, what="first step")
    assert len(job_processes(env)) == 3  # torchrun + 2 ranks
    env.set_status(job_id, "cancelling")
    # Grace 5 s (TWINKLE_CANCEL_GRACE_SECONDS) + one control tick + the final write.
    job = env.wait_status(job_id, "cancelled", "failed", "succeeded", timeout=10)
    assert job.status == "cancelled"
    assert job_processes(env) == []
    assert job.pids is None
    # The job's log ends by saying what stopped torchrun, not with torchrun's traceback.
    log = (env.data_dir / "jobs" / job_id / "logs" / "attempt-1.log").read_text()
    assert "torchrun stopped by SIGTERM" in log
    assert "Traceback" not in log and "SignalException" not in log


def test_pause_checkpoints_and_resume_continues_from_it(env: WorkerEnv) -> None:
    env.start_worker()
    job_id = env.submit(fake_spec(max_steps=30, nproc=2, save_every=None, step_seconds=0.3))
    env.wait_for(job_id, lambda j: j.status == "running" and j.step >= 2, what="step 2")
    env.set_status(job_id, "pausing")
    job = env.wait_status(job_id, "paused", "failed", "succeeded")
    assert job.status == "paused", job.error
    assert job.resume_from and Path(job.resume_from, "COMPLETE").exists()
    paused_at = job.step
    assert job_processes(env) == []
    env.set_status(job_id, "queued")
    send_wakeup(job_id, env.settings())
    job = env.wait_status(job_id, "succeeded", "failed")
    assert job.status == "succeeded", job.error
    assert job.attempt == 2
    resumed = [e for e in env.events(job_id) if "resuming from checkpoint" in e.message]
    assert resumed and resumed[-1].data["resume_from"].endswith(f"step-{paused_at}")


def test_a_run_that_ends_before_its_pause_takes_effect_says_so(env: WorkerEnv) -> None:
    env.start_worker()
    job_id = env.submit(fake_spec(max_steps=6, nproc=1, save_every=None, step_seconds=0.3, ignore_pause=True))
    env.wait_for(job_id, lambda j: j.status == "running" and j.step >= 1, what="step 1")
    env.set_status(job_id, "pausing")
    job = env.wait_status(job_id, "succeeded", "paused", "failed")
    assert job.status == "succeeded", job.error
    last = [e for e in env.events(job_id) if e.type == "status"][-1]
    assert last.message == "succeeded (the training ended before the pause took effect)"


def test_user_errors_and_timeouts_fail_once_without_retry(env: WorkerEnv) -> None:
    env.start_worker(concurrency=3)  # the three jobs run side by side
    user = env.submit(fake_spec(fail="user"), max_retries=3)
    bad_spec = fake_spec()
    bad_spec["data"]["train_file"] = "file-doesnotexist"
    invalid = env.submit(bad_spec, max_retries=3)
    slow = env.submit(fake_spec(max_steps=400, step_seconds=0.5), timeout_seconds=4, max_retries=3)

    job = env.wait_status(user, "succeeded", "failed")
    assert (job.status, job.attempt, job.error["kind"]) == ("failed", 1, "user")
    assert "line 3 is not valid JSON" in job.error["message"]
    assert "line 3 is not valid JSON" in job.error["log_tail"]

    job = env.wait_status(invalid, "succeeded", "failed")
    assert (job.status, job.attempt, job.error["kind"]) == ("failed", 1, "user")
    assert "data.train_file" in job.error["message"]
    assert not (env.data_dir / "jobs" / invalid / "logs").exists()  # never launched

    job = env.wait_status(slow, "succeeded", "failed", timeout=60)
    assert (job.status, job.attempt, job.error["kind"]) == ("failed", 1, "timeout")
    assert "torchrun stopped by SIGTERM" in job.error["log_tail"]
    assert "Traceback" not in job.error["log_tail"]
    assert job_processes(env) == []


def test_infra_error_retries_from_checkpoint_and_stops_at_max_retries(env: WorkerEnv) -> None:
    env.start_worker()
    # Every attempt is killed by a signal at step 3 after saving step 2.
    job_id = env.submit(fake_spec(max_steps=6, save_every=2, fail="infra", fail_at=3), max_retries=2)
    job = env.wait_status(job_id, "succeeded", "failed", timeout=120)
    assert job.status == "failed"
    assert job.attempt == 3  # the first run + max_retries
    assert job.error["kind"] == "infra"
    retries = [e for e in env.events(job_id) if e.message.startswith("retry ")]
    assert len(retries) == 2
    assert all(e.data["resume_from"].endswith("step-2") for e in retries)


def test_a_retried_jobs_error_goes_once_the_next_attempt_runs(env: WorkerEnv) -> None:
    """The retry's reason is the job's error while it waits; kept afterwards, it was read as the
    reason of whatever ended the job next (a cancel said 'cancelled: <the old crash>')."""
    env.start_worker()
    spec = fake_spec(max_steps=400, save_every=2, fail="infra", fail_at=3, once=True, step_seconds=0.3)
    job_id = env.submit(spec, max_retries=2)
    job = env.wait_for(
        job_id, lambda j: j.attempt == 2 and j.status == "running" and j.step >= 4, what="attempt 2"
    )
    assert job.error is None and job.failed_attempts == 1
    assert any(e.message.startswith("attempt 1 failed") for e in env.events(job_id))  # the reason stays here
    env.set_status(job_id, "cancelling")
    job = env.wait_status(job_id, "cancelled", "failed", "succeeded", timeout=20)
    assert (job.status, job.error) == ("cancelled", None)


def test_timeout_bounds_the_whole_job_across_retries(env: WorkerEnv) -> None:
    env.start_worker()
    # Attempt 1 runs ~4.5 s, each retry ~1.5 s (it resumes at step 2 and dies at step 3). Were the
    # timeout per attempt, no attempt would reach 8 s and the job would spend all ten retries.
    spec = fake_spec(max_steps=6, save_every=2, fail="infra", fail_at=3, step_seconds=1.5)
    job_id = env.submit(spec, max_retries=10, timeout_seconds=8)
    job = env.wait_status(job_id, "succeeded", "failed", timeout=120)
    assert (job.status, job.error["kind"]) == ("failed", "timeout"), job.error
    assert 2 <= job.attempt <= 5 and job.failed_attempts == job.attempt - 1, job.attempt
    assert "s of it in earlier attempts" in job.error["message"]
    # run_seconds banks each attempt's time in `running`, from its events. (Not ~8 s: the budget
    # also counts each launch until its runner started, torchrun's start-up, 1-2 s under load.)
    spans: list[float] = []
    since = None
    for event in (e for e in env.events(job_id) if e.type == "status"):
        if event.data["to"] == "running":
            since = event.created_at
        elif since is not None and event.data["from"] == "running":
            spans.append((event.created_at - since).total_seconds())
            since = None
    # (The last attempt may meet the timeout before its runner started.)
    assert len(spans) >= 2 and len(spans) in (job.attempt - 1, job.attempt), spans
    assert job.run_seconds == pytest.approx(sum(spans), abs=0.5)
    assert job.run_seconds > max(spans) + 1  # the earlier attempts' time counts too


def test_hang_is_an_infra_failure_that_retries(tmp_path: Path) -> None:
    gen = sqlite_env(
        tmp_path, TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)), TWINKLE_HANG_TIMEOUT_SECONDS="3"
    )
    env = next(gen)
    try:
        env.start_worker()
        job_id = env.submit(fake_spec(max_steps=3, step_seconds=30), max_retries=1)
        job = env.wait_status(job_id, "succeeded", "failed", timeout=60)
        assert job.status == "failed" and job.attempt == 2
        assert "hang" in job.error["message"]
    finally:
        gen.close()


def test_worker_shutdown_hands_its_job_back_without_charging_a_retry(env: WorkerEnv) -> None:
    import signal

    first = env.start_worker()
    job_id = env.submit(fake_spec(max_steps=60, nproc=2, save_every=2, step_seconds=0.3), max_retries=0)
    env.wait_for(job_id, lambda j: j.step >= 3, what="step 3")
    first.send_signal(signal.SIGTERM)  # warm shutdown
    first.wait(timeout=30)
    job = env.job(job_id)
    assert job.status == "queued" and job.resume_from and job_processes(env) == []
    env.start_worker(beat=True)
    job = env.wait_status(job_id, "succeeded", "failed")
    assert job.status == "succeeded", job.error  # max_retries=0, yet the hand-back was not a failure
    assert "beat: Starting" in env.worker_logs()
