"""Watching a job: SSE with Last-Event-ID resume, metric series with downsampling, log tails."""

from __future__ import annotations

import json
import threading
import time

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api


def parse_sse(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if "event" in fields:
            events.append(fields)
    return events


def test_stream_resumes_after_last_event_id_and_ends_with_the_job(api: Api) -> None:
    job = api.submit()
    ids = [api.add_event(job["id"], f"line {i}") for i in range(3)]
    api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin)
    headers = {**api.admin, "Last-Event-ID": str(ids[0])}
    response = api.client.get(f"/v1/jobs/{job['id']}/events/stream", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert [json.loads(e["data"])["message"] for e in events[:-1]] == ["line 1", "line 2", "cancel requested"]
    assert [int(e["id"]) for e in events[:-1]][:2] == ids[1:]
    assert events[-1]["event"] == "end" and json.loads(events[-1]["data"]) == {"status": "cancelled"}
    # The query parameter works the same for clients that cannot set headers.
    again = parse_sse(
        api.client.get(f"/v1/jobs/{job['id']}/events/stream?after={ids[1]}", headers=api.admin).text
    )
    assert [json.loads(e["data"])["message"] for e in again[:-1]] == ["line 2", "cancel requested"]


def test_stream_delivers_events_as_they_are_written(api: Api) -> None:
    job = api.submit()
    api.force_status(job["id"], "running")

    def worker() -> None:
        for i in range(3):
            time.sleep(0.1)
            api.add_event(job["id"], f"step {i}", type_="metrics")
        time.sleep(0.1)
        api.force_status(job["id"], "succeeded")

    thread = threading.Thread(target=worker)
    received: list[str] = []
    with api.client.stream("GET", f"/v1/jobs/{job['id']}/events/stream", headers=api.admin) as response:
        thread.start()
        for line in response.iter_lines():
            if line.startswith("data:"):
                received.append(line)
    thread.join()
    messages = [json.loads(line[5:]).get("message") for line in received]
    assert messages[:4] == ["job queued", "step 0", "step 1", "step 2"]
    assert json.loads(received[-1][5:]) == {"status": "succeeded"}


def test_stream_rejects_a_bad_last_event_id_and_other_projects(api: Api) -> None:
    job = api.submit()
    url = f"/v1/jobs/{job['id']}/events/stream"
    response = api.client.get(url, headers={**api.admin, "Last-Event-ID": "abc"})
    assert response.status_code == 422 and response.json()["error"]["param"] == "Last-Event-ID"
    assert api.client.get(url, headers=api.token("elsewhere")).status_code == 404


def test_metrics_series_and_downsampling(api: Api) -> None:
    job = api.submit()
    api.add_metrics(job["id"], "loss", [float(i) for i in range(1, 101)])
    api.add_metrics(job["id"], "lr", [0.1] * 10)
    url = f"/v1/jobs/{job['id']}/metrics"
    everything = api.client.get(url, headers=api.admin).json()
    assert everything["object"] == "job.metrics" and set(everything["series"]) == {"loss", "lr"}
    assert len(everything["series"]["loss"]) == 100 and everything["series"]["loss"][0] == {
        "step": 1,
        "value": 1.0,
    }
    small = api.client.get(f"{url}?name=loss&max_points=10", headers=api.admin).json()["series"]
    assert set(small) == {"loss"} and len(small["loss"]) == 10
    assert small["loss"][0] == {"step": 10, "value": 5.5}  # mean of steps 1..10, placed at step 10
    assert small["loss"][-1]["step"] == 100
    assert api.client.get(f"{url}?max_points=1", headers=api.admin).status_code == 422


def test_logs_tail_the_latest_attempt(api: Api) -> None:
    job = api.submit()
    logs = api.settings.jobs_dir / job["id"] / "logs"
    rank_dir = logs / "attempt-2-ranks" / "run" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (logs / "attempt-1.log").write_text("old\n")
    (logs / "attempt-2.log").write_text("".join(f"line {i}\n" for i in range(500)))
    (rank_dir / "stdout.log").write_text("rank one says hi\n")
    url = f"/v1/jobs/{job['id']}/logs"
    body = api.client.get(f"{url}?lines=3", headers=api.admin).json()
    files = {f["name"]: f for f in body["files"]}
    assert set(files) == {"attempt-2.log", "attempt-2-ranks/run/attempt_0/1/stdout.log"}
    assert files["attempt-2.log"]["lines"] == ["line 497", "line 498", "line 499"]
    assert files["attempt-2.log"]["truncated"] is True
    assert files["attempt-2-ranks/run/attempt_0/1/stdout.log"]["truncated"] is False
    assert files["attempt-2.log"]["end"] == (logs / "attempt-2.log").stat().st_size
    first = api.client.get(f"{url}?attempt=1", headers=api.admin).json()["files"]
    assert first == [{"name": "attempt-1.log", "lines": ["old"], "truncated": False, "end": 4}]
    rank = api.client.get(f"{url}?rank=1", headers=api.admin).json()["files"]
    assert [f["name"] for f in rank] == ["attempt-2-ranks/run/attempt_0/1/stdout.log"]


def test_a_log_is_read_on_from_the_end_of_the_previous_answer(api: Api) -> None:
    job = api.submit()
    logs = api.settings.jobs_dir / job["id"] / "logs"
    logs.mkdir(parents=True)
    log = logs / "attempt-1.log"
    log.write_bytes(b"step 1\nstep 2\n")
    url = f"/v1/jobs/{job['id']}/logs"

    def read(**params: object) -> dict[str, object]:
        answer = api.client.get(url, params={"file": "attempt-1.log", **params}, headers=api.admin)
        assert answer.status_code == 200, answer.text
        (only,) = answer.json()["files"]
        return dict(only)

    tail = read(lines=1)
    assert tail["lines"] == ["step 2"] and tail["end"] == 14
    assert read(offset=14) == {"name": "attempt-1.log", "lines": [], "truncated": False, "end": 14}
    with log.open("ab") as fh:  # a whole line, then one still being written (and a non-ASCII one)
        fh.write("step 3 ✓\nstep 4 half".encode())
    grown = read(offset=14)
    assert grown["lines"] == ["step 3 ✓", "step 4 half"] and grown["end"] == log.stat().st_size
    capped = read(offset=0, lines=2)  # at most `lines`, and `end` just past them
    assert capped["lines"] == ["step 1", "step 2"] and capped["end"] == 14
    # The file of an earlier attempt stays readable by its name once a retry has started.
    (logs / "attempt-2.log").write_text("retry\n")
    assert read(offset=0)["lines"][0] == "step 1"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"offset": 0}, "offset needs file"),
        ({"file": "attempt-1.log", "offset": 99}, "offset 99 is past the end of attempt-1.log (6 bytes)"),
        ({"file": "attempt-1.log", "offset": -1}, "offset"),
    ],
)
def test_a_bad_log_offset_is_a_422_naming_it(api: Api, params: dict[str, object], message: str) -> None:
    job = api.submit()
    logs = api.settings.jobs_dir / job["id"] / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1.log").write_text("hello\n")
    answer = api.client.get(f"/v1/jobs/{job['id']}/logs", params=params, headers=api.admin)
    assert answer.status_code == 422
    assert answer.json()["error"]["param"] == "offset" and message in answer.json()["error"]["message"]


