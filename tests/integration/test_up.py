"""`twinkle-jobs up` as a user runs it: one command starts a server, a worker and an inference
host on the embedded defaults, prints the URL and the token to use once all three are ready, and
on SIGTERM stops everything it started. A port in use is an error that says so, not a stack that
looks up and then stops.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
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


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "twinkle_cli.main", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


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
        # The banner comes once the worker and the inference host have registered, so both are
        # usable by the time a user reads it.
        assert _wait_for(lines, r"worker: +ready \((.*)\)", seen, timeout=10).group(1) == "CPU, 1 slot"
        assert _wait_for(lines, r"inference: ready \((\w+)", seen, timeout=10).group(1) == "transformers"
        export = _wait_for(lines, r"From a shell: export (.*)", seen, timeout=10).group(1)
        assert export == f"TWINKLE_URL={url} TWINKLE_TOKEN={token}"
        startup = "".join(seen)
        # At start a user reads the stack's banner, not Celery's or alembic's set-up lines.
        assert "[queues]" not in startup and "Context impl" not in startup, startup
        workers = httpx.get(f"{url}/v1/workers", headers=auth, timeout=10).json()["data"]
        assert [w["status"] for w in workers] == ["online"]

        # The demo against this running stack, then the model it trained, through the stack's
        # host: what a user does with the banner's export line.
        cli_env = {**env, "TWINKLE_URL": url, "TWINKLE_TOKEN": token}
        demo = _cli(cli_env, "demo", "--url", url, "--steps", "1", "--nproc", "1")
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:] + "".join(seen)
        job_id = re.search(r"job (job-\w+) succeeded", demo.stdout)
        assert job_id, demo.stdout
        # It does not send the user to start the stack that is already serving the model.
        assert f"next: `twinkle-jobs chat {job_id.group(1)}` (with TWINKLE_URL={url})" in demo.stdout
        chat = _cli(cli_env, "chat", job_id.group(1), "-p", "hi", "--max-tokens", "3")
        assert chat.returncode == 0, chat.stdout + chat.stderr

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


def test_up_on_a_port_in_use_says_so_and_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "TWINKLE_DATA_DIR": str(tmp_path / "data")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "twinkle_cli.main", "up", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"127.0.0.1:{port} is in use" in result.stderr and "--port" in result.stderr
    assert "is up" not in result.stdout
    assert not (tmp_path / "data" / "logs").exists()  # no child was started
