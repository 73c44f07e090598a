"""A worker outlives the death of its Celery consumer.

The consumer only carries wake-ups; jobs run in the agent's threads. Celery 5.7 with kombu's Redis
transport was seen to die ("Unrecoverable error": an AttributeError raised while closing the
connection that a Redis restart had dropped), which ended the whole worker and handed its running
job back. The worker here runs with that failure injected into Celery on every connection loss, on
a real private Redis that the test restarts: the running job must finish on its first attempt,
the process must stay up, and the restarted consumer must take wake-ups again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import RedisServer
from test_worker_support import REPO_ROOT, WorkerEnv, fake_runner, fake_spec, make_env

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# `python -m worker.main` with Celery made to fail the way it was seen to: the consumer's handler
# for a lost broker connection raises instead of reconnecting. Test-only; it breaks Celery, not us.
BRITTLE_CONSUMER_WORKER = r"""
from celery.worker.consumer.consumer import Consumer

def on_connection_error_after_connected(self, exc):
    raise AttributeError("'NoneType' object has no attribute 'hostname' (injected by the test)")

Consumer.on_connection_error_after_connected = on_connection_error_after_connected

from worker.main import main
main()
"""

DIED = "the Celery consumer died"
RECEIVED = "Task worker.wake["


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def start_brittle_worker(env: WorkerEnv) -> subprocess.Popen[bytes]:
    script = env.root / "brittle_worker.py"
    script.write_text(BRITTLE_CONSUMER_WORKER)
    log = open(env.root / "worker-0.log", "ab")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        env=env.env(TWINKLE_WORKER_RUNNER=str(fake_runner(env.root))),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    env.procs.append(proc)
    return proc


def worker_log(env: WorkerEnv) -> str:
    return (env.root / "worker-0.log").read_text(errors="replace")


def wait_for_log(env: WorkerEnv, text: str, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while worker_log(env).count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in the worker log:\n{worker_log(env)}"
        time.sleep(0.2)


def test_a_dead_consumer_is_restarted_and_the_running_job_is_not_handed_back(
    tmp_path: Path, broker: RedisServer
) -> None:
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'twinkle.db'}", broker.url)
    try:
        worker = start_brittle_worker(env)
        job_id = env.submit(fake_spec(max_steps=60, step_seconds=0.4, save_every=None), max_retries=0)
        env.wait_for(job_id, lambda j: j.step >= 2, what="step 2")
        wait_for_log(env, RECEIVED)  # the first consumer took the job's wake-up

        broker.restart(downtime=0.5)
        wait_for_log(env, DIED)
        job = env.job(job_id)
        assert worker.poll() is None, env.worker_logs()
        assert (job.status, job.attempt) == ("running", 1), (job.status, job.attempt, job.error)

        # The job finishes on its first attempt: nothing was handed back or retried.
        job = env.wait_status(job_id, "succeeded", "failed", "queued", "retrying")
        assert (job.status, job.attempt) == ("succeeded", 1), (job.status, job.error)

        # The consumer is back: a new job's wake-up is received by it (not just found by the poll).
        second = env.submit(fake_spec(max_steps=2, step_seconds=0.1))
        wait_for_log(env, RECEIVED, count=2)
        assert env.wait_status(second, "succeeded", "failed").status == "succeeded"
        assert worker.poll() is None, env.worker_logs()
        log = worker_log(env)
        assert log.index(DIED) < log.rindex(RECEIVED), log
    finally:
        env.stop_workers()
    # A SIGTERM still ends it (the restart loop does not swallow a requested shutdown).
    assert worker.returncode == 0, env.worker_logs()
