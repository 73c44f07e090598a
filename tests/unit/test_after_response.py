"""Work a request defers (`server.common.after_response`) runs after its whole response, in order;
a failure is logged and changes nothing; a request that failed runs none of it."""

from __future__ import annotations

import logging

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from server.cluster.prometheus import ApiLatency
from server.common import after_response
from server.common.middleware import RequestContextMiddleware


def _client(events: list[str]) -> TestClient:
    async def work(name: str) -> None:
        events.append(name)

    async def fail() -> None:
        raise RuntimeError("the database went away")

    async def streamed(request: Request) -> StreamingResponse:
        after_response.defer(request, lambda: work("first"))
        after_response.defer(request, fail)
        after_response.defer(request, lambda: work("second"))

        async def body():  # type: ignore[no-untyped-def]
            for chunk in ("a", "b"):
                events.append(f"sent {chunk}")
                yield chunk

        return StreamingResponse(body())

    async def broken(request: Request) -> PlainTextResponse:
        after_response.defer(request, lambda: work("never"))
        raise RuntimeError("the endpoint failed")

    app = Starlette(routes=[Route("/streamed", streamed), Route("/broken", broken)])
    app.add_middleware(RequestContextMiddleware, latency=ApiLatency())
    return TestClient(app, raise_server_exceptions=False)


def test_deferred_work_runs_after_the_whole_response_in_order_past_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []
    with caplog.at_level(logging.WARNING, logger="server.common.after_response"):
        response = _client(events).get("/streamed")
    assert response.status_code == 200 and response.text == "ab"
    assert events == ["sent a", "sent b", "first", "second"]
    assert "deferred work after /streamed failed" in caplog.text
    assert "the database went away" in caplog.text


def test_a_request_that_failed_runs_none_of_its_deferred_work() -> None:
    events: list[str] = []
    assert _client(events).get("/broken").status_code == 500
    assert events == []
