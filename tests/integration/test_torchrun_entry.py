"""`twinkle-torchrun` (worker/torchrun_entry.py): a stop by signal ends in one line, dying of that
signal; a rank's failure still ends in torchrun's own summary, which worker.outcome parses."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from worker.launch import free_port, resolve_torchrun
from worker.outcome import rank_exit_codes

pytestmark = pytest.mark.slow


def start(tmp_path: Path, script: str) -> subprocess.Popen[str]:
    (tmp_path / "rank.py").write_text(script)
    argv = [
        resolve_torchrun("twinkle-torchrun"),
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(tmp_path / "rank.py"),
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)


def test_a_sigterm_ends_in_one_line_and_the_same_signal(tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc = start(tmp_path, f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n")
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, output
    assert "torchrun stopped by SIGTERM: its ranks were sent SIGTERM too" in output
    assert "Traceback" not in output and "SignalException" not in output


def test_a_failing_rank_still_gets_torchruns_summary(tmp_path: Path) -> None:
    proc = start(tmp_path, "raise SystemExit(2)\n")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert rank_exit_codes(output) and set(rank_exit_codes(output)) == {2}, output
    assert "torchrun stopped by" not in output
