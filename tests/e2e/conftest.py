"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, and a real service.

The service runs as subprocesses exactly as in production (`python -m twinkle_cli.main server`
and `... worker`), on the embedded SQLite database and broker in a temporary data dir. The
browser is Debian's `chromium` package; Playwright's own browser download is never used (it
cannot be fetched here). Without either, the browser tests skip and say why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from twinkle_cli.stack import free_port

CHROMIUM = Path(os.environ.get("TWINKLE_CHROMIUM", "/usr/bin/chromium"))
# No sandbox: CI runs as root. No /dev/shm: containers give it 64 MB, too little for Chromium.
# The rest keeps Chromium off the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TOKEN = "tw-e2e-admin-token"
REPO_ROOT = Path(__file__).resolve().parents[2]


# Module scope, not session: Playwright's sync API keeps an asyncio loop marked as running in
# this thread while it is open, and every later test that calls asyncio.run() would fail with
# "cannot be called from a running event loop". ("package" would be the same as session here:
# tests/e2e is a plain directory, not a package.) A launch costs about a second per module.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (own localStorage) whose uncaught JavaScript errors fail the test."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"uncaught JavaScript errors: {errors}"


@dataclass
class Stack:
    url: str
    token: str
    env: dict[str, str]
    data_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.data_dir / log_name, "ab") as log:  # the child keeps its own copy of the handle
            proc = subprocess.Popen(
                [sys.executable, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
            )
        self.procs.append(proc)
        return proc

    def start_worker(self) -> subprocess.Popen[bytes]:
        return self.spawn(["-m", "twinkle_cli.main", "worker", "--concurrency", "1"], "worker.log")

    def logs(self) -> str:
        parts = []
        for name in ("server.log", "worker.log"):
            path = self.data_dir / name
            if path.exists():
                parts.append(f"--- {name} ---\n{path.read_text()[-4000:]}")
        return "\n".join(parts)

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


def _wait_healthy(stack: Stack, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, stack.logs()
        try:
            if httpx.get(f"{stack.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server did not become healthy\n{stack.logs()}")


@pytest.fixture()
def stack(tmp_path: Path, tiny_model_dir: Path) -> Iterator[Stack]:
    """A running API server (with the dashboard) on a fresh data dir; `start_worker()` adds a worker."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = {
        **os.environ,
        "TWINKLE_DATA_DIR": str(data_dir),
        "TWINKLE_BOOTSTRAP_TOKEN": TOKEN,
        "TWINKLE_ALLOWED_ROOTS": f"{tmp_path}:{tiny_model_dir}",
        "HF_HUB_OFFLINE": "1",
    }
    for name in ("TWINKLE_DATABASE_URL", "TWINKLE_BROKER_URL"):
        env.pop(name, None)
    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}", token=TOKEN, env=env, data_dir=data_dir)
    args = ["-m", "twinkle_cli.main", "server", "--port", str(port)]
    server = stack.spawn(args, "server.log")
    try:
        _wait_healthy(stack, server)
        yield stack
    finally:
        stack.stop()
