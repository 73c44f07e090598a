"""The embedded (SQLite) broker survives several processes creating its queue at once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

PROCESSES = 6


def _publish(url: str, barrier: mp.synchronize.Barrier, safe: bool) -> None:
    from kombu import Connection

    from jobcore.broker import install_embedded_broker

    if safe:
        install_embedded_broker(0.2)
    with Connection(url) as conn:
        channel = conn.channel()
        barrier.wait(timeout=30)
        channel._put("twinkle", {"body": "wake"})  # the first use creates the queue row


def _race(url: str, safe: bool) -> list[int | None]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_publish, args=(url, barrier, safe)) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    return [proc.exitcode for proc in procs]


def test_concurrent_first_publish_does_not_crash(tmp_path: Path) -> None:
    url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    assert _race(url, safe=True) == [0] * PROCESSES

    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{tmp_path / 'broker.db'}")
    with engine.connect() as conn:
        queues = conn.execute(text("SELECT count(*) FROM kombu_queue")).scalar()
        messages = conn.execute(text("SELECT count(*) FROM kombu_message")).scalar()
    assert (queues, messages) == (1, PROCESSES)


def test_a_consumer_waits_at_most_one_slice_for_a_message(tmp_path: Path) -> None:
    """Celery's loop for polled transports asks to wait 2 s for a message and reads a SIGTERM's
    flag only between two waits: a worker's stop waited out the rest of them. A wait now ends
    after one slice, and a message still arrives."""
    import socket
    import time

    import pytest
    from kombu import Connection, Consumer, Queue

    from jobcore.broker import SQLA_DRAIN_SLICE_SECONDS, install_embedded_broker

    install_embedded_broker(0.05)
    received: list[str] = []
    with Connection(f"sqla+sqlite:///{tmp_path / 'broker.db'}") as conn:
        queue = Queue("twinkle", routing_key="twinkle")
        on_message = [lambda body, message: received.append(body)]
        with Consumer(conn, [queue], callbacks=on_message, accept=["json"]):
            began = time.monotonic()
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=2.0)
            waited = time.monotonic() - began
            assert SQLA_DRAIN_SLICE_SECONDS <= waited < 1.5, waited

            conn.Producer().publish("wake", routing_key="twinkle", declare=[queue], serializer="json")
            conn.drain_events(timeout=2.0)
    assert received == ["wake"]
