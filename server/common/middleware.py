"""ASGI middleware: a request id on every response, API latency for /metrics, one retry when
the database connection turns out to be dead, and the work a request deferred until after its
response (`server.common.after_response`).

Written as plain ASGI (not BaseHTTPMiddleware) so streamed responses (SSE, downloads) pass
through untouched.

Lost database connections: the API's engine does not ping before each checkout (see
`jobcore.db.session`), so the first statement on a connection the database has dropped fails.
SQLAlchemy then invalidates that connection and every other one opened before it. A GET, HEAD
or OPTIONS request that failed this way before its response started is run once more (on a
fresh connection); any other request, or a second failure, is answered 503 with Retry-After,
never 500: a POST may have been committed before the connection died, so only the client (with
an Idempotency-Key) can retry it safely.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from sqlalchemy.exc import DBAPIError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.cluster.prometheus import ApiLatency
from server.common.after_response import run_deferred
from server.errors import error_json

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = b"x-request-id"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RETRIED_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UNAVAILABLE_RETRY_AFTER_SECONDS = 1


def lost_connection(exc: BaseException) -> bool:
    """A statement failed because the database connection died (SQLAlchemy's disconnect check)."""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, latency: ApiLatency) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_request_id(scope) or f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status_holder: dict[str, int] = {"status": 500}
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                status_holder["status"] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        attempt_scope = scope
        try:
            replayable = _Replayable(receive)
            attempts = 2 if scope["method"] in RETRIED_METHODS else 1
            for attempt in range(1, attempts + 1):
                # Each attempt gets its own copy: the router and dependencies write into the scope.
                attempt_scope = {**scope, "state": dict(scope["state"])}
                try:
                    await self.app(attempt_scope, replayable.replay(), send_with_id)
                    break
                except DBAPIError as exc:
                    if response_started or not lost_connection(exc):
                        raise
                    where = f"{scope['method']} {scope.get('path', '')}"
                    if attempt < attempts:
                        log.warning("database connection lost during %s; retrying once", where)
                        continue
                    log.warning("database connection lost during %s; answering 503", where)
                    await self._unavailable(attempt_scope, replayable.replay(), send_with_id)
        finally:
            route = attempt_scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.latency.observe(
                scope["method"], template, status_holder["status"], time.perf_counter() - started
            )
        await run_deferred(attempt_scope)  # after the whole response: nobody waits for it

    @staticmethod
    async def _unavailable(scope: Scope, receive: Receive, send: Send) -> None:
        response = error_json(
            503,
            "service_unavailable",
            "database_unavailable",
            "the database connection was lost; retry the request",
            None,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
        )
        await response(scope, receive, send)


class _Replayable:
    """A `receive` whose messages (a request body) can be handed again to a retried attempt."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._seen: list[Message] = []

    def replay(self) -> Receive:
        pending = list(self._seen)

        async def receive() -> Message:
            if pending:
                return pending.pop(0)
            message = await self._receive()
            if message["type"] == "http.request":
                self._seen.append(message)
            return message

        return receive


def _incoming_request_id(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            return text if _VALID_REQUEST_ID.match(text) else None
    return None
