"""The Python client's transport: retries with back-off and Retry-After, idempotency keys on every
create, error envelopes, filters and the service probes.

These drive the client against an in-process transport that plays a misbehaving server; the
client against the real server is covered by the integration tests.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from twinkle_client import APIError, TwinkleClient


def make_client(handler) -> TwinkleClient:  # type: ignore[no-untyped-def]
    return TwinkleClient("http://t", "tok", transport=httpx.MockTransport(handler), backoff=0.001)


def test_retries_429_honouring_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("twinkle_client.client.time.sleep", sleeps.append)
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(429, headers={"Retry-After": "2"}, json={"error": {"type": "rate_limited"}})
        return httpx.Response(200, json={"id": "job-1", "status": "queued"})

    assert make_client(handler).jobs.get("job-1")["status"] == "queued"
    assert len(calls) == 3
    assert sleeps and all(s >= 2 for s in sleeps)
    assert calls[0].headers["Authorization"] == "Bearer tok"


def test_create_reuses_one_idempotency_key_across_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    keys = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            return httpx.Response(503, json={"error": {"type": "unavailable"}})
        return httpx.Response(201, json={"id": "job-1", **json.loads(request.content)})

    job = make_client(handler).jobs.create({"model": {"model_id": "m"}}, name="n")
    assert job["name"] == "n"
    assert len(keys) == 2 and keys[0] == keys[1]


def test_errors_carry_the_envelope() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {
            "error": {"type": "invalid_request_error", "code": "invalid", "message": "bad", "param": "spec.x"}
        }
        return httpx.Response(422, json=body, headers={"x-request-id": "req-1"})

    with pytest.raises(APIError) as exc:
        make_client(handler).jobs.get("job-1")
    assert (exc.value.status_code, exc.value.param, exc.value.request_id) == (422, "spec.x", "req-1")
    assert "spec.x" in str(exc.value)


def test_paginate_follows_cursors() -> None:
    pages = {None: (["a", "b"], True), "b": (["c"], False)}

    def handler(request: httpx.Request) -> httpx.Response:
        data, more = pages[request.url.params.get("after")]
        items = [{"id": i} for i in data]
        return httpx.Response(
            200, json={"object": "list", "data": items, "last_id": data[-1], "has_more": more}
        )

    assert [j["id"] for j in make_client(handler).jobs.list()] == ["a", "b", "c"]


def test_clone_and_upload_reuse_one_idempotency_key_across_retries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    seen: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.read()
        seen.append((request.url.path, request.headers["Idempotency-Key"], body))
        if len(seen) % 2 == 1:  # the first try of each call is lost
            return httpx.Response(502, json={"error": {"type": "api_error"}})
        return httpx.Response(201, json={"id": "x-1"})

    client = make_client(handler)
    client.jobs.clone("job-1", {"training": {"max_steps": 3}})
    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(b'{"text": "a"}\n' * 100)
    client.files.upload(dataset)
    (clone1, clone2), (up1, up2) = seen[:2], seen[2:]
    assert clone1[0] == "/v1/jobs/job-1/clone" and clone1[1] == clone2[1]
    assert up1[0] == "/v1/files" and up1[1] == up2[1] != clone1[1]
    # The retried upload sends the whole file again, not what is left after the first read.
    assert up1[2].count(b'{"text": "a"}') == up2[2].count(b'{"text": "a"}') == 100


def test_gives_up_after_the_retry_limit_with_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("twinkle_client.client.time.sleep", sleeps.append)
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503, json={"error": {"type": "api_error", "message": "database down"}})

    client = TwinkleClient(
        "http://t", "tok", transport=httpx.MockTransport(handler), max_retries=3, backoff=0.1
    )
    with pytest.raises(APIError) as exc:
        client.jobs.get("job-1")
    assert exc.value.status_code == 503 and exc.value.message == "database down"
    assert len(calls) == 4 and len(sleeps) == 3


def test_back_off_grows_exponentially(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("twinkle_client.client.time.sleep", sleeps.append)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"type": "api_error"}})

    client = TwinkleClient(
        "http://t", "tok", transport=httpx.MockTransport(handler), max_retries=5, backoff=0.1
    )
    with pytest.raises(APIError):
        client.health()
    # Attempt n waits between half and all of backoff * 2**n (the jitter keeps clients apart).
    assert len(sleeps) == 5
    for n, slept in enumerate(sleeps):
        assert 0.1 * 2**n * 0.5 <= slept <= 0.1 * 2**n
    assert sleeps == sorted(sleeps) and sleeps[-1] >= 4 * sleeps[0]


def test_connection_errors_are_retried_then_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    attempts = []

    def flaky(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        if len(attempts) < 3:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"status": "ok"})

    assert make_client(flaky).health() == {"status": "ok"} and len(attempts) == 3

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(httpx.ConnectError):
        make_client(down).jobs.get("job-1")


def test_retry_after_as_an_http_date(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("twinkle_client.client.time.sleep", sleeps.append)
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    answers = iter([httpx.Response(429, headers={"Retry-After": later}), httpx.Response(200, json={})])
    make_client(lambda _r: next(answers)).jobs.get("job-1")
    assert 25 <= sleeps[0] <= 30


def test_list_filters_travel_as_repeated_query_parameters() -> None:
    seen: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(200, json={"object": "list", "data": [], "has_more": False})

    client = make_client(handler)
    list(client.jobs.list(status=["queued", "running"], metadata={"team": "nlp", "run": "7"}, name="a"))
    list(client.jobs.events("job-1", order="desc", type=["status", "checkpoint"], level="error"))
    list(client.jobs.list(with_spec=True))
    jobs, events, with_spec = seen
    assert "expand" not in jobs.params and with_spec.params.get_list("expand") == ["spec"]
    assert jobs.params.get_list("status") == ["queued", "running"]
    assert jobs.params.get_list("metadata") == ["team:nlp", "run:7"] and jobs.params["name"] == "a"
    assert events.params["order"] == "desc" and events.params.get_list("type") == ["status", "checkpoint"]
    assert events.params.get_list("level") == ["error"]


def test_service_probes() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(503, json={"status": "unavailable", "checks": {"database": "refused"}})
        if request.url.path == "/metrics":
            return httpx.Response(200, text="twinkle_queue_depth 3\n")
        return httpx.Response(200, json={"status": "ok"})

    calls = []
    client = make_client(lambda r: calls.append(r) or handler(r))
    assert client.health() == {"status": "ok"}
    # Not ready is an answer to read, not an error to retry.
    assert client.ready()["checks"] == {"database": "refused"}
    assert sum(1 for r in calls if r.url.path == "/readyz") == 1
    assert "twinkle_queue_depth 3" in client.prometheus_metrics()


def test_a_download_cut_off_leaves_neither_the_file_nor_a_part(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        def body():  # type: ignore[no-untyped-def]
            yield b"x" * 1024
            raise httpx.ReadError("connection reset by peer", request=request)

        return httpx.Response(200, content=body())

    dest = tmp_path / "ckpt.tar"
    with pytest.raises(httpx.ReadError):
        make_client(handler).checkpoints.download("job-1", "ckpt-1", dest)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(IsADirectoryError):  # a folder is not overwritten by a file
        make_client(handler).checkpoints.download("job-1", "ckpt-1", tmp_path)
