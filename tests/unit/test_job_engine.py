"""A job handed to a cluster engine: its engine, id and state on the row, the API and the events."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import Job, JobEvent
from jobcore.jobs.engine import record_engine_state


def test_engine_state_is_recorded_once_per_change_and_shown_by_the_api(api: Api) -> None:
    job_id = api.client.post("/v1/jobs", json=spec_body(), headers=api.admin).json()["id"]
    assert api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).json()["engine"] is None

    states = ["PENDING", "PENDING", "RUNNING", "RUNNING"]
    changed = []
    for state in states:
        with api.session() as session, session.begin():
            job = session.get(Job, job_id)
            assert job is not None
            changed.append(
                record_engine_state(session, job, engine="slurm", engine_job_id="4711", state=state)
            )
    assert changed == [True, False, True, False]

    body = api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).json()
    assert body["engine"] == {"name": "slurm", "job_id": "4711", "state": "RUNNING"}
    with api.session() as session:
        messages = session.scalars(
            select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.data.is_not(None))
        ).all()
    assert [m for m in messages if m.startswith("slurm")] == [
        "slurm job 4711: PENDING",
        "slurm job 4711: RUNNING",
    ]


def test_an_unknown_engine_is_refused(api: Api) -> None:
    job_id = api.client.post("/v1/jobs", json=spec_body(), headers=api.admin).json()["id"]
    with api.session() as session, session.begin():
        job = session.get(Job, job_id)
        assert job is not None
        with pytest.raises(ValueError, match="engine must be one of"):
            record_engine_state(session, job, engine="k8s", engine_job_id="x", state="RUNNING")  # type: ignore[arg-type]
