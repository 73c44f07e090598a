"""`X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` on every answer to a
rate-limited token, the 429 included (which also has `Retry-After`).

Plain ASGI around the routes: authentication (`server.deps`) leaves its `Verdict` in the
request's state, and the headers are added when the response starts, whatever produced it (a
model, a streamed download, an error handler).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth.ratelimit import Verdict


def headers_of(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-ratelimit-limit", str(verdict.limit).encode()),
        (b"x-ratelimit-remaining", str(verdict.remaining).encode()),
        (b"x-ratelimit-reset", str(verdict.reset_seconds).encode()),
    ]


class RateLimitHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_limits(message: Message) -> None:
            verdict = state.get("rate_limit")
            if message["type"] == "http.response.start" and isinstance(verdict, Verdict):
                message = {**message, "headers": [*message.get("headers", []), *headers_of(verdict)]}
            await send(message)

        await self.app(scope, receive, send_with_limits)
