"""A local stack: the API server, a worker and an inference host as child processes, for `up`
and `demo`.

Children are started as `python -m twinkle_cli.main server|worker` so they read the same
TWINKLE_ environment; stopping the stack sends SIGTERM to each and waits, so a worker gets to end
its training processes before we return.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import ServingHost, WorkerNode
from jobcore.db.session import session_scope
from jobcore.gpu_leases import discover_gpus
from jobcore.settings import Settings
from server.auth.service import TOKEN_PREFIX


class StackError(RuntimeError):
    """The local stack could not start; the message says why and what to do."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_token(settings: Settings) -> str:
    """The admin token of a local stack: TWINKLE_BOOTSTRAP_TOKEN, else one kept in the data dir."""
    if settings.bootstrap_token:
        return settings.bootstrap_token
    path = settings.local_token_path
    if path.exists():
        return path.read_text().strip()
    token = TOKEN_PREFIX + secrets.token_urlsafe(24)  # spelt like every other token
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


@dataclass
class LocalStack:
    settings: Settings
    host: str = "127.0.0.1"
    port: int = 8000
    worker_concurrency: int | None = None
    quiet: bool = False
    serve: bool = True  # an inference host (`twinkle-jobs serve`), so /v1/chat/completions answers
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    commands: dict[int, str] = field(default_factory=dict)  # pid -> server | worker | serve
    started_at: datetime | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def token(self) -> str:
        return local_token(self.settings)

    def _spawn(self, *args: str, log_name: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "TWINKLE_DATA_DIR": str(self.settings.data_dir),
            "TWINKLE_BOOTSTRAP_TOKEN": self.token,
        }
        log_dir = self.settings.stack_logs_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        out = open(log_dir / log_name, "ab") if self.quiet else None  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "twinkle_cli.main", *args], env=env, stdout=out, stderr=out
        )
        self.procs.append(proc)
        self.commands[proc.pid] = args[0]
        return proc

    def start(self, timeout: float = 60.0) -> None:
        """Start the children; raises StackError when the server cannot start (and leaves
        nothing running: `stop` is the caller's, in a finally)."""
        self._check_port_free()
        self.started_at = datetime.now(UTC)
        self._spawn("server", "--host", self.host, "--port", str(self.port), log_name="server.log")
        self._wait_healthy(timeout)
        worker_args = ["worker", "--no-banner"]  # the stack's own banner says what runs where
        if self.worker_concurrency:
            worker_args += ["--concurrency", str(self.worker_concurrency)]
        self._spawn(*worker_args, log_name="worker.log")
        if self.serve:
            self._spawn(*self._serve_args(), log_name="serving.log")

    def _serve_args(self) -> list[str]:
        # The server finds the host in the database, so any free port will do unless the operator
        # chose one (TWINKLE_SERVING_PORT): two stacks on one machine must not collide on 8001.
        chosen = "serving_port" in self.settings.model_fields_set
        args = ["serve"] if chosen else ["serve", "--port", "0"]
        # The host leases its GPUs like a training job: on a machine with one GPU it would hold
        # it for as long as the stack runs and no job could train. Unless the operator chose
        # (TWINKLE_SERVING_GPUS), it then serves on the CPU and training keeps the GPU.
        one_gpu = len(discover_gpus(self.settings.worker_gpus)) < 2
        if one_gpu and "serving_gpus" not in self.settings.model_fields_set:
            args += ["--gpus", "0"]
        return args

    def _check_port_free(self) -> None:
        # Another process listening there would answer our health check for a server that
        # failed to bind (and exited), and the stack would look up until that exit stopped it.
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind((self.host, self.port))
            except OSError as exc:
                raise StackError(
                    f"{self.host}:{self.port} is in use ({exc.strerror}): another server, or another "
                    "`twinkle-jobs up`? Stop it, or choose another --port"
                ) from None

    def exited(self) -> str | None:
        """Which child has exited, if one has: `server`, `worker` or `serve`."""
        for proc in self.procs:
            if proc.poll() is not None:
                return self.commands[proc.pid]
        return None

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            child = self.exited()
            if child is not None:
                where = self.settings.stack_logs_dir if self.quiet else "its output above"
                raise StackError(f"the {child} exited during start-up; see {where}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StackError(f"the server did not answer /healthz within {timeout:.0f} s")

    def wait_ready(self, timeout: float = 120.0) -> dict[str, str | None]:
        """Wait until the worker and the inference host have registered, as the server sees them
        (their rows in the database), so that what is printed next can be used at once. Returns,
        per part, a description of it, or None for one that had not registered by the timeout
        (or exited: `wait` then returns its exit code)."""
        ready: dict[str, str | None] = {"worker": None, "inference": None} if self.serve else {"worker": None}
        deadline = time.monotonic() + timeout
        while None in ready.values() and time.monotonic() < deadline and self.exited() is None:
            with session_scope(self.settings.resolved_database_url) as session:
                found = self._registered(session)
            ready = {part: found[part] for part in ready}
            time.sleep(0.3)
        return ready

    def _registered(self, session: Session) -> dict[str, str | None]:
        assert self.started_at is not None, "start() first"

        def slots(n: int) -> str:
            return f"{n} slot{'s' * (n != 1)}"

        # A row of an earlier process with the same pid is older. A process's start time is known
        # to about a second (the kernel gives its boot time in whole seconds), hence the margin.
        since = self.started_at - timedelta(seconds=2)
        worker_pid = next(pid for pid, command in self.commands.items() if command == "worker")
        worker = session.scalars(
            select(WorkerNode).where(WorkerNode.pid == worker_pid, WorkerNode.started_at >= since)
        ).first()
        host = session.scalars(select(ServingHost).where(ServingHost.started_at >= self.started_at)).first()
        found: dict[str, str | None] = {"worker": None, "inference": None}
        if worker is not None:
            where = f"GPUs {', '.join(map(str, worker.gpus))}" if worker.gpus else "CPU"
            found["worker"] = f"{where}, {slots(worker.slots)}"
        if host is not None:
            found["inference"] = f"{host.engine}, {slots(host.slots)}"
        return found

    def wait(self) -> int:
        """Block until a child exits (or we are interrupted); return its exit code."""
        while True:
            for proc in self.procs:
                code = proc.poll()
                if code is not None:
                    return code
            time.sleep(0.5)

    def stop(self, grace: float = 30.0) -> None:
        # The worker first, so that it stops its training processes while the database is still served.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
