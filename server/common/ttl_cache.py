"""A thread-safe, bounded, in-process cache whose entries live for a while, one per database.

What the API server keeps for moments to spare the database a statement on a hot path: the
principal of a token (`server.auth.cache`), what a model name resolves to and which serving
hosts are live (`server.inference.plans`). Each keeps its values per engine (a database URL in a
process), so two apps on different databases in one process (tests, the bench) never share one.

Refreshing ahead: an entry used in the second half of its life is handed to one caller to
reload (`claim_refresh`), which does so after its response has gone out
(`server.common.after_response`). Under steady use an entry is so replaced before it expires,
and no request waits for the database on the way in: without it one request every TTL paid the
statements (~2 ms each for a token and a model, measured in the API server on the way to a first
token). What is served is never older than the TTL either way.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import Engine

V = TypeVar("V")

# An entry may be claimed for a reload once this share of its life has passed; a claim holds for
# CLAIM_HOLDS of it, after which another caller may claim too (the first reload never came: its
# request is still streaming, or failed).
REFRESH_AFTER = 0.5
CLAIM_HOLDS = 0.25


@dataclass(slots=True)
class _Entry(Generic[V]):
    refresh_at: float  # from when one caller may claim a reload
    expires: float
    value: V


class TtlCache(Generic[V]):
    """Thread-safe LRU map with a time to live; `invalidate()` drops everything and bumps the
    generation; `claim_refresh()` hands an entry past half its life to one caller to reload."""

    def __init__(
        self,
        ttl: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 0 or max_entries < 1:
            raise ValueError("ttl must be >= 0 and max_entries >= 1")
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock  # public so that tests can move time
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._generation = 0

    @property
    def generation(self) -> int:
        """Read before loading a value from the database; pass it to `put`."""
        return self._generation

    def get(self, key: str) -> V | None:
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if now >= entry.expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry.value

    def claim_refresh(self, key: str) -> bool:
        """True for one caller once the live entry of `key` is past `REFRESH_AFTER` of its life:
        that caller reloads it off its request's path, then `put`s it (or `discard`s it, gone)."""
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now < entry.refresh_at or now >= entry.expires:
                return False
            entry.refresh_at = now + self.ttl * CLAIM_HOLDS
            return True

    def discard(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def put(self, key: str, value: V, generation: int) -> None:
        """Store unless an invalidation happened since `generation` was read (the value may be stale)."""
        if self.ttl == 0:
            return
        now = self.clock()
        with self._lock:
            if generation != self._generation:
                return
            self._entries[key] = _Entry(now + self.ttl * REFRESH_AFTER, now + self.ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class PerEngine(Generic[V]):
    """One `TtlCache` per database engine, made on first use with these bounds."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._caches: weakref.WeakKeyDictionary[Engine, TtlCache[V]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, engine: Engine) -> TtlCache[V]:
        cache = self._caches.get(engine)
        if cache is None:
            with self._lock:
                cache = self._caches.setdefault(engine, TtlCache(self.ttl, self.max_entries))
        return cache
