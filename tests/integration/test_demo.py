"""README's first command in miniature: `twinkle-jobs demo` starts its own server and worker on the
embedded defaults, fine-tunes the tiny model through the HTTP API and prints the checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_a_job_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    env.update({"TWINKLE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    result = subprocess.run(
        [sys.executable, "-m", "server.cli.main", "demo", "--steps", "2", "--nproc", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"job job-\w+ succeeded", result.stdout)
    match = re.search(r"final checkpoint: (\S+)", result.stdout)
    assert match, result.stdout
    checkpoint = Path(match.group(1))
    assert checkpoint.is_relative_to(tmp_path / "data")
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "model.safetensors").exists()
    # The demo stops what it started: no server, worker or trainer of this data dir is left running.
    assert _processes_with_data_dir(str(tmp_path / "data")) == []


def _processes_with_data_dir(data_dir: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TWINKLE_DATA_DIR") == data_dir and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
