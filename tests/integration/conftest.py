"""Fixtures shared by the runner's integration tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture()
def run_main(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Call the runner's main() in this process, restoring the signal handlers it installs."""
    from twinkle_core import train

    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    yield train.main
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
