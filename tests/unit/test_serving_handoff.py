"""The hand-off of a generation's deltas from its thread to the event loop: after each delta the
thread waits until the loop has taken it (so that the loop is not kept from the GIL while it has
a token to send), and never longer than HANDOFF_WAIT_SECONDS when nobody takes it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from serving import generation as gen
from serving.generation import _END, ThreadedGeneration
from serving.sampling import Delta


def test_emit_returns_once_the_loop_has_taken_the_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bound far above any scheduling delay: emit must return because the delta was taken.
    monkeypatch.setattr(gen, "HANDOFF_WAIT_SECONDS", 30.0)

    async def main() -> tuple[list[str], list[list[str]], float]:
        generation = ThreadedGeneration(asyncio.get_running_loop())
        received: list[str] = []
        seen_when_emit_returned: list[list[str]] = []

        def produce() -> None:
            for text in ("a", "b", "c"):
                generation.emit(Delta(0, text))
                seen_when_emit_returned.append(list(received))
            generation.emit(_END)

        began = time.monotonic()
        thread = threading.Thread(target=produce)
        thread.start()
        async for delta in generation:
            received.append(delta.text)
        await asyncio.to_thread(thread.join)
        return received, seen_when_emit_returned, time.monotonic() - began

    received, seen, took = asyncio.run(main())
    assert received == ["a", "b", "c"]
    # Each emit came back only after the loop had the delta (and everything before it).
    assert seen == [["a"], ["a", "b"], ["a", "b", "c"]]
    assert took < 10, "emit waited out its bound although the loop took every delta"


def test_emit_waits_at_most_its_bound_when_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen, "HANDOFF_WAIT_SECONDS", 0.05)

    async def main() -> list[float]:
        generation = ThreadedGeneration(asyncio.get_running_loop())

        def produce() -> list[float]:
            waits = []
            for text in ("a", "b"):
                began = time.monotonic()
                generation.emit(Delta(0, text))
                waits.append(time.monotonic() - began)
            return waits

        # The loop is free (awaiting the thread) but nobody iterates the generation.
        return await asyncio.to_thread(produce)

    waits = asyncio.run(main())
    assert all(0.05 <= w < 5 for w in waits), waits
