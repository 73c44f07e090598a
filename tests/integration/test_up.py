"""`twinkle-jobs up` as a user runs it: one command starts a server and a worker on the embedded
defaults, prints the URL and the token to use, and on SIGTERM stops everything it started.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from twinkle_cli.stack import free_port

pytestmark = pytest.mark.slow


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line)


def _wait_for(lines: queue.Queue[str], pattern: str, seen: list[str], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise TimeoutError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


def test_up_prints_a_working_url_and_token_and_stops_everything(tmp_path: Path) -> None:
    env = {**os.environ, "TWINKLE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"}
    for name in ("TWINKLE_DATABASE_URL", "TWINKLE_BROKER_URL", "TWINKLE_BOOTSTRAP_TOKEN"):
        env.pop(name, None)
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "twinkle_cli.main", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(up.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        url = _wait_for(lines, r"Twinkle Jobs is up at (http://\S+)", seen, timeout=180).group(1)
        token = _wait_for(lines, r"API token: (\S+)", seen, timeout=10).group(1)
        assert url == f"http://127.0.0.1:{port}"

        assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 401
        listed = httpx.get(f"{url}/v1/jobs", headers=auth, timeout=10)
        assert listed.status_code == 200 and listed.json()["data"] == []
        # The worker half is up too: it registers itself within a short while.
        deadline = time.monotonic() + 120
        while not httpx.get(f"{url}/v1/workers", headers=auth, timeout=10).json()["data"]:
            assert time.monotonic() < deadline, "".join(seen)
            assert up.poll() is None, "".join(seen)
            time.sleep(0.5)

        started = psutil.Process(up.pid).children(recursive=True)
        assert len(started) >= 2  # the server and the worker, and whatever they started
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    _gone, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    assert up.returncode == 0, "".join(seen)  # a requested stop is not a failure
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)
