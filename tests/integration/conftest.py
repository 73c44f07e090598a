"""Fixtures shared by the runner's and the launchers' integration tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
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


@pytest.fixture(scope="session")
def gang_reference(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> Iterator[Any]:
    """The 2-node torchrun gang run of `two_node_spec` (tests/support/two_node_reference.py),
    started in the background at the first request: one run for every launcher compared with it
    (Ray, Slurm). `.result()` waits for it and gives its job directory."""
    from two_node_reference import start_gang_run

    run = start_gang_run(tmp_path_factory.mktemp("gang-reference"), tiny_model_dir, text_dataset)
    try:
        yield run
    finally:
        run.kill()
