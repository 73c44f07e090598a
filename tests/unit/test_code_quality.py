"""ruff (lint + format) and mypy stay clean: the project's own style gate, run with the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("args", [("ruff", "check", "."), ("ruff", "format", "--check", ".")])
def test_ruff(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
