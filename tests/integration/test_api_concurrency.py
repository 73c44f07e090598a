"""The API under concurrent use: pagination while jobs are inserted, an event cursor while
events commit out of id order, idempotency-key races, concurrent cancels — on SQLite and
PostgreSQL."""

from __future__ import annotations

import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import Job, JobEvent


def test_pagination_is_stable_while_jobs_are_inserted(api: Api) -> None:
    before = [api.submit()["id"] for _ in range(12)]
    stop = threading.Event()
    inserted: list[str] = []

    def insert_continuously() -> None:
        while not stop.is_set() and len(inserted) < 40:
            inserted.append(api.submit()["id"])

    writer = threading.Thread(target=insert_continuously)
    writer.start()
    try:
        seen: list[str] = []
        page = api.client.get("/v1/jobs?limit=3", headers=api.admin).json()
        seen += [j["id"] for j in page["data"]]
        while page["has_more"]:
            page = api.client.get(f"/v1/jobs?limit=3&after={page['last_id']}", headers=api.admin).json()
            seen += [j["id"] for j in page["data"]]
    finally:
        stop.set()
        writer.join()
    assert len(seen) == len(set(seen)), "a job appeared on two pages"
    assert set(before) <= set(seen), "a job that existed before paging started was skipped"
    assert seen[-len(before) :] == before[::-1]  # the pre-existing jobs, in order, at the end


def test_concurrent_requests_with_one_idempotency_key_create_one_job(api: Api) -> None:
    headers = {**api.admin, "Idempotency-Key": "race-1"}

    def post(_: int) -> tuple[int, str]:
        response = api.client.post("/v1/jobs", json=spec_body(), headers=headers)
        return response.status_code, response.json().get("id", response.text)

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(post, range(6)))
    codes = sorted(code for code, _ in results)
    assert codes == [200] * 5 + [201], results
    assert len({job_id for _, job_id in results}) == 1
    with api.session() as session:
        assert session.query(Job).count() == 1
    assert len(api.dispatched) == 1


def test_concurrent_cancels_record_one_transition(api: Api) -> None:
    job = api.submit()

    def cancel(_: int) -> int:
        return api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin).status_code

    with ThreadPoolExecutor(max_workers=4) as pool:
        codes = sorted(pool.map(cancel, range(4)))
    assert codes[0] == 200 and set(codes) <= {200, 409}
    assert codes.count(200) == 1  # the others found it already cancelled
    with api.session() as session:
        status_events = session.query(JobEvent).filter(
            JobEvent.job_id == job["id"], JobEvent.type == "status"
        )
        assert [e.data["to"] for e in status_events] == ["queued", "cancelled"]  # type: ignore[index]


def test_an_event_cursor_misses_no_event_while_writers_commit_concurrently(api: Api) -> None:
    # Ids come from a sequence when a row is flushed, but become visible at commit: two
    # transactions that overlap can commit out of id order, and a reader that already moved its
    # cursor past the later id would never see the earlier one. The writers here flush, dawdle,
    # then commit, as ingestion does (it uploads a checkpoint between the two).
    job_id = api.submit()["id"]
    writers, batches = 3, 15

    def write(writer: int) -> None:
        rng = random.Random(writer)
        for batch in range(batches):
            with api.session() as session, session.begin():
                session.add(JobEvent(job_id=job_id, type="message", message=f"w{writer}-{batch}"))
                session.flush()
                time.sleep(rng.uniform(0, 0.02))

    def read_all(cursor: int | None) -> tuple[list[str], int | None]:
        seen = []
        while True:
            query = f"/v1/jobs/{job_id}/events?limit=100" + (f"&after={cursor}" if cursor else "")
            page = api.client.get(query, headers=api.admin).json()
            seen += [event["message"] for event in page["data"]]
            cursor = page["last_id"] or cursor
            if not page["has_more"]:
                return seen, cursor

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    seen: list[str] = []
    cursor = None
    while True:
        writing = any(thread.is_alive() for thread in threads)
        page, cursor = read_all(cursor)
        seen += page
        if not writing:  # this read began after the last commit
            break
    for thread in threads:
        thread.join()
    written = {f"w{w}-{b}" for w in range(writers) for b in range(batches)}
    assert len(seen) == len(set(seen)), "an event was returned twice"
    assert written - set(seen) == set(), "the cursor skipped events committed after a later id"
