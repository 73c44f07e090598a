"""The beat embedded in a worker (`twinkle-jobs worker`, beat on by default) is a child process of
the worker: killing the worker with -9 must not leave it running, scheduling reconciles forever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_worker_support import WorkerEnv, sqlite_env

pytestmark = pytest.mark.slow


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(tmp_path)


def beat_children(worker: psutil.Process) -> list[psutil.Process]:
    """The worker's child processes that run Celery beat (the multiprocessing child it forks)."""
    return [p for p in worker.children() if p.status() != psutil.STATUS_ZOMBIE]


def test_a_worker_killed_with_9_takes_its_embedded_beat_with_it(env: WorkerEnv) -> None:
    worker = psutil.Process(env.start_worker(beat=True).pid)
    deadline = time.monotonic() + 120
    while not (children := beat_children(worker)):
        assert time.monotonic() < deadline, f"the worker started no beat process\n{env.worker_logs()}"
        time.sleep(0.2)
    (beat,) = children
    # The beat is up once it logged its start; killing the worker before that tests nothing.
    while "beat: Starting" not in env.worker_logs():
        assert time.monotonic() < deadline, env.worker_logs()
        time.sleep(0.2)
    worker.kill()
    worker.wait(timeout=30)
    try:
        beat.wait(timeout=30)
    except psutil.TimeoutExpired:
        beat.kill()
        pytest.fail(f"beat pid {beat.pid} outlived its worker (kill -9)")
    assert not beat.is_running() or beat.status() == psutil.STATUS_ZOMBIE
