"""Per-token rate limits: a token bucket per token, refilled continuously.

Kept in process memory: each server process enforces the limit on the requests it serves. With
several replicas behind a balancer the effective limit is at most replicas x limit; a shared
store (Redis) would be the next step if that matters.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class TokenBuckets:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)

    def take(self, key: str, per_minute: int) -> int | None:
        """Spend one request; None if allowed, else the seconds until the next one is."""
        rate = per_minute / 60.0
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(per_minute), now))
            tokens = min(float(per_minute), tokens + (now - last) * rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return None
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / rate))
