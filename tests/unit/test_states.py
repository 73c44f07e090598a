"""The job state machine, exhaustively: the table, `transition()` on a real database for every pair
of states, the table of user actions against it, and every user action through the API from every
state (409 exactly where the table does not offer it)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import select
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import Job, JobEvent
from jobcore.jobs import states
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.states import (
    ACTIONS,
    ALLOWED,
    ALREADY_REQUESTED,
    TERMINAL,
    InvalidTransition,
    JobAction,
    JobStatus,
    actions_for,
    can_transition,
)

S = JobStatus
ALL = list(JobStatus)


def test_the_table_covers_every_state_and_terminal_states_only_resume() -> None:
    assert set(ALLOWED) == set(ALL)
    assert ALLOWED[S.SUCCEEDED] == frozenset()
    for status in TERMINAL:
        assert ALLOWED[status] <= {S.QUEUED}, "a finished job may only be requeued by a resume"
    for status in ALL:
        assert status not in ALLOWED[status], "no self-transitions"


def test_every_offered_action_is_a_transition_the_state_machine_allows() -> None:
    assert list(ACTIONS) == list(JobAction), "every action has its row, in the order buttons show"
    for action, applies in ACTIONS.items():
        assert applies, f"{action} applies nowhere"
        for status, target in applies.items():
            assert target is None or can_transition(status, target), (action, status, target)
    assert set(ACTIONS[JobAction.CLONE]) == set(ALL) and set(ACTIONS[JobAction.CLONE].values()) == {None}
    assert set(ACTIONS[JobAction.DELETE]) == TERMINAL, "only a job whose run ended is deleted"
    # Only a user's resume leaves a terminal status, and it starts a new attempt (queued).
    for status in TERMINAL:
        moves = {a for a, applies in ACTIONS.items() if applies.get(status) is not None}
        assert moves == ({JobAction.RESUME} if ALLOWED[status] else set()), status
        assert ACTIONS[JobAction.RESUME].get(status, S.QUEUED) == S.QUEUED
    # An action already asked for is a no-op, never offered as well.
    for action, statuses in ALREADY_REQUESTED.items():
        assert not statuses & set(ACTIONS[action]), action


def test_actions_for_lists_the_offered_actions_in_a_stable_order() -> None:
    assert actions_for("queued") == ["pause", "cancel", "clone"]
    assert actions_for(S.RUNNING) == ["pause", "cancel", "clone"]
    assert actions_for("paused") == ["resume", "cancel", "clone"]
    assert actions_for("cancelling") == ["clone"]
    assert actions_for("failed") == ["resume", "clone", "delete"]
    assert actions_for("succeeded") == ["clone", "delete"]
    for status in ALL:
        assert actions_for(status) == [a.value for a in JobAction if status in ACTIONS[a]]


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


# (status the request reads, status a worker writes before the request's write, action, the answer's
# status or its 409's status)
RACES = [
    ("starting", "running", "cancel", "cancelling"),  # the worker saw the run start: a CI failure
    ("starting", "running", "pause", "pausing"),
    ("queued", "starting", "cancel", "cancelling"),  # claimed meanwhile: now the worker stops it
    ("queued", "starting", "pause", "pausing"),
    ("running", "cancelling", "cancel", "cancelling"),  # another cancel won: the same answer
    ("running", "succeeded", "cancel", "409 succeeded"),  # finished meanwhile: nothing to stop
]


def _worker_moves_first(api: Api, monkeypatch: pytest.MonkeyPatch, job_id: str, moves: list[str]) -> None:
    """Before each of the service's status writes, commit the next of `moves` from another session."""
    from server.jobs import service

    def worker_first(session: Any, job: Job, *args: Any, **kwargs: Any) -> Job:
        if moves:
            api.force_status(job_id, moves.pop(0))
        return transition(session, job, *args, **kwargs)

    monkeypatch.setattr(service, "transition", worker_first)


@pytest.mark.parametrize(("read", "move", "action", "outcome"), RACES)
def test_a_worker_moving_the_job_during_a_pause_or_cancel_changes_the_outcome_not_the_answer(
    api: Api, monkeypatch: pytest.MonkeyPatch, read: str, move: str, action: str, outcome: str
) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, read)
    moves = [move]
    _worker_moves_first(api, monkeypatch, job_id, moves)
    response = api.client.post(f"/v1/jobs/{job_id}/{action}", headers=api.admin)
    assert moves == []  # the worker's write did land between the request's read and its write
    with api.session() as session:
        stored = session.get_one(Job, job_id).status
        events = session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id)).all()
    if outcome.startswith("409 "):
        assert response.status_code == 409, response.text
        assert f"is '{move}'" in response.json()["error"]["message"] and stored == move
        assert f"{action} requested" not in events
    else:
        assert response.status_code == 200, response.text
        assert response.json()["status"] == outcome == stored
        assert events.count(f"{action} requested") == (0 if move == outcome else 1)


