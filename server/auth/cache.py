"""A short-lived, bounded, in-process cache of authenticated principals, per database.

Authenticating every request against the database costs a query (or two) before the endpoint
does any work; on a read path that is most of the request. The cache keeps the principal of a
token hash for `TTL_SECONDS`, at most `MAX_ENTRIES` tokens (least recently used evicted first).

The bound on revocation: a token revoked (or its project deleted) by *another* process (the CLI,
another server replica) keeps working in this process for at most `TTL_SECONDS` after the commit.
A revocation through this process (`server.auth.service.revoke_token`) clears the cache of its
database at once and again after its commit; the generation counter makes sure that a request
that read the token before the commit cannot put the stale principal back afterwards.

Only successful authentications are cached: an unknown or revoked token goes to the database
every time, so a token created a moment ago is never refused from the cache.

One cache per engine (a database URL in a process), so two apps on different databases in one
process (tests, the bench) never see each other's tokens.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from sqlalchemy import Engine

from server.auth.principal import Principal

TTL_SECONDS = 5.0
MAX_ENTRIES = 10_000

V = TypeVar("V")


class TtlCache(Generic[V]):
    """Thread-safe LRU map with a time to live; `invalidate()` drops everything and bumps the generation."""

    def __init__(
        self,
        ttl: float = TTL_SECONDS,
        max_entries: int = MAX_ENTRIES,
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


_by_engine: weakref.WeakKeyDictionary[Engine, TtlCache[Principal]] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def cache_for(engine: Engine) -> TtlCache[Principal]:
    """The principal cache of one database (created on first use)."""
    cache = _by_engine.get(engine)
    if cache is None:
        with _registry_lock:
            cache = _by_engine.setdefault(engine, TtlCache())
    return cache
