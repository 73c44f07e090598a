"""`client.jobs.follow()` against a server that misbehaves in the ways a network does: a 429 when
opening the stream, a stream cut in the middle, a stream that keeps dropping, a silent stream
past the caller's deadline. The real server and worker are in tests/integration/test_client_live.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from twinkle_client import TwinkleClient
from twinkle_client.sse import HEARTBEAT, Message, read_messages

Handler = Callable[[httpx.Request], httpx.Response]


def sse(event_id: int, type_: str = "message") -> bytes:
    data = json.dumps({"id": event_id, "type": type_, "message": f"event {event_id}"})
    return f"id: {event_id}\nevent: {type_}\ndata: {data}\n\n".encode()


END = b'event: end\ndata: {"status": "succeeded"}\n\n'


def cut_after(chunks: list[bytes], request: httpx.Request) -> Iterator[bytes]:
    """The chunks, then the connection breaks."""
    yield from chunks
    raise httpx.ReadError("connection reset by peer", request=request)


def make_client(handler: Handler, max_retries: int = 4) -> TwinkleClient:
    transport = httpx.MockTransport(handler)
    return TwinkleClient("http://t", "tok", transport=transport, backoff=0.001, max_retries=max_retries)


def test_a_429_on_the_stream_is_retried_after_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("twinkle_client.client.time.sleep", sleeps.append)
    opened = []

    def handler(request: httpx.Request) -> httpx.Response:
        opened.append(request)
        if len(opened) == 1:
            return httpx.Response(429, headers={"Retry-After": "3"}, json={"error": {"type": "rate_limited"}})
        return httpx.Response(200, content=b"retry: 2000\n\n" + sse(1) + b": keep-alive\n\n" + sse(2) + END)

    events = list(make_client(handler).jobs.follow("job-1"))
    assert [e["id"] for e in events] == [1, 2]
    assert len(opened) == 2 and sleeps[0] >= 3
    assert opened[0].url.path == "/v1/jobs/job-1/events/stream"


def test_a_dropped_stream_resumes_after_the_last_event_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    resumed_from: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        resumed_from.append(request.headers.get("Last-Event-ID"))
        if len(resumed_from) == 1:
            return httpx.Response(200, content=cut_after([sse(1), sse(2, "status")], request))
        return httpx.Response(200, content=sse(3, "metrics") + END)

    events = list(make_client(handler).jobs.follow("job-1"))
    assert [e["id"] for e in events] == [1, 2, 3]
    assert resumed_from == [None, "2"]


def test_following_from_a_known_event() -> None:
    headers = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("Last-Event-ID"))
        return httpx.Response(200, content=sse(8) + END)

    assert [e["id"] for e in make_client(handler).jobs.follow("job-1", after=7)] == [8]
    assert headers == ["7"]


def test_a_stream_that_keeps_dropping_without_news_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    opened = []

    def handler(request: httpx.Request) -> httpx.Response:
        opened.append(request)
        return httpx.Response(200, content=cut_after([b": keep-alive\n\n"], request))

    with pytest.raises(ConnectionError):
        list(make_client(handler, max_retries=2).jobs.follow("job-1"))
    assert len(opened) == 3


def test_a_server_never_reached_is_said_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the reconnects of a stream that dropped: the request's own retries, then its error."""
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    tried = []

    def handler(request: httpx.Request) -> httpx.Response:
        tried.append(request)
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with pytest.raises(httpx.ConnectError, match="Connection refused"):
        list(make_client(handler, max_retries=2).jobs.follow("job-1"))
    assert len(tried) == 3  # one request and its two retries, not reconnects on top of them


def test_a_server_restarting_mid_stream_is_followed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    tried: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tried.append(request.headers.get("Last-Event-ID"))
        if len(tried) == 1:
            return httpx.Response(200, content=cut_after([sse(1)], request))
        if len(tried) <= 4:  # down for longer than one request's retries
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, content=sse(2) + END)

    events = list(make_client(handler, max_retries=2).jobs.follow("job-1"))
    assert [e["id"] for e in events] == [1, 2]
    assert tried[-1] == "1"


def test_a_silent_stream_still_ends_at_the_deadline() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        def keepalives() -> Iterator[bytes]:
            yield sse(1)
            while True:  # the job never ends; only keep-alives come
                time.sleep(0.05)
                yield b": keep-alive\n\n"

        return httpx.Response(200, content=keepalives())

    started = time.monotonic()
    seen = []
    with pytest.raises(TimeoutError):
        for event in make_client(handler).jobs.follow("job-1", timeout=0.5):
            seen.append(event["id"])
    assert seen == [1]
    assert time.monotonic() - started < 5


def test_sse_reader_yields_named_messages_and_heartbeats() -> None:
    lines = ["retry: 2000", "", ": keep-alive", "", "id: 4", "event: status", "data: {}", "data: {}", ""]
    messages = [m for m in read_messages(lines) if m != HEARTBEAT]
    assert messages == [Message("status", "4", "{}\n{}")]
    # Every line hands control back, so a caller can check its deadline between any two.
    assert len(list(read_messages(lines))) == len(lines)
