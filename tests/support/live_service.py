"""A real server and worker as subprocesses, the way a user runs them (`twinkle-jobs server|worker`).

Used by the end-to-end tests: nothing is mocked, the processes talk over loopback HTTP, the
configured database and the configured broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from twinkle_cli.stack import free_port

TOKEN = "tw-test-admin-token"


@dataclass
class LiveService:
    env: dict[str, str]
    data_dir: Path
    url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    server: subprocess.Popen[bytes] = field(init=False)

    @classmethod
    def configure(cls, tmp_path: Path, allowed_roots: list[Path], **extra_env: str) -> LiveService:
        data_dir = tmp_path / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "TWINKLE_DATA_DIR": str(data_dir),
            "TWINKLE_BOOTSTRAP_TOKEN": TOKEN,
            "TWINKLE_ALLOWED_ROOTS": ":".join(str(p) for p in [tmp_path, *allowed_roots]),
            "HF_HUB_OFFLINE": "1",
        }
        for name in ("TWINKLE_DATABASE_URL", "TWINKLE_BROKER_URL"):
            env.pop(name, None)
        env.update(extra_env)
        return cls(env=env, data_dir=data_dir)

    def _spawn(self, args: list[str], log_name: str, **env: str) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / log_name, "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [sys.executable, "-m", "twinkle_cli.main", *args],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def start_server(self, timeout: float = 180.0, port: int | None = None) -> subprocess.Popen[bytes]:
        """Start the API server (on `port`, e.g. the previous one after a restart) and wait for /healthz."""
        port = port or free_port()
        proc = self._spawn(["server", "--port", str(port)], "server.log")
        self.server = proc
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.poll() is None, (self.data_dir / "server.log").read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("server did not become healthy")

    def restart_server(self) -> tuple[float, float]:
        """SIGTERM the server and start a new one on the same port.

        Returns how long the old one took to exit and the new one to become healthy (seconds)."""
        port = int(self.url.rsplit(":", 1)[1])
        began = time.monotonic()
        self.server.terminate()
        self.server.wait(timeout=30)
        stopped = time.monotonic()
        self.procs.remove(self.server)
        self.start_server(port=port)
        return stopped - began, time.monotonic() - stopped

    def start_worker(
        self, concurrency: int = 1, log_name: str = "worker.log", **env: str
    ) -> subprocess.Popen[bytes]:
        return self._spawn(["worker", "--concurrency", str(concurrency)], log_name, **env)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)

    def worker_log(self, tail: int = 3000) -> str:
        path = self.data_dir / "worker.log"
        return path.read_text()[-tail:] if path.exists() else ""

    def wait_terminal(self, job_id: str, timeout: float) -> dict[str, Any]:
        """Poll until the job ends; the statuses seen on the way are returned under `_seen`."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        with self.client() as client:
            while time.monotonic() < deadline:
                job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
                if not seen or seen[-1] != job["status"]:
                    seen.append(job["status"])
                if job["terminal"]:  # the API says when a run has ended
                    job["_seen"] = seen
                    return job
                time.sleep(0.3)
        raise TimeoutError(f"job {job_id} still {seen[-1]} after {timeout} s (seen {seen})")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def tiny_spec(
    model_dir: Path, dataset: Path, steps: int = 4, nproc: int = 2, **training: Any
) -> dict[str, Any]:
    return {
        "model": {"model_id": str(model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(dataset), "max_length": 32},
        "training": {"max_steps": steps, "batch_size": 4, "log_every": 1, **training},
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": nproc},
    }
