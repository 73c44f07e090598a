"""One real tiny fine-tune through every layer: HTTP API -> SQL -> broker -> worker -> torchrun.

Runs once on the embedded defaults (SQLite + SQLite broker) and once on PostgreSQL + Redis. The
job is submitted before any worker runs, so the test also shows that a queued job waits and is
picked up when a worker starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from live_service import LiveService, tiny_spec

pytestmark = pytest.mark.slow


@pytest.fixture(params=["embedded", "postgres+redis"])
def service(request: pytest.FixtureRequest, tmp_path: Path, tiny_model_dir: Path) -> Iterator[LiveService]:
    extra: dict[str, str] = {}
    if request.param == "postgres+redis":
        extra["TWINKLE_DATABASE_URL"] = request.getfixturevalue("postgres_url")
        extra["TWINKLE_BROKER_URL"] = request.getfixturevalue("redis_url")
    svc = LiveService.configure(tmp_path, [tiny_model_dir], **extra)
    svc.start_server()
    try:
        yield svc
    finally:
        svc.stop()


def _training_processes(root_pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process(root_pid).children(recursive=True):
        try:
            if "twinkle_core.train" in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def test_tiny_finetune_end_to_end(service: LiveService, tmp_path: Path, tiny_model_dir: Path) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=64)
    with service.client() as client:
        assert client.get("/v1/jobs", headers={"Authorization": ""}).status_code == 401
        created = client.post(
            "/v1/jobs", json={"name": "skeleton", "spec": tiny_spec(tiny_model_dir, dataset)}
        )
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["status"] == "queued"
        assert job["spec"]["training"]["gradient_accumulation_steps"] == 1  # resolved defaults are shown

        # No worker yet: the job waits in the queue and nothing is lost.
        time.sleep(2)
        assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"

        worker = service.start_worker()
        final = service.wait_terminal(job["id"], timeout=300)
        assert final["status"] == "succeeded", f"{final}\n{service.worker_log()}"
        assert final["progress"]["step"] == 4

        events = client.get(f"/v1/jobs/{job['id']}/events", params={"limit": 100}).json()["data"]
        steps = [e for e in events if e["type"] == "metrics" and (e.get("data") or {}).get("step")]
        assert [e["data"]["step"] for e in steps] == [1, 2, 3, 4]
        assert all(isinstance(e["data"]["loss"], float) for e in steps)
        statuses = [e["data"]["to"] for e in events if e["type"] == "status"]
        assert statuses[-1] == "succeeded" and "running" in statuses

        checkpoint = Path(final["latest_checkpoint"]["path"])
        assert (checkpoint / "COMPLETE").exists()
        assert (checkpoint / "config.json").exists()

    # The worker leaves no training process behind once the job is over.
    assert _training_processes(worker.pid) == []