# On SQLite the request's first write, even one that matched no row, takes the database's write
# lock, so no worker can move the job again before the request's next try: only PostgreSQL can.
@pytest.mark.parametrize("api_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_job_that_keeps_moving_gets_a_409_after_a_few_tries(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.jobs.service import ACTION_TRIES

    job_id = api.submit()["id"]
    api.force_status(job_id, "starting")
    moves = (["running", "pausing"] * ACTION_TRIES)[:ACTION_TRIES]  # each one takes a cancel
    last = moves[-1]
    _worker_moves_first(api, monkeypatch, job_id, moves)
    response = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.admin)
    assert moves == []  # a move before each try (a fourth try would have answered 200)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["message"] == f"cannot cancel: the job is '{last}'"


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


def test_the_action_table_in_docs_api_is_the_codes() -> None:
    """docs/api.md's table of actions (one row per action and target) says what ACTIONS says."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    documented: dict[str, dict[str, str | None]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] not in set(JobAction):
            continue
        action, sources, to = cells
        froms = [s.value for s in ALL] if sources == "every status" else sources.split(", ")
        first = to.split(" ")[0].strip(",:")
        target = first if first in set(JobStatus) else None
        for source in froms:
            documented.setdefault(action, {})[source] = target
    in_code = {
        a.value: {s.value: t and t.value for s, t in applies.items()} for a, applies in ACTIONS.items()
    }
    assert documented == in_code


def _client_on(api: Api) -> Any:
    """The client package talking to the in-process app (through the test client)."""
    import httpx

    from twinkle_client import TwinkleClient

    def forward(request: httpx.Request) -> httpx.Response:
        answer = api.client.request(
            request.method, str(request.url), headers=request.headers, content=request.read()
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    token = api.admin["Authorization"].removeprefix("Bearer ")
    return TwinkleClient("http://testserver", token, transport=httpx.MockTransport(forward))


def _act(api: Api, job_id: str, action: JobAction) -> Any:
    if action == JobAction.DELETE:
        return api.client.delete(f"/v1/jobs/{job_id}", headers=api.admin)
    return api.client.post(f"/v1/jobs/{job_id}/{action.value}", json={}, headers=api.admin)


@pytest.mark.parametrize("action", list(JobAction))
@pytest.mark.parametrize("status", ALL)
def test_the_api_answers_409_exactly_when_the_table_does_not_offer_the_action(
    api: Api, status: S, action: JobAction
) -> None:
    job_id = api.submit()["id"]
    api.force_status(job_id, status.value)
    shown = api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).json()
    assert shown["actions"] == actions_for(status) and shown["terminal"] == (status in TERMINAL)
    response = _act(api, job_id, action)
    after = api.client.get(f"/v1/jobs/{job_id}", headers=api.admin)
    if status in ACTIONS[action]:
        assert response.status_code in (200, 201), response.text
        target = ACTIONS[action][status]
        if action == JobAction.DELETE:
            assert after.status_code == 404
        elif target is None:  # clone: a new job, the source as it was
            assert response.json()["id"] != job_id and after.json()["status"] == status.value
        else:
            assert response.json()["status"] == target.value == after.json()["status"]
            assert response.json()["actions"] == actions_for(target)
    elif status in ALREADY_REQUESTED.get(action, frozenset()):
        assert response.status_code == 200 and response.json()["status"] == status.value
        assert response.json()["actions"] == actions_for(status)
    else:
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_state" and f"'{status.value}'" in error["message"]
        assert after.json()["status"] == status.value


def test_an_action_added_to_the_table_reaches_the_api_client_and_cli(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offer resume while retrying (retrying -> queued is a transition the machine allows): one
    edit of ACTIONS, and the API lists it and performs it, the client and the CLI show it."""
    from click.testing import CliRunner

    from twinkle_cli import resources
    from twinkle_client import TwinkleClient

    job_id = api.submit()["id"]
    api.force_status(job_id, "retrying")
    assert "resume" not in api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).json()["actions"]
    monkeypatch.setitem(states.ACTIONS, JobAction.RESUME, {**ACTIONS[JobAction.RESUME], S.RETRYING: S.QUEUED})

    token = api.admin["Authorization"].removeprefix("Bearer ")

    def client(url: str | None = None, tok: str | None = None) -> TwinkleClient:
        return _client_on(api)

    assert client().jobs.get(job_id)["actions"] == ["resume", "cancel", "clone"]
    monkeypatch.setattr(resources, "TwinkleClient", client)
    shown = CliRunner().invoke(
        resources.jobs, ["--url", "http://testserver", "--token", token, "get", job_id]
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert (lines[0], lines[-1]) == (f"{job_id}  retrying  demo", "actions     resume, cancel, clone")
    response = api.client.post(f"/v1/jobs/{job_id}/resume", headers=api.admin)
    assert response.status_code == 200 and response.json()["status"] == "queued", response.text


def test_clients_wait_on_the_servers_terminal_flag(api: Api) -> None:
    job_id = api.submit()["id"]
    client = _client_on(api)
    with pytest.raises(TimeoutError):
        client.jobs.wait(job_id, timeout=0.05, poll=0.01)
    api.force_status(job_id, "failed")  # ended, though a resume could start it again
    assert client.jobs.wait(job_id, timeout=5, poll=0.01)["terminal"] is True
