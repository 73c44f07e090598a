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
