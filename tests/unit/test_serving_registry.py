"""A serving host's row in `serving_hosts`, on a migrated PostgreSQL database (what the API
server reads to pick a host): one row per URL, heartbeats carry what is loaded, a row removed
under a host comes back, a clean stop removes it, rows silent for a day are forgotten."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from jobcore.db.migrate import upgrade
from jobcore.db.models import ServingHost, utcnow
from jobcore.db.session import session_scope
from serving.registry import FORGET_AFTER, HostRegistry

pytestmark = pytest.mark.postgres


def _rows(url: str) -> list[ServingHost]:
    with session_scope(url) as session:
        return list(session.scalars(select(ServingHost).order_by(ServingHost.url)))


def test_a_host_registers_heartbeats_and_unregisters(postgres_url: str) -> None:
    upgrade(postgres_url)
    old = HostRegistry(postgres_url, url="http://a:1", engine="transformers", memory_bytes=10, slots=2)
    old.register()
    with session_scope(postgres_url) as session:  # a host elsewhere, dead for more than a day
        session.add(ServingHost(url="http://dead:1", engine="vllm", memory_bytes=1, heartbeat_at=utcnow()))
        session.flush()
        silent = utcnow() - FORGET_AFTER - timedelta(minutes=1)
        session.execute(
            update(ServingHost).where(ServingHost.url == "http://dead:1").values(heartbeat_at=silent)
        )
    # A restart at the same URL replaces the row its previous run left, and forgets the dead host.
    host = HostRegistry(postgres_url, url="http://a:1", engine="transformers", memory_bytes=10, slots=2)
    host_id = host.register()
    (row,) = _rows(postgres_url)
    assert row.id == host_id != old.host_id and row.loaded == [] and row.loaded_bytes == 0

    loaded = [{"checkpoint": "/jobs/j/checkpoints/step-2", "model": "ft:x", "bytes": 7}]
    host.heartbeat(loaded, 7)
    (row,) = _rows(postgres_url)
    assert row.loaded == loaded and row.loaded_bytes == 7 and row.heartbeat_at > row.started_at

    with session_scope(postgres_url) as session:  # an operator's clean-up
        session.query(ServingHost).delete()
    host.heartbeat(loaded, 7)
    (row,) = _rows(postgres_url)
    assert row.url == "http://a:1" and row.loaded == loaded

    host.deregister()
    assert _rows(postgres_url) == []
