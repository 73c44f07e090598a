"""A private redis-server for tests that stop and start their broker (chaos, broker loss).

It runs on a free loopback port of its own, so killing it disturbs no other test's Redis.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from twinkle_cli.stack import free_port


@dataclass
class RedisServer:
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed to run a private Redis"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import redis

                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except Exception:
                time.sleep(0.1)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, downtime: float = 1.0) -> None:
        self.kill()
        time.sleep(downtime)
        self.start()
