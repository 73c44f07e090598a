"""Dispatch: exactly-once claims under concurrency, priorities, project running limits, GPU leases."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select
from test_worker_support import WorkerEnv, fake_runner, fake_spec, make_env, sqlite_env

from jobcore.broker import send_wakeup
from jobcore.db.migrate import upgrade
from jobcore.db.models import Job, JobEvent, Project
from jobcore.db.session import session_scope
from worker.claim import claim_next_job

pytestmark = pytest.mark.slow


@pytest.mark.postgres
@pytest.mark.redis
def test_thirty_jobs_three_workers_each_runs_exactly_once_in_priority_order(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    env = make_env(tmp_path, postgres_url, redis_url, TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)))
    try:
        rng = random.Random(5)
        jobs = {}
        for i in range(30):
            priority = rng.randint(0, 4)
            job_id = env.submit(fake_spec(max_steps=1, save_every=None, step_seconds=0), priority=priority)
            jobs[job_id] = priority
            if i % 3 == 0:
                send_wakeup(job_id, env.settings())  # duplicated wake-ups must not launch twice
        for _ in range(3):
            env.start_worker()
        for job_id in jobs:
            env.wait_status(job_id, "succeeded", "failed", timeout=300)
        with session_scope(env.database_url) as session:
            rows = session.scalars(select(Job).where(Job.id.in_(list(jobs)))).all()
            claims = session.scalars(
                select(JobEvent).where(JobEvent.job_id.in_(list(jobs)), JobEvent.type == "status")
            ).all()
            workers_used = {r.worker_id for r in rows}
            assert all(r.status == "succeeded" and r.attempt == 1 for r in rows), [
                (r.status, r.attempt) for r in rows
            ]
            started = [c for c in claims if c.data["to"] == "starting"]
            assert sorted(c.job_id for c in started) == sorted(jobs)  # one claim per job
            started_at = {r.id: r.started_at for r in rows}
        assert len(workers_used) == 3
        for job_id in jobs:
            lines = (env.data_dir / "jobs" / job_id / "progress.jsonl").read_text().splitlines()
            assert sum(json.loads(line)["event"] == "started" for line in lines) == 1
        # No job started while a job of higher priority was still waiting (1 s for racing claims).
        for low, low_p in jobs.items():
            for high, high_p in jobs.items():
                if high_p > low_p:
                    assert (started_at[high] - started_at[low]).total_seconds() < 1.0, (high_p, low_p)
    finally:
        env.stop_workers()


@pytest.fixture()
def gpu_env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(
        tmp_path, TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)), TWINKLE_WORKER_GPUS="0,1,2"
    )


def test_gpu_leases_are_disjoint_and_jobs_wait_for_free_gpus(gpu_env: WorkerEnv) -> None:
    env = gpu_env
    a = env.submit(fake_spec(max_steps=400, nproc=2, step_seconds=0.25), priority=2)
    b = env.submit(fake_spec(max_steps=400, nproc=1, step_seconds=0.25), priority=1)
    c = env.submit(fake_spec(max_steps=2, nproc=2, step_seconds=0.1), priority=0)
    env.start_worker()
    ja = env.wait_status(a, "running")
    jb = env.wait_status(b, "running")
    assert sorted(ja.gpu_ids + jb.gpu_ids) == ["0", "1", "2"]
    assert len(ja.gpu_ids) == 2 and len(jb.gpu_ids) == 1
    assert env.job(c).status == "queued"  # 2 GPUs needed, none free
    for job_id, job in ((a, ja), (b, jb)):
        seen = [e.data.get("cuda_visible_devices") for e in env.events(job_id) if e.message == "devices"]
        assert seen == [",".join(job.gpu_ids)]
    env.set_status(a, "cancelling")
    env.wait_status(c, "succeeded", timeout=60)
    started = [e for e in env.events(c) if e.message.startswith("attempt 1 on worker")]
    assert len(started) == 1 and sorted(started[0].data["gpu_ids"]) == sorted(ja.gpu_ids)  # a's GPUs, freed
    env.set_status(b, "cancelling")
    env.wait_status(b, "cancelled", timeout=20)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_racing_claims_never_exceed_a_projects_running_limit(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    # Eight workers claim at once from one project limited to two running jobs: the count of its
    # active jobs and the claim must be one decision, or each worker sees room for itself.
    url = (
        f"sqlite:///{tmp_path / 'db.sqlite'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    upgrade(url)
    with session_scope(url) as session:
        project = Project(name="limited", max_running_jobs=2)
        session.add(project)
        session.flush()
        for _ in range(8):
            session.add(Job(project_id=project.id, spec=fake_spec(max_steps=1)))

    def claim_at_once(tag: str) -> list[str]:
        start = threading.Barrier(8)

        def claim(worker: int) -> str | None:
            start.wait(timeout=30)
            with session_scope(url) as session:
                job = claim_next_job(session, f"w{tag}-{worker}", fits=lambda _: True)
                return job.id if job else None

        with ThreadPoolExecutor(8) as pool:
            return [job_id for job_id in pool.map(claim, range(8)) if job_id]

    def active() -> list[Job]:
        with session_scope(url) as session:
            return list(session.scalars(select(Job).where(Job.status == "starting")).all())

    for burst in range(3):
        claimed = []
        for round_ in range(4):  # a worker that found the project busy comes back next poll
            claimed += claim_at_once(f"{burst}.{round_}")
            assert len(active()) <= 2, claimed
        assert len(claimed) == (2 if burst == 0 else 1), claimed
        with session_scope(url) as session:  # one ends: room for exactly one more
            session.get_one(Job, active()[0].id).status = "succeeded"
