"""Per-token rate limits: `rate_limit_per_minute` requests a minute, with bursts up to the limit.

One algorithm, two stores. GCRA (the generic cell rate algorithm, a token bucket kept as one
number): each token has a theoretical arrival time `tat`; a request at `now` moves it to
`max(tat, now) + 60/limit` and is allowed when that is at most `now + 60` s. A fresh or idle
token may send `limit` requests at once, then one every `60/limit` seconds.

- `TokenBuckets`: in this process's memory, the fallback with the embedded default (no Redis):
  each server process counts alone, so N replicas allow up to N x limit.
- `RedisRateLimiter`: in Redis (`TWINKLE_RATE_LIMIT_URL`, or `TWINKLE_BROKER_URL` when that is
  Redis), one Lua script per request: read, decide and write are one atomic step on Redis's own
  clock, so every server process shares one count per token and together they allow exactly the
  limit. If Redis cannot be reached the request is counted in process instead (logged), never
  refused for it.

Every decision is a `Verdict`, which `server.common.ratelimit_headers` turns into the
`X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` headers (and 429 answers
carry `Retry-After`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from jobcore.settings import redacted_url

log = logging.getLogger(__name__)

PERIOD_SECONDS = 60.0
KEY_PREFIX = "twinkle:ratelimit:"


@dataclass(frozen=True)
class Verdict:
    """One request's decision and what the client may know about its budget."""

    allowed: bool
    limit: int
    remaining: int  # requests that may follow at once
    reset_seconds: int  # until the whole limit is available again
    retry_after: int | None  # refused: seconds until the next request is allowed


def decide(limit: int, full_in: float, wait: float) -> Verdict:
    """A verdict from GCRA's two numbers: seconds until the bucket is full again (after this
    request if it was allowed) and, for a refusal, seconds until the next request is allowed."""
    interval = PERIOD_SECONDS / limit
    reset = max(0, math.ceil(full_in - 1e-9))
    if wait > 0:
        return Verdict(False, limit, 0, reset, max(1, math.ceil(wait - 1e-9)))
    remaining = max(0, math.floor((PERIOD_SECONDS - full_in) / interval + 1e-9))
    return Verdict(True, limit, remaining, reset, None)


class RateLimiter(Protocol):
    async def check(self, key: str, per_minute: int) -> Verdict: ...

    async def close(self) -> None: ...


class TokenBuckets:
    """GCRA in this process's memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tats: dict[str, float] = {}  # key -> theoretical arrival time

    def verdict(self, key: str, per_minute: int) -> Verdict:
        interval = PERIOD_SECONDS / per_minute
        now = self._clock()
        with self._lock:
            tat = max(self._tats.get(key, now), now)
            new_tat = tat + interval
            allow_at = new_tat - PERIOD_SECONDS
            if now < allow_at:
                return decide(per_minute, tat - now, allow_at - now)
            self._tats[key] = new_tat
            return decide(per_minute, new_tat - now, 0.0)

    def take(self, key: str, per_minute: int) -> int | None:
        """Spend one request; None if allowed, else the seconds until the next one is."""
        return self.verdict(key, per_minute).retry_after

    async def check(self, key: str, per_minute: int) -> Verdict:
        return self.verdict(key, per_minute)

    async def close(self) -> None:
        return None


# KEYS[1]: the token's key. ARGV[1]: the limit per minute. Times in microseconds, Redis's clock.
# Returns {allowed (0/1), microseconds until full, microseconds until the next is allowed}.
GCRA_SCRIPT = """
local limit = tonumber(ARGV[1])
local period = 60000000
local interval = period / limit
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - period
if now < allow_at then
  return {0, math.floor(tat - now), math.ceil(allow_at - now)}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
return {1, math.floor(new_tat - now), 0}
"""


class RedisRateLimiter:
    """GCRA in Redis, shared by every server process that points at the same Redis."""

    def __init__(self, url: str, namespace: str | None = None) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self._client: Any = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._script: Any = self._client.register_script(GCRA_SCRIPT)
        self._prefix = KEY_PREFIX + (namespace + ":" if namespace else "")
        self._fallback = TokenBuckets()
        self._warned = False

    async def check(self, key: str, per_minute: int) -> Verdict:
        from redis.exceptions import RedisError

        try:
            allowed, full_in, wait = await self._script(keys=[self._prefix + key], args=[per_minute])
        except (RedisError, OSError) as exc:
            if not self._warned:
                where = redacted_url(self.url)
                log.warning("rate limits: Redis at %s failed (%s); counting in this process", where, exc)
                self._warned = True
            return self._fallback.verdict(key, per_minute)
        self._warned = False
        return decide(per_minute, int(full_in) / 1e6, 0.0 if allowed else int(wait) / 1e6)

    async def close(self) -> None:
        await self._client.aclose()


def make_rate_limiter(url: str | None) -> RateLimiter:
    """Redis when a Redis URL is given (`Settings.resolved_rate_limit_url`), else per-process buckets."""
    return RedisRateLimiter(url) if url else TokenBuckets()
