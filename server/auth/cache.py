"""A short-lived, bounded, in-process cache of authenticated principals, per database
(a `server.common.ttl_cache.TtlCache`).

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
"""

from __future__ import annotations

from sqlalchemy import Engine

from server.auth.principal import Principal
from server.common.ttl_cache import PerEngine, TtlCache

__all__ = ["MAX_ENTRIES", "TTL_SECONDS", "TtlCache", "cache_for"]

TTL_SECONDS = 5.0
MAX_ENTRIES = 10_000

_principals: PerEngine[Principal] = PerEngine(TTL_SECONDS, MAX_ENTRIES)


def cache_for(engine: Engine) -> TtlCache[Principal]:
    """The principal cache of one database (created on first use)."""
    return _principals(engine)
