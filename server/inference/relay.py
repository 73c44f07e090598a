"""Relay one OpenAI request to a serving host and its answer back, streamed as it comes.

`HostRelay` is the endpoint's response: it sends the request to the first host that accepts the
connection (a host whose heartbeat is fresh may still have just died), then passes the host's
status, body and `Retry-After` through unchanged, byte for byte for Server-Sent Events.

The client's connection is watched for the whole exchange, not only while bytes flow: when the
client goes away (a closed stream, a killed script, a timeout on its side), the upstream
request is closed at once, and the host, seeing its client gone, stops generating and frees the
slot. Without that a long generation would hold a slot until `max_tokens` for nobody.

Errors keep the service's envelope. A host's 4xx envelope about the request (400 over the
context or naming a field) reaches the client as is; a host that refuses the server itself
(401/403: a wrong serving secret or jobs root) or fails (5xx other than 503) is a 502, since
nothing the client changes would help.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
from collections.abc import Sequence
from typing import Any

import aiohttp
import anyio
from pydantic_core import to_json
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from server.errors import error_json

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5.0
# Generation time is bounded by the host (its load timeout, then max_tokens), not here: a read
# timeout would cut a slow but healthy answer short.
TIMEOUT = aiohttp.ClientTimeout(
    total=None, connect=CONNECT_TIMEOUT_SECONDS, sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=None
)
# An idle kept connection is closed by this side first: the host (uvicorn) closes its own after
# 5 s, and a request sent on a connection the host is closing that moment would fail.
KEEPALIVE_SECONDS = 4.0
NO_HOST_RETRY_AFTER_SECONDS = 10
PASSED_HEADERS = ("content-type", "retry-after")
SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class HostRelay(Response):
    def __init__(self, host_urls: Sequence[str], path: str, body: dict[str, Any], secret: str) -> None:
        super().__init__()
        self.host_urls = list(host_urls)
        self.path = path
        self.payload = body
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def relay() -> None:
                try:
                    await self._relay(scope, receive, send)
                except OSError:  # the client's socket is gone (ASGI 2.4 servers raise on send)
                    log.info("client went away during %s", self.path)
                group.cancel_scope.cancel()

            async def watch() -> None:
                await _until_disconnect(receive)
                group.cancel_scope.cancel()  # closes the upstream request: the host frees the slot

            group.start_soon(relay)
            group.start_soon(watch)

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        pool: HostConnections | None = getattr(scope["app"].state, "host_connections", None)
        session = pool.session() if pool is not None else new_host_session()
        payload = to_json(self.payload)
        headers = {"Authorization": f"Bearer {self.secret}", "Content-Type": "application/json"}
        try:
            for url in self.host_urls:
                try:
                    upstream = await session.post(url.rstrip("/") + self.path, data=payload, headers=headers)
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                    log.warning("serving host %s unreachable (%s); trying the next", url, exc)
                    continue
                except aiohttp.ClientError as exc:
                    # Connected, then the host went away before answering (it crashed or restarted).
                    log.warning("serving host %s broke off the request: %r", url, exc)
                    message = f"the serving host broke off the request ({type(exc).__name__}); retry"
                    await error_json(502, "api_error", "serving_host_error", message, None)(
                        scope, receive, send
                    )
                    return
                try:
                    await self._answer(url, upstream, scope, receive, send)
                finally:
                    # An answer read to its end leaves its connection for the next request; one
                    # cut short (the client left) closes it, which tells the host to stop.
                    if upstream.content.at_eof():
                        upstream.release()
                    else:
                        upstream.close()
                return
            response = error_json(
                503,
                "service_unavailable",
                "no_serving_host",
                "no serving host could be reached; retry shortly",
                None,
                {"Retry-After": str(NO_HOST_RETRY_AFTER_SECONDS)},
            )
            await response(scope, receive, send)
        finally:
            if pool is None:
                with anyio.CancelScope(shield=True):
                    await session.close()

    async def _answer(
        self, url: str, upstream: aiohttp.ClientResponse, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if upstream.status != 200:
            await self._error(url, upstream, scope, receive, send)
            return
        headers = [
            (k.encode(), upstream.headers[k].encode()) for k in PASSED_HEADERS if k in upstream.headers
        ]
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            headers += SSE_HEADERS
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except aiohttp.ClientError as exc:
            # The status is sent; all that is left is to end the body. An SSE client sees the
            # stream end without `[DONE]`, which OpenAI's client reports as an error.
            log.warning("serving host %s broke off its answer: %s", url, exc)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _error(
        self, url: str, upstream: aiohttp.ClientResponse, scope: Scope, receive: Receive, send: Send
    ) -> None:
        status = upstream.status
        try:
            raw = await upstream.read()
        except aiohttp.ClientError:
            raw = b""  # no envelope to pass on: answered as the host's failure below
        envelope = _envelope(raw)
        passes = envelope is not None and (
            status == 503 or (400 <= status < 500 and status not in (401, 403))
        )
        if envelope is not None and passes:
            headers = (
                {"Retry-After": upstream.headers["retry-after"]}
                if "retry-after" in upstream.headers
                else None
            )
            error = envelope["error"]
            param = error.get("param")
            if isinstance(param, str) and param.split(".")[0] == "twinkle":
                param = "model"  # the checkpoint the client named as `model` (its files are gone)
            response = error_json(
                status,
                str(error.get("type") or "invalid_request_error"),
                str(error.get("code") or "invalid_value"),
                str(error.get("message") or ""),
                param if isinstance(param, str) else None,
                headers,
            )
        else:
            log.error("serving host %s answered %s: %s", url, status, raw[:500])
            # The host's own message says what failed (a model that would not load, and why).
            error = envelope["error"] if envelope is not None else {}
            reason = (
                f"{error.get('code')}: {error.get('message')}" if error.get("code") else f"status {status}"
            )
            response = error_json(
                502, "api_error", "serving_host_error", f"the serving host failed ({reason})", None
            )
        await response(scope, receive, send)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def new_host_session() -> aiohttp.ClientSession:
    """A client for the hop to the hosts: aiohttp, whose C parser and lean request path cost the
    API server ~0.15 ms of CPU a request where httpx cost ~0.6 ms (a loopback streamed answer,
    measured alike), on every request's way to its first token.

    What once made a client slow to build, loading the CA bundle (100-200 ms), is done once.
    Proxies from the environment are not for the internal hop to a host. No bound on
    connections: each is one generation, which the hosts' slots bound."""
    connector = aiohttp.TCPConnector(limit=0, ssl=_tls_context(), keepalive_timeout=KEEPALIVE_SECONDS)
    return aiohttp.ClientSession(connector=connector, timeout=TIMEOUT, trust_env=False)


class HostConnections:
    """The relay's client, kept for the app's life (`app.state.host_connections`, closed by its
    lifespan): its connections to the hosts stay open between requests, which spares each
    request a TCP connect and a client's construction on its way to the first token: 0.6-1.0 ms
    of the ~8 ms the relay added to it, in a trace of the relay's stages (bench_serving_api.py).

    A client belongs to the event loop it first ran on; an app served from another loop later
    (a test's client starting one per test) gets a new one."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop:
            self._session, self._loop = new_host_session(), loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = self._loop = None


def _envelope(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body
    return None


async def _until_disconnect(receive: Receive) -> None:
    # The request body was read by the endpoint; what remains to receive is the disconnect.
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
