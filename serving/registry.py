"""This host's row in `serving_hosts`: how the API server finds it and knows what it holds.

Registered at start (replacing the row a previous run at the same URL left), heartbeated with
the models in memory, removed at a clean stop. A host that dies without stopping leaves its row
behind; its heartbeat goes stale and the server stops choosing it, and the next host to register
anywhere removes rows that have been silent for a day. The host's GPU lease (`serving.gpus`)
lives and ends with the row: refreshed by the heartbeat, released at the stop.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, update

from jobcore.db.models import ServingHost, utcnow
from jobcore.db.session import session_scope
from serving.gpus import ServingGpus

log = logging.getLogger(__name__)

FORGET_AFTER = timedelta(days=1)


class HostRegistry:
    def __init__(
        self,
        database_url: str,
        *,
        url: str,
        engine: str,
        memory_bytes: int,
        slots: int,
        gpus: ServingGpus | None = None,
    ) -> None:
        self.database_url = database_url
        self.gpus = gpus  # the GPU lease, refreshed with the heartbeat and released at a stop
        self.url = url
        self.engine = engine
        self.memory_bytes = memory_bytes
        self.slots = slots
        self.host_id: str | None = None

    def register(self) -> str:
        with session_scope(self.database_url) as session:
            gone = utcnow() - FORGET_AFTER
            session.execute(delete(ServingHost).where(ServingHost.url == self.url))
            session.execute(delete(ServingHost).where(ServingHost.heartbeat_at < gone))
            host = ServingHost(
                url=self.url, engine=self.engine, memory_bytes=self.memory_bytes, slots=self.slots
            )
            session.add(host)
            session.flush()
            self.host_id = host.id
        log.info("serving host %s registered at %s", self.host_id, self.url)
        return self.host_id

    def heartbeat(self, loaded: list[dict[str, Any]], loaded_bytes: int) -> None:
        assert self.host_id is not None, "register() first"
        with session_scope(self.database_url) as session:
            changed = session.execute(
                update(ServingHost)
                .where(ServingHost.id == self.host_id)
                .values(heartbeat_at=utcnow(), loaded=loaded, loaded_bytes=loaded_bytes)
            ).rowcount  # type: ignore[attr-defined]
        if self.gpus is not None:
            self.gpus.refresh()
        if not changed:
            # Removed under us (an operator's clean-up, a newer run at this URL): register again.
            log.warning("serving host %s was unregistered; registering again", self.host_id)
            self.register()
            self.heartbeat(loaded, loaded_bytes)

    def deregister(self) -> None:
        if self.gpus is not None:
            self.gpus.release()
        if self.host_id is None:
            return
        with session_scope(self.database_url) as session:
            session.execute(delete(ServingHost).where(ServingHost.id == self.host_id))
        log.info("serving host %s unregistered", self.host_id)
        self.host_id = None
