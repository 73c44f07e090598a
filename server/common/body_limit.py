"""ASGI middleware: refuse a request body over its size limit before anything reads it whole.

FastAPI reads a JSON body completely into memory before validation and before the dependencies
(authentication included) run, so without a cap anyone who can reach the port can make the
server hold any number of bytes. This middleware answers 413 in the error envelope:

- at once, when `Content-Length` announces more than the limit (the body is never read, and the
  app, authentication included, never runs);
- otherwise (chunked, or a missing or understated length) while the body streams: bytes are
  counted as the app pulls them, and the message that would cross the limit is not handed on.
  The app sees a disconnected client instead; whatever it answers is dropped and replaced by
  the 413. At most the limit plus one chunk of the server's reads is ever held.

Each request's limit comes from `limit_for(method, path)`: uploads have their own (larger) limit,
every other request the JSON limit.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_json

LimitFor = Callable[[str, str], int]


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit_for: LimitFor) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(scope, send, limit, param="Content-Length")
            return
        await _CountedRequest(self.app, limit).run(scope, receive, send)


class _CountedRequest:
    """One request whose body is counted while it streams (see the module docstring)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.received = 0
        self.exceeded = False
        self.response_started = False

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted_receive() -> Message:
            if self.exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.limit:
                    self.exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if self.exceeded and not self.response_started:
                return  # the app's answer to a body it never got whole; the 413 replaces it
            if message["type"] == "http.response.start":
                self.response_started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not (self.exceeded and not self.response_started):
                raise
        if self.exceeded and not self.response_started:
            await _too_large(scope, send, self.limit, param=None)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


async def _too_large(scope: Scope, send: Send, limit: int, param: str | None) -> None:
    # The rest of the body stays unread: the connection cannot carry another request after it.
    response = error_json(
        413,
        "invalid_request_error",
        "payload_too_large",
        f"the request body is larger than the limit of {limit} bytes",
        param,
        headers={"Connection": "close"},
    )

    async def no_body() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)
