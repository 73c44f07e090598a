"""The machine-wide GPU lease table (`jobcore.gpu_leases`) on a migrated PostgreSQL database: one
holder per GPU (a racing insert fails), owners see only others' live leases, a lease that is not
refreshed goes stale and is replaced or dropped, and a serving host's lease follows its life."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.exc import IntegrityError

from jobcore import gpu_leases
from jobcore.db.migrate import upgrade
from jobcore.db.session import session_scope
from serving.gpus import ServingGpus

pytestmark = pytest.mark.postgres

STALE = 0.5


def _held(url: str) -> dict[str, tuple[str, str]]:
    with session_scope(url) as session:
        return gpu_leases.held_by(session, "box")


def test_one_holder_per_gpu_and_stale_leases_free_the_gpu(postgres_url: str) -> None:
    upgrade(postgres_url)
    with session_scope(postgres_url) as session:
        gpu_leases.take(session, "box", "wkr-1", "job-a", gpu_leases.JOB, ["0", "1"], STALE)
        gpu_leases.take(session, "other", "wkr-2", "job-b", gpu_leases.JOB, ["0"], STALE)  # another machine
    with pytest.raises(IntegrityError), session_scope(postgres_url) as session:
        gpu_leases.take(session, "box", "serve-1", "serve-1", gpu_leases.SERVING, ["1", "2"], STALE)
    assert _held(postgres_url) == {"0": ("job", "job-a"), "1": ("job", "job-a")}  # rolled back whole
    with session_scope(postgres_url) as session:
        assert gpu_leases.held_elsewhere(session, "box", "serve-1", STALE) == {"0", "1"}
        assert gpu_leases.held_elsewhere(session, "box", "wkr-1", STALE) == set()
        gpu_leases.release(session, "wkr-1", "job-a")
        gpu_leases.take(session, "box", "serve-1", "serve-1", gpu_leases.SERVING, ["0"], STALE)
    time.sleep(STALE + 0.1)  # serve-1 stops refreshing: its lease holds nothing any more
    with session_scope(postgres_url) as session:
        assert gpu_leases.held_elsewhere(session, "box", "wkr-1", STALE) == set()
        gpu_leases.take(session, "box", "wkr-1", "job-c", gpu_leases.JOB, ["0"], STALE)  # replaces it
        assert gpu_leases.refresh(session, "wkr-1", ["job-c"]) == 1
        assert gpu_leases.refresh(session, "wkr-1", []) == 0
    assert _held(postgres_url) == {"0": ("job", "job-c")}
    time.sleep(STALE + 0.1)
    with session_scope(postgres_url) as session:
        assert gpu_leases.drop_stale(session, STALE) == 2  # job-c's and the other machine's
    assert _held(postgres_url) == {}


def test_a_serving_host_waits_for_free_gpus_and_releases_them(postgres_url: str) -> None:
    upgrade(postgres_url)

    def host(want: int) -> ServingGpus:
        return ServingGpus(
            postgres_url, host="box", pool=["0", "1"], want=want, stale_after_seconds=30, poll_seconds=0.05
        )

    with session_scope(postgres_url) as session:
        gpu_leases.take(session, "box", "wkr-1", "job-a", gpu_leases.JOB, ["0"], 30)
    serving = host(1)
    assert serving.acquire() == ["1"]  # the free one
    assert _held(postgres_url)["1"] == ("serving", serving.owner)
    assert not host(1).try_acquire()  # nothing left
    cpu_machine = ServingGpus(
        postgres_url, host="box", pool=[], want=1, stale_after_seconds=30, poll_seconds=0.05
    )
    assert host(0).acquire() == [] and cpu_machine.acquire() == []  # none wanted, or no GPUs
    serving.refresh()
    serving.release()
    assert _held(postgres_url) == {"0": ("job", "job-a")}
    both = host(2)
    assert not both.try_acquire()
    with session_scope(postgres_url) as session:
        gpu_leases.release(session, "wkr-1")
    assert both.acquire() == ["0", "1"]
