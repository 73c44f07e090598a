"""Start in any order: a worker started before the server on a fresh PostgreSQL (as an
orchestrator starts them, all at once) waits for the schema instead of dying, then works."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_service import LiveService, tiny_spec

pytestmark = pytest.mark.slow


@pytest.fixture()
def service(tmp_path: Path, tiny_model_dir: Path, postgres_url: str, redis_url: str) -> Iterator[LiveService]:
    svc = LiveService.configure(
        tmp_path, [tiny_model_dir], TWINKLE_DATABASE_URL=postgres_url, TWINKLE_BROKER_URL=redis_url
    )
    try:
        yield svc
    finally:
        svc.stop()


def test_a_worker_started_before_the_server_waits_for_the_schema(
    service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    worker = service.start_worker()
    deadline = time.monotonic() + 120
    while "waiting for the database: the database has no schema yet" not in service.worker_log():
        assert worker.poll() is None, f"the worker died before the server ran:\n{service.worker_log()}"
        assert time.monotonic() < deadline, service.worker_log()
        time.sleep(0.2)

    service.start_server()  # migrates the fresh database at start
    dataset = write_text_dataset(tmp_path / "train.jsonl", n=64)
    with service.client() as client:
        created = client.post("/v1/jobs", json={"name": "late", "spec": tiny_spec(tiny_model_dir, dataset)})
        assert created.status_code == 201, created.text
        final = service.wait_terminal(created.json()["id"], timeout=300)
    assert final["status"] == "succeeded", f"{final}\n{service.worker_log()}"
    assert worker.poll() is None  # the same process, never restarted
    assert "database ready" in service.worker_log()


def test_a_worker_started_before_its_broker_waits_for_it(
    tmp_path: Path, tiny_model_dir: Path, postgres_url: str
) -> None:
    """The broker down at start (Redis not up yet): the worker retries, then works once it is."""
    from redis_server import RedisServer

    from twinkle_core.assets import write_text_dataset

    broker = RedisServer(tmp_path)  # its port is chosen now; nothing listens there yet
    svc = LiveService.configure(
        tmp_path, [tiny_model_dir], TWINKLE_DATABASE_URL=postgres_url, TWINKLE_BROKER_URL=broker.url
    )
    try:
        svc.start_server()
        worker = svc.start_worker()
        deadline = time.monotonic() + 120
        while "Cannot connect to redis://" not in svc.worker_log():
            assert worker.poll() is None, f"the worker died without its broker:\n{svc.worker_log()}"
            assert time.monotonic() < deadline, svc.worker_log()
            time.sleep(0.2)
        dataset = write_text_dataset(tmp_path / "train.jsonl", n=64)
        with svc.client() as client:
            created = client.post(
                "/v1/jobs", json={"name": "early", "spec": tiny_spec(tiny_model_dir, dataset)}
            )
            assert created.status_code == 201, created.text  # accepted with the broker down: queued in SQL
            broker.start()
            final = svc.wait_terminal(created.json()["id"], timeout=300)
        assert final["status"] == "succeeded", f"{final}\n{svc.worker_log()}"
        assert worker.poll() is None  # the same process, never restarted
    finally:
        svc.stop()
        broker.kill()
