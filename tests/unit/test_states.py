"""The job state machine, exhaustively: the table, `transition()` on a real database for every pair
of states, and every user action through the API from every state."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import select
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import Job, JobEvent
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.states import ALLOWED, TERMINAL, InvalidTransition, JobStatus, can_transition

S = JobStatus
ALL = list(JobStatus)


def test_the_table_covers_every_state_and_terminal_states_only_resume() -> None:
    assert set(ALLOWED) == set(ALL)
    assert ALLOWED[S.SUCCEEDED] == frozenset()
    for status in TERMINAL:
        assert ALLOWED[status] <= {S.QUEUED}, "a finished job may only be requeued by a resume"
    for status in ALL:
        assert status not in ALLOWED[status], "no self-transitions"


def test_transition_on_the_database_for_every_pair(api: Api) -> None:
    job_id = api.submit()["id"]
    for current, target in itertools.product(ALL, ALL):
        api.force_status(job_id, current.value, finished_at=None)
        with api.session() as session, session.begin():
            job = session.get(Job, job_id)
            assert job is not None
            before = session.scalar(select(JobEvent.id).order_by(JobEvent.id.desc()).limit(1))
            if can_transition(current, target):
                transition(session, job, target)
                assert job.status == target.value
                assert (job.finished_at is not None) == (target in TERMINAL)
                event = session.scalars(select(JobEvent).where(JobEvent.id > (before or 0))).one()
                assert event.type == "status" and event.data == {"from": current.value, "to": target.value}
            else:
                with pytest.raises(InvalidTransition) as info:
                    transition(session, job, target)
                assert info.value.current == current.value
                assert f"'{current.value}'" in str(info.value)
                assert job.status == current.value


def test_a_stale_job_object_loses_the_race(api: Api) -> None:
    job_id = api.submit()["id"]
    with api.session() as session, session.begin():
        stale = session.get(Job, job_id)
        assert stale is not None
        api.force_status(job_id, "starting")  # another process claimed it meanwhile
        with pytest.raises(InvalidTransition) as info:
            transition(session, stale, S.CANCELLED)  # queued -> cancelled, but it is not queued now
        assert info.value.current == "starting"


CANCEL = {
    S.QUEUED: S.CANCELLED,
    S.PAUSED: S.CANCELLED,
    S.RETRYING: S.CANCELLED,
    S.STARTING: S.CANCELLING,
    S.RUNNING: S.CANCELLING,
    S.PAUSING: S.CANCELLING,
    S.CANCELLING: S.CANCELLING,
}
PAUSE = {
    S.QUEUED: S.PAUSED,
    S.STARTING: S.PAUSING,
    S.RUNNING: S.PAUSING,
    S.PAUSING: S.PAUSING,
    S.PAUSED: S.PAUSED,
}
RESUME = {S.PAUSED: S.QUEUED, S.FAILED: S.QUEUED, S.CANCELLED: S.QUEUED}


@pytest.mark.parametrize(("action", "outcomes"), [("cancel", CANCEL), ("pause", PAUSE), ("resume", RESUME)])
def test_every_action_from_every_state_through_the_api(api: Api, action: str, outcomes: dict[S, S]) -> None:
    job_id = api.submit()["id"]
    for status in ALL:
        api.force_status(job_id, status.value)
        response = api.client.post(f"/v1/jobs/{job_id}/{action}", headers=api.admin)
        if status in outcomes:
            assert response.status_code == 200, (status, response.text)
            assert response.json()["status"] == outcomes[status].value, status
        else:
            assert response.status_code == 409, (status, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_state" and f"'{status.value}'" in error["message"]
            with api.session() as session:
                assert session.get(Job, job_id).status == status.value  # type: ignore[union-attr]


def test_delete_only_finished_jobs(api: Api) -> None:
    for status in ALL:
        job_id = api.submit()["id"]
        api.force_status(job_id, status.value)
        response = api.client.delete(f"/v1/jobs/{job_id}", headers=api.admin)
        if status in TERMINAL:
            assert response.status_code == 200 and response.json() == {
                "id": job_id,
                "object": "job",
                "deleted": True,
            }
            assert api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).status_code == 404
        else:
            assert response.status_code == 409 and status.value in response.json()["error"]["message"]
