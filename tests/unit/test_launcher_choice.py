"""`resources.launcher` without Ray: the API refuses an unknown launcher (422 naming the field)
and takes a Ray job of several nodes, a worker without a Ray address never claims a Ray job, and
the worker picks the attempt implementation from the launcher. (On a live Ray cluster:
tests/integration/test_ray_launcher.py and test_ray_multinode.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.migrate import upgrade
from jobcore.db.models import Job, Project
from jobcore.db.session import session_scope
from jobcore.jobs.spec import resources_of
from jobcore.settings import Settings
from worker.agent import WorkerAgent
from worker.attempt import AttemptTarget, start_attempt
from worker.claim import claim_next_job
from worker.supervisor import Supervisor

SPEC: dict[str, Any] = {"model": {"config": {}}, "data": {"train_file": "/dev/null"}}
RAY_SPEC: dict[str, Any] = {**SPEC, "resources": {"launcher": "ray"}}


def test_the_api_refuses_an_unknown_launcher_naming_the_field(api: Api) -> None:
    body = spec_body()
    body["spec"]["resources"] = {"launcher": "mpirun"}
    assert api.client.post("/v1/jobs", json=body, headers=api.admin).json()["error"]["param"] == (
        "spec.resources.launcher"
    )
    assert api.dispatched == []
    body["spec"]["resources"] = {"launcher": "ray", "nproc_per_node": 2}
    body["spec"]["training"] = {"batch_size": 2}
    created = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["resources"]["launcher"] == "ray"
    # Several nodes: one bundle per node of a Ray placement group (worker.ray_gang).
    body["spec"]["resources"] = {"launcher": "ray", "nnodes": 2}
    created = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert created.status_code == 201, created.text


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    s = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.ensure_dirs()
    upgrade(s.resolved_database_url)
    return s


def add_jobs(settings: Settings, *specs: dict[str, Any]) -> list[str]:
    with session_scope(settings.resolved_database_url) as session:
        project = Project(name="p")
        session.add(project)
        session.flush()
        jobs = [
            Job(project_id=project.id, spec=spec, priority=len(specs) - i) for i, spec in enumerate(specs)
        ]
        session.add_all(jobs)
        session.flush()
        return [job.id for job in jobs]


def claim(settings: Settings, launchers: tuple[str, ...]) -> str | None:
    with session_scope(settings.resolved_database_url) as session:
        job = claim_next_job(session, "w1", lambda n: True, launchers)
        return job.id if job else None


def test_a_worker_without_a_ray_address_leaves_ray_jobs_to_one_with_it(settings: Settings) -> None:
    ray_job, torchrun_job = add_jobs(settings, RAY_SPEC, SPEC)  # the Ray job has the higher priority
    assert WorkerAgent(settings).launchers == ("torchrun",)
    assert claim(settings, ("torchrun",)) == torchrun_job
    assert claim(settings, ("torchrun",)) is None  # the Ray job stays queued
    ray_worker = WorkerAgent(settings.model_copy(update={"ray_address": "http://127.0.0.1:8265"}))
    assert ray_worker.launchers == ("torchrun", "ray")
    assert claim(settings, ray_worker.launchers) == ray_job


def test_launcher_of_stored_specs_and_no_ray_job_without_an_address(tmp_path: Path) -> None:
    # Older rows (no launcher field) and no spec at all read as torchrun.
    assert resources_of(SPEC).launcher == "torchrun" and resources_of(None).launcher == "torchrun"
    assert resources_of(RAY_SPEC).launcher == "ray"
    target = AttemptTarget("job-1", 1, "ray", 1, [])
    with pytest.raises(RuntimeError, match="without TWINKLE_RAY_ADDRESS"):
        start_attempt(target, ["true"], {}, tmp_path, tmp_path / "a.log", ray_address=None)
    local = start_attempt(
        AttemptTarget("job-1", 1, "torchrun", 1, []),
        ["sh", "-c", "echo hi; exit 3"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path,
        tmp_path / "logs" / "a.log",
        ray_address=None,
    )
    assert local.wait() == 3 and local.can_signal
    local.reap()
    assert (tmp_path / "logs" / "a.log").read_text() == "hi\n"
    assert local.description.startswith("launched torchrun (pid ")


def test_a_ray_job_takes_no_lease_and_is_claimed_with_every_slot_taken(settings: Settings) -> None:
    from sqlalchemy import select

    from jobcore.db.models import GangMember

    (ray_job,) = add_jobs(settings, {**SPEC, "resources": {"launcher": "ray", "nnodes": 2}})
    agent = WorkerAgent(settings.model_copy(update={"ray_address": "http://127.0.0.1:8265"}), slots=1)
    assert agent.ledger.acquire("another-job", 1) is not None
    assert not agent.ledger.has_capacity()  # a torchrun job would wait for this slot
    sup = agent._claim_one()
    assert sup is not None and sup.job_id == ray_job
    assert isinstance(sup, Supervisor) and sup.a.gpu_ids == [] and sup.a.launcher == "ray"
    assert sup.a.nnodes == 1  # Ray places the nodes: this worker leads no gang of workers
    assert agent.ledger.active_jobs() == ["another-job"]
    with session_scope(settings.resolved_database_url) as session:
        assert session.scalars(select(GangMember)).all() == []
