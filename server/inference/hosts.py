"""Which serving host answers a request: the live ones from `serving_hosts`, best first.

A host is live while its heartbeat is fresh. A host that already holds the checkpoint comes
first (no load, the answer starts at once); then the others, least loaded bytes first, so that
a new model goes where memory is free instead of evicting another warm one. Ties are broken at
random so equal hosts share the work. The relay tries them in this order when one cannot be
reached.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import ServingHost, utcnow
from jobcore.settings import Settings


@dataclass(frozen=True)
class LiveHost:
    url: str
    loaded: frozenset[str]  # the checkpoint directories it holds in memory
    loaded_bytes: int


def order_for(hosts: Sequence[LiveHost], checkpoint: str, rng: random.Random | None = None) -> list[str]:
    """The hosts' URLs in the order to try them for `checkpoint`."""
    shuffled = list(hosts)
    (rng or random).shuffle(shuffled)
    shuffled.sort(key=lambda host: (checkpoint not in host.loaded, host.loaded_bytes))
    return [host.url for host in shuffled]


def _checkpoints(loaded: list[Any]) -> frozenset[str]:
    # The host writes [{"checkpoint": "<dir>", "model": ..., "bytes": N}, ...]; anything else in
    # the column (an older or newer host) counts as nothing loaded rather than failing the request.
    return frozenset(
        str(item["checkpoint"]) for item in loaded if isinstance(item, dict) and "checkpoint" in item
    )


def live_hosts(session: Session, settings: Settings) -> list[LiveHost]:
    """The hosts whose heartbeat is younger than `stale_after_seconds`."""
    fresh_since = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    rows = session.execute(
        select(ServingHost.url, ServingHost.loaded, ServingHost.loaded_bytes).where(
            ServingHost.heartbeat_at > fresh_since
        )
    )
    return [
        LiveHost(url, _checkpoints(loaded or []), loaded_bytes or 0) for url, loaded, loaded_bytes in rows
    ]