def test_a_log_file_is_chosen_by_name_never_by_path(api: Api) -> None:
    job = api.submit()
    logs = api.settings.jobs_dir / job["id"] / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1.log").write_text("mine\n")
    (api.settings.jobs_dir / job["id"] / "spec.json").write_text("{}\n")
    for name in ("../spec.json", "/etc/passwd", "attempt-1.log/../attempt-1.log"):
        answer = api.client.get(f"/v1/jobs/{job['id']}/logs", params={"file": name}, headers=api.admin)
        assert answer.status_code == 200 and answer.json()["files"] == [], name


def test_logs_of_a_job_that_never_ran_are_empty(api: Api) -> None:
    job = api.submit()
    assert api.client.get(f"/v1/jobs/{job['id']}/logs", headers=api.admin).json()["files"] == []


def test_events_filter_by_every_type_the_worker_writes(api: Api) -> None:
    # Samples of training.sample_prompts are events of their own type, listed and filtered like all.
    from jobcore.jobs.events import EVENT_TYPES

    job = api.submit()
    api.add_event(job["id"], "samples at step 2", type_="sample")
    api.add_event(job["id"], "step 2", type_="metrics")
    for kind in EVENT_TYPES:
        page = api.client.get(f"/v1/jobs/{job['id']}/events", params={"type": kind}, headers=api.admin)
        assert page.status_code == 200, page.text
        assert {e["type"] for e in page.json()["data"]} <= {kind}
    samples = api.client.get(f"/v1/jobs/{job['id']}/events?type=sample", headers=api.admin).json()["data"]
    assert [e["message"] for e in samples] == ["samples at step 2"]
