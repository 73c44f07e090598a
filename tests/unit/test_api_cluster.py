"""Cluster endpoints: workers (tenancy of running job ids), readiness, Prometheus metrics."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import update
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore import gpu_leases
from jobcore.db.models import GpuLease, WorkerNode, utcnow
from jobcore.settings import Settings
from server.app import create_app


def test_workers_show_gpus_heartbeats_and_only_own_running_jobs(api: Api) -> None:
    with api.session() as session, session.begin():
        session.add(
            WorkerNode(
                id="w1",
                host="gpu-1",
                pid=10,
                gpus=["0", "1"],
                slots=2,
                heartbeat_at=utcnow() - timedelta(seconds=3),
            )
        )
    mine = api.submit(api.token("a"))
    theirs = api.submit(api.token("b"))
    api.force_status(mine["id"], "running", worker_id="w1", gpu_ids=["0"])
    api.force_status(theirs["id"], "running", worker_id="w1", gpu_ids=["1"])
    data = api.client.get("/v1/workers", headers=api.token("a")).json()["data"]
    assert len(data) == 1
    worker = data[0]
    assert worker["host"] == "gpu-1" and worker["gpus"] == ["0", "1"] and worker["busy_gpus"] == [0, 1]
    assert worker["running_jobs"] == 2 and worker["running_job_ids"] == [mine["id"]]
    assert worker["last_heartbeat_at"]
    admin_view = api.client.get("/v1/workers", headers=api.admin).json()["data"][0]
    assert sorted(admin_view["running_job_ids"]) == sorted([mine["id"], theirs["id"]])
    # An admin of another project administers that project only: the operator alone sees all.
    project_admin = api.token("a", scopes=("read", "write", "admin"))
    project_view = api.client.get("/v1/workers", headers=project_admin).json()["data"][0]
    assert project_view["running_job_ids"] == [mine["id"]]
    assert api.client.get("/v1/workers").status_code == 401


def test_workers_show_the_gpus_serving_hosts_hold_on_their_machine(api: Api) -> None:
    stale = api.settings.stale_after_seconds
    with api.session() as session, session.begin():
        session.add(WorkerNode(id="w1", host="gpu-1", pid=10, gpus=["0", "1", "2"], slots=3))
        session.add(WorkerNode(id="w2", host="gpu-2", pid=11, gpus=["0"], slots=1))
        gpu_leases.take(session, "gpu-1", "serve-a", "serve-a", gpu_leases.SERVING, ["2"], stale)
        # A job's lease is not a serving GPU, and a dead host's stale lease holds nothing.
        gpu_leases.take(session, "gpu-1", "w1", "job-x", gpu_leases.JOB, ["0"], stale)
        gpu_leases.take(session, "gpu-2", "serve-b", "serve-b", gpu_leases.SERVING, ["0"], stale)
    with api.session() as session, session.begin():
        old = utcnow() - timedelta(seconds=stale + 5)
        session.execute(update(GpuLease).where(GpuLease.owner == "serve-b").values(heartbeat_at=old))
    data = {w["id"]: w for w in api.client.get("/v1/workers", headers=api.admin).json()["data"]}
    assert data["w1"]["serving_gpus"] == [2] and data["w1"]["busy_gpus"] == []
    assert data["w2"]["serving_gpus"] == []


def test_readyz_checks_database_and_broker(api: Api, tmp_path: Path) -> None:
    assert api.client.get("/readyz").json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}
    broken = Settings(
        data_dir=tmp_path / "other",
        database_url=api.settings.database_url,
        broker_url="redis://127.0.0.1:1/0",
    )
    with TestClient(create_app(broken, dispatch=lambda _: None)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "ok" and response.json()["checks"]["broker"] != "ok"


def test_prometheus_metrics(api: Api) -> None:
    job = api.submit()
    api.submit()
    api.force_status(job["id"], "running")
    api.add_event(job["id"], "hello")
    api.client.get("/v1/jobs", headers=api.admin)
    text = api.client.get("/metrics").text
    assert 'twinkle_jobs{status="running"} 1' in text and 'twinkle_jobs{status="queued"} 1' in text
    assert "twinkle_queue_depth 1" in text
    assert "twinkle_events_ingested_total 3" in text  # two "queued" events and one message
    assert 'twinkle_api_request_duration_seconds_count{method="GET",route="/v1/jobs",status="200"} 1' in text
    assert "# TYPE twinkle_api_request_duration_seconds histogram" in text
