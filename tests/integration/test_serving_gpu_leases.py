"""A serving host's GPUs and training share one machine-wide lease (declared GPUs on a CPU
machine, as the dispatch tests declare them): while a host holds GPU 0, a worker whose pool is
GPU 0 does not give it to a job; released, the job gets it; a GPU a job holds is not the host's;
and a host that dies (stops refreshing) frees it after `stale_after_seconds`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_worker_support import WorkerEnv, fake_runner, fake_spec, sqlite_env

from jobcore import gpu_leases
from jobcore.db.session import session_scope
from serving.gpus import ServingGpus

HOST = "gpu-box"
STALE = 3.0


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(
        tmp_path,
        TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)),
        TWINKLE_WORKER_GPUS="0",
        TWINKLE_WORKER_HOST=HOST,
        TWINKLE_STALE_AFTER_SECONDS=str(STALE),
    )


def _serving(env: WorkerEnv) -> ServingGpus:
    return ServingGpus(
        env.database_url, host=HOST, pool=["0"], want=1, stale_after_seconds=STALE, poll_seconds=0.1
    )


def _held(env: WorkerEnv) -> dict[str, tuple[str, str]]:
    with session_scope(env.database_url) as session:
        return gpu_leases.held_by(session, HOST)


def test_a_gpu_held_by_a_serving_host_is_not_given_to_training(env: WorkerEnv) -> None:
    host = _serving(env)
    assert host.acquire() == ["0"]
    first = env.submit(fake_spec(max_steps=8, save_every=None, step_seconds=0.1))
    env.start_worker()
    deadline = time.monotonic() + 3.0  # the worker polls every 0.5 s: six passes see the lease
    while time.monotonic() < deadline:
        host.refresh()  # the host's heartbeat
        assert env.job(first).status == "queued", env.worker_logs()
        time.sleep(0.3)

    host.release()  # the host stops
    job = env.wait_status(first, "running", "succeeded", timeout=30)
    assert job.gpu_ids == ["0"] or env.job(first).status == "succeeded"
    if env.job(first).status == "running":  # the job's lease is in the table: the host waits
        assert _held(env) == {"0": ("job", first)} and not _serving(env).try_acquire()
    env.wait_status(first, "succeeded", timeout=30)
    env.wait_for(first, lambda _: _held(env) == {}, timeout=10, what="the job's lease released")

    dying = _serving(env)
    assert dying.acquire() == ["0"]  # and then never refreshes it: the host died
    second = env.submit(fake_spec(max_steps=2, save_every=None, step_seconds=0.1))
    time.sleep(1.0)
    assert env.job(second).status == "queued"
    job = env.wait_status(second, "running", "succeeded", timeout=STALE + 10)
    started = [e for e in env.events(second) if e.message.startswith("attempt 1 on worker")]
    assert len(started) == 1 and started[0].data["gpu_ids"] == ["0"]
