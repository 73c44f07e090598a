"""The Python client against a real server and worker: `jobs.follow()` delivers a real job's
events in order, ends at its final status, and survives a stream cut in the middle.

The cut is made by the client's transport (the network between client and server), after the
third event of the first stream: the job's speed does not matter, the cut always lands mid-job's
history, and the client must reopen the stream with `Last-Event-ID` to get the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_service import TOKEN, LiveService, tiny_spec

from twinkle_client import TwinkleClient

pytestmark = pytest.mark.slow


class CutStream(httpx.SyncByteStream):
    """The server's bytes up to the end of the `events`-th event, then a reset connection."""

    def __init__(self, upstream: httpx.SyncByteStream, events: int, request: httpx.Request) -> None:
        self.upstream, self.events, self.request = upstream, events, request

    def __iter__(self) -> Iterator[bytes]:
        seen, buffer = 0, b""
        for chunk in self.upstream:
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                yield block + b"\n\n"
                if b"\nid: " in b"\n" + block:  # an event (not the retry hint or a keep-alive)
                    seen += 1
                    if seen == self.events:
                        raise httpx.ReadError("connection reset by peer", request=self.request)

    def close(self) -> None:
        self.upstream.close()


class CuttingTransport(httpx.HTTPTransport):
    """Real HTTP, except that the first event stream is cut after `events` events."""

    def __init__(self, events: int) -> None:
        super().__init__()
        self.events = events
        self.streams: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not request.url.path.endswith("/events/stream"):
            return response
        self.streams.append(request)
        if len(self.streams) > 1:
            return response
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=CutStream(response.stream, self.events, request),  # type: ignore[arg-type]
            request=request,
        )


@pytest.fixture()
def service(tmp_path: Path, tiny_model_dir: Path) -> Iterator[LiveService]:
    svc = LiveService.configure(tmp_path, [tiny_model_dir])
    svc.start_server()
    svc.start_worker()
    try:
        yield svc
    finally:
        svc.stop()


def test_follow_a_real_job_through_a_dropped_stream(
    service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    transport = CuttingTransport(events=3)
    client = TwinkleClient(service.url, TOKEN, transport=transport, backoff=0.05)
    dataset = client.files.upload(write_text_dataset(tmp_path / "train.jsonl", n=32))
    spec = tiny_spec(tiny_model_dir, Path("unused"), steps=4, nproc=1)
    spec["data"]["train_file"] = dataset["id"]
    job = client.jobs.create(spec, name="followed")

    followed = list(client.jobs.follow(job["id"], timeout=300))

    # It ended because the job did: the last event is the final status, and nothing follows it.
    final = client.jobs.get(job["id"])
    assert final["status"] == "succeeded", service.worker_log()
    assert followed[-1]["type"] == "status" and followed[-1]["data"]["to"] == "succeeded"
    # In order, nothing repeated, nothing missed across the cut: the same as the stored history.
    ids = [e["id"] for e in followed]
    assert ids == sorted(set(ids))
    assert ids == [e["id"] for e in client.jobs.events(job["id"])]
    steps = [e["data"]["step"] for e in followed if e["type"] == "metrics" and "loss" in e["data"]]
    assert steps == [1, 2, 3, 4]
    # The stream was reopened once, from the last event the client had seen before the cut.
    assert len(transport.streams) == 2
    assert "last-event-id" not in transport.streams[0].headers
    assert transport.streams[1].headers["last-event-id"] == str(ids[2])
    client.close()
