"""Which torchrun a worker launches (worker.launch.resolve_torchrun)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from worker.launch import resolve_torchrun


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_default_is_twinkle_torchrun_or_torchrun_in_an_install_made_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    torchrun = executable(bindir / "torchrun")
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    with caplog.at_level(logging.WARNING, logger="worker.launch"):
        assert resolve_torchrun("twinkle-torchrun") == str(torchrun)
    assert "twinkle-torchrun is not installed (reinstall the package" in caplog.text
    ours = executable(bindir / "twinkle-torchrun")
    assert resolve_torchrun("twinkle-torchrun") == str(ours)
    # An operator's own choice is used as it is, or refused: never replaced by another.
    with pytest.raises(FileNotFoundError, match="'my-torchrun' not found"):
        resolve_torchrun("my-torchrun")
