"""The relay between the API server and a serving host, over real loopback HTTP.

The host here is the OpenAI-protocol stand-in of tests/support (it echoes prompt words, one per
`TOKEN_DELAY`, and counts the streams it is generating): it stands in for the host's protocol,
so these tests pin what the relay itself does. The real host is exercised end to end in
tests/integration/test_inference_openai.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai_standin
import pytest
import uvicorn
from fastapi import FastAPI, Request
from openai_standin import BUSY, FINE_TUNED, TOKEN, Standin, serve_standin
from starlette.responses import Response

from server.inference.relay import HostConnections, HostRelay


@pytest.fixture(scope="module")
def host() -> Iterator[Standin]:
    yield from serve_standin()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module", params=["kept connections", "a client per request"])
def relay(host: Standin, request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    """An app whose one route relays to the hosts and secret set in `config` (per test): with the
    API server's kept connections, and without them (an app that sets none)."""
    config: dict[str, Any] = {"kept": request.param == "kept connections"}
    connections = HostConnections() if config["kept"] else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if connections is not None:
            await connections.aclose()  # as the API server's lifespan does

    app = FastAPI(lifespan=lifespan)
    if connections is not None:
        app.state.host_connections = connections

    @app.post("/v1/{kind:path}")
    async def forward(kind: str, request: Request) -> Response:
        return HostRelay(config["hosts"], f"/v1/{kind}", await request.json(), config["secret"])

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", config
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture()
def url(relay: tuple[str, dict[str, Any]], host: Standin) -> str:
    base, config = relay
    config.update(hosts=[host.url], secret=TOKEN)
    return base


def _chat(model: str = FINE_TUNED, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "one two three"}], **extra}


def test_answers_pass_through_plain_and_streamed(url: str, host: Standin) -> None:
    plain = httpx.post(f"{url}/v1/chat/completions", json=_chat(max_tokens=2))
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"
    assert plain.json()["choices"][0]["message"]["content"] == "one two "
    assert host.state.requests[-1] == _chat(max_tokens=2)  # the body reaches the host unchanged

    with httpx.stream(
        "POST", f"{url}/v1/completions", json={"model": FINE_TUNED, "prompt": "a b", "stream": True}
    ) as streamed:
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.headers["cache-control"] == "no-cache"
        events = [line for line in streamed.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == "a b "


def test_kept_connections_carry_one_request_after_another(
    url: str, relay: tuple[str, dict[str, Any]], host: Standin
) -> None:
    for _ in range(3):
        answer = httpx.post(f"{url}/v1/chat/completions", json=_chat(max_tokens=1))
        assert answer.status_code == 200
    # The host sees the relay's connections: one kept for all three, or one per request.
    ports = host.state.peers[-3:]
    assert len(set(ports)) == (1 if relay[1]["kept"] else 3), ports


def test_host_errors_keep_the_envelope_and_retry_after(url: str, relay: tuple[str, dict[str, Any]]) -> None:
    unknown = httpx.post(f"{url}/v1/chat/completions", json=_chat("job-x:ckpt-9"))
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    loading = httpx.post(f"{url}/v1/chat/completions", json=_chat(BUSY))
    assert loading.status_code == 503 and loading.headers["retry-after"] == "1"
    assert loading.json()["error"]["code"] == "model_loading"
    too_long = httpx.post(f"{url}/v1/chat/completions", json=_chat(max_tokens=100))
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "messages"

    relay[1]["secret"] = "wrong"  # the host refuses the server itself: nothing the client can fix
    refused = httpx.post(f"{url}/v1/chat/completions", json=_chat())
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "serving_host_error"


def test_an_unreachable_host_is_skipped(url: str, relay: tuple[str, dict[str, Any]], host: Standin) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there: connection refused
    relay[1]["hosts"] = [dead, host.url]
    assert httpx.post(f"{url}/v1/chat/completions", json=_chat(max_tokens=1)).status_code == 200
    relay[1]["hosts"] = [dead]
    none = httpx.post(f"{url}/v1/chat/completions", json=_chat())
    assert none.status_code == 503 and int(none.headers["retry-after"]) > 0
    assert none.json()["error"]["code"] == "no_serving_host"


def test_a_host_that_drops_the_request_is_a_502(url: str, relay: tuple[str, dict[str, Any]]) -> None:
    with socket.socket() as listener:  # accepts, reads the request, hangs up without an answer
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def hang_up() -> None:
            connection, _ = listener.accept()
            connection.recv(65536)
            connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
        relay[1]["hosts"] = [f"http://127.0.0.1:{listener.getsockname()[1]}"]
        dropped = httpx.post(f"{url}/v1/chat/completions", json=_chat(), timeout=10)
    assert dropped.status_code == 502 and dropped.json()["error"]["code"] == "serving_host_error"


@pytest.fixture()
def slow_host(host: Standin) -> Iterator[Standin]:
    """The stand-in at 0.25 s a word: 20 words take 5 s unless the client's leaving stops them."""
    host.state.token_delay = 0.25
    try:
        yield host
    finally:
        host.state.token_delay = openai_standin.TOKEN_DELAY


def _stops_within(host: Standin, seconds: float) -> None:
    left = time.monotonic()
    while host.state.active and time.monotonic() - left < seconds + 1:
        time.sleep(0.02)
    assert host.state.active == 0, "the host kept generating for a client that had gone"
    assert time.monotonic() - left < seconds


def test_a_client_that_leaves_mid_stream_stops_the_generation(url: str, slow_host: Standin) -> None:
    prompt = " ".join(f"w{i}" for i in range(20))
    body = {"model": FINE_TUNED, "prompt": prompt, "max_tokens": 20, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as streamed:
        lines = streamed.iter_lines()  # held: dropping a half-read iterator closes the connection
        assert next(lines).startswith("data: ") and slow_host.state.active == 1
    _stops_within(slow_host, 2.5)  # the `with` closed the connection


def test_a_client_that_leaves_before_the_answer_stops_the_generation(url: str, slow_host: Standin) -> None:
    """A whole answer sends nothing until it is done: a client that gives up before then (its
    timeout) closes the upstream request while the relay still waits for the host's headers."""
    prompt = "SLOW " + " ".join(f"w{i}" for i in range(19))
    body = {"model": FINE_TUNED, "prompt": prompt, "max_tokens": 20}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.6))
    assert slow_host.state.active == 1  # still generating when the client gave up
    _stops_within(slow_host, 2.5)
