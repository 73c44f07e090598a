"""The beat embedded in a worker (`twinkle-jobs worker`, beat on by default) is a child process of
the worker: killing the worker with -9 must not leave it running, scheduling reconciles forever.
Nor may it leave files behind: its schedule lives in memory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_worker_support import REPO_ROOT, WorkerEnv, sqlite_env

pytestmark = pytest.mark.slow


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(tmp_path)


def beat_children(worker: psutil.Process) -> list[psutil.Process]:
    """The worker's child processes that run Celery beat (the multiprocessing child it forks)."""
    return [p for p in worker.children() if p.status() != psutil.STATUS_ZOMBIE]


def test_a_worker_killed_with_9_takes_its_embedded_beat_with_it_and_leaves_no_files(
    env: WorkerEnv,
) -> None:
    temp_dir = env.root / "tmp"
    temp_dir.mkdir()
    # The reconcile every second (half the stale age), so the beat has scheduled one before the kill.
    worker = psutil.Process(
        env.start_worker(beat=True, TMPDIR=str(temp_dir), TWINKLE_STALE_AFTER_SECONDS="2").pid
    )
    deadline = time.monotonic() + 120
    while not (children := beat_children(worker)):
        assert time.monotonic() < deadline, f"the worker started no beat process\n{env.worker_logs()}"
        time.sleep(0.2)
    (beat,) = children
    # The beat is up once it sent its first reconcile; killing the worker before that tests nothing.
    while "Sending due task reconcile" not in env.worker_logs():
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
    # Celery's default scheduler keeps a shelve file (in the working directory, or wherever
    # `beat_schedule_filename` points): one per beat, never removed after a kill.
    assert list(temp_dir.iterdir()) == []
    pattern = "*beat*schedule*"
    assert [*env.root.glob(pattern), *env.data_dir.rglob(pattern), *REPO_ROOT.glob(pattern)] == []
