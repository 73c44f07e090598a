"""`twinkle-jobs serve` as a process: it registers in `serving_hosts` with the URL it really
listens on (port 0: a free one), heartbeats, answers /healthz with the secret from the data dir,
and unregisters when it is stopped with SIGTERM. It leases a GPU of its machine's pool (declared
GPUs on a CPU machine, as the worker tests do) and releases it at the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import select

from jobcore import gpu_leases
from jobcore.db.migrate import upgrade
from jobcore.db.models import ServingHost
from jobcore.db.session import session_scope
from jobcore.settings import Settings


def _hosts(url: str) -> list[ServingHost]:
    with session_scope(url) as session:
        return list(session.scalars(select(ServingHost)))


def _leases(url: str) -> dict[str, tuple[str, str]]:
    with session_scope(url) as session:
        return gpu_leases.held_by(session, "serving-box")


def _wait(condition: object, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_serve_registers_heartbeats_and_unregisters(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'twinkle.db'}"
    upgrade(database)
    env = {
        **os.environ,
        "TWINKLE_DATA_DIR": str(tmp_path),
        "TWINKLE_DATABASE_URL": database,
        "TWINKLE_SERVING_HEARTBEAT_SECONDS": "0.2",
        "TWINKLE_SERVING_MEMORY_BYTES": "123456789",
        "TWINKLE_WORKER_GPUS": "0,1",
        "TWINKLE_WORKER_HOST": "serving-box",
    }
    command = [sys.executable, "-m", "twinkle_cli.main", "serve", "--port", "0", "--slots", "3"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: len(_hosts(database)) == 1, 120, proc)
        (host,) = _hosts(database)
        assert host.engine == "transformers" and host.slots == 3 and host.memory_bytes == 123456789
        assert host.url.startswith("http://127.0.0.1:") and not host.url.endswith(":0")
        first_beat = host.heartbeat_at
        assert _leases(database) == {"0": ("serving", _leases(database)["0"][1])}
        _wait(lambda: _hosts(database)[0].heartbeat_at > first_beat, 30, proc)
        # The secret a local server would use too: generated into the shared data dir.
        secret = Settings(data_dir=tmp_path).serving_secret_value
        health = httpx.get(f"{host.url}/healthz", headers={"Authorization": f"Bearer {secret}"}).json()
        assert health["engine"] == "transformers" and health["models"] == []
        assert health["slots"] == {"total": 3, "busy": 0} and health["memory_bytes"] == 123456789
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (as `server` does).
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert _hosts(database) == [] and _leases(database) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
