"""A thread-safe, bounded, in-process cache whose entries live for a while, one per database.

What the API server keeps for moments to spare the database a statement on a hot path: the
principal of a token (`server.auth.cache`), what a model name resolves to and which serving
hosts are live (`server.inference.plans`). Each keeps its values per engine (a database URL in a
process), so two apps on different databases in one process (tests, the bench) never share one.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from sqlalchemy import Engine

V = TypeVar("V")


class TtlCache(Generic[V]):
    """Thread-safe LRU map with a time to live; `invalidate()` drops everything and bumps the generation."""

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
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()  # key -> (expires, value)
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
            expires, value = entry
            if now >= expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: str, value: V, generation: int) -> None:
        """Store unless an invalidation happened since `generation` was read (the value may be stale)."""
        if self.ttl == 0:
            return
        expires = self.clock() + self.ttl
        with self._lock:
            if generation != self._generation:
                return
            self._entries[key] = (expires, value)
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
