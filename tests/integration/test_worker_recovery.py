"""Recovery on real PostgreSQL + Redis (skipped without them): worker loss, orphans, exactly-once."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_worker_support import WorkerEnv, fake_runner, fake_spec, job_processes, kill_tree, make_env

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture()
def env(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[WorkerEnv]:
    env = make_env(tmp_path, postgres_url, redis_url, TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)))
    try:
        yield env
    finally:
        env.stop_workers()


def test_killed_worker_job_resumes_from_latest_checkpoint_on_a_new_worker(env: WorkerEnv) -> None:
    first = env.start_worker()
    job_id = env.submit(fake_spec(max_steps=12, nproc=2, save_every=2, step_seconds=0.4), max_retries=1)
    env.wait_for(job_id, lambda j: j.step >= 5, what="step 5")
    kill_tree(first.pid)  # the whole worker: the Celery process, torchrun and the ranks
    assert job_processes(env) == []
    env.start_worker()
    job = env.wait_status(job_id, "succeeded", "failed", timeout=120)
    assert job.status == "succeeded", job.error
    assert job.attempt == 2
    resumed = [e for e in env.events(job_id) if "resuming from checkpoint" in e.message]
    assert len(resumed) == 1
    assert int(resumed[0].data["resume_from"].rsplit("step-", 1)[1]) >= 4
    assert job_processes(env) == []


def test_restarted_worker_leaves_no_orphan(env: WorkerEnv) -> None:
    first = env.start_worker()
    job_id = env.submit(fake_spec(max_steps=40, nproc=2, save_every=2, step_seconds=0.3), max_retries=1)
    env.wait_for(job_id, lambda j: j.step >= 3 and bool(j.pids) and len(j.pids) == 3, what="3 pids recorded")
    orphans = [psutil.Process(pid) for pid in env.job(job_id).pids or []]
    os.kill(first.pid, 9)  # only the worker: torchrun and its ranks live on, orphaned
    first.wait()
    time.sleep(1.0)
    assert all(p.is_running() for p in orphans), "the runner should outlive a kill -9 of the worker"
    env.start_worker()
    psutil.wait_procs(orphans, timeout=30)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in orphans)
    job = env.wait_for(job_id, lambda j: j.attempt == 2 and j.status == "running", what="attempt 2 running")
    assert not set(job.pids or []) & {p.pid for p in orphans}
    env.set_status(job_id, "cancelling")
    env.wait_status(job_id, "cancelled", timeout=20)
    assert job_processes(env) == []
