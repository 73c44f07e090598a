"""Work a request leaves for after its response has gone out.

A request that finds a cached value due for a reload (`server.common.ttl_cache`: a token's
principal, a model's resolution, the live hosts) must not wait for the database itself, nor
make the event loop share its way to the first byte with the reload. It `defer`s the reload
instead; `RequestContextMiddleware` runs what was deferred once the app has sent the whole
response, in the request's own task (a client on a kept connection is not held: the server
reads its next request meanwhile).

What is deferred is an optimisation: it runs only when the request ended normally, and a
failure is logged and dropped (the entry then expires as it would have).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.types import Scope

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[object]]

_STATE_KEY = "after_response"


def defer(request: Request, work: Work) -> None:
    """Run `work` after this request's response (see the module docstring)."""
    request.scope.setdefault("state", {}).setdefault(_STATE_KEY, []).append(work)


async def run_deferred(scope: Scope) -> None:
    """Run, in order, what the request deferred; called by the middleware after the app."""
    deferred: list[Work] = scope.get("state", {}).pop(_STATE_KEY, [])
    for work in deferred:
        try:
            await work()
        except Exception:  # a reload that failed leaves the entry to expire: nothing is lost
            log.warning("deferred work after %s failed", scope.get("path", "?"), exc_info=True)
