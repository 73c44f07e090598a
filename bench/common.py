"""Shared helpers of the service benchmarks: statistics, the machine's description, scratch
PostgreSQL databases, a Redis db of our own, and the service (server + worker) as subprocesses.

The scripts import this as `common` (they put `bench/` on `sys.path`), so each one stays
runnable as `python bench/bench_<name>.py` from the repository root.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `python bench/x.py` puts bench/ on the path, not the repo
    sys.path.insert(0, str(REPO_ROOT))

POSTGRES_ADMIN_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_BASE_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
# A Redis db number of our own so that FLUSHDB never touches another user's keys.
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "11"))


# ------------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User plus system CPU time of a process so far; with `children`, of its live descendants too
    (one that exits meanwhile takes its time with it)."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for one in [process, *(process.children(recursive=True) if children else [])]:
        try:
            times = one.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def verdict(value: float, target: float, lower_is_better: bool = True) -> str:
    """'met' or 'MISSED by X%' for a figure against its target."""
    ok = value <= target if lower_is_better else value >= target
    if ok:
        return "met"
    gap = (value - target) / target if lower_is_better else (target - value) / target
    return f"MISSED by {100 * gap:.0f}%"


# ---------------------------------------------------------------------------- the machine
def machine_description() -> dict[str, Any]:
    """What the figures were measured on, printed with every result."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def report(name: str, result: dict[str, Any], json_out: str | None) -> None:
    """Print the result as indented JSON (and write it to `json_out`), with the machine and load."""
    result = {"benchmark": name, **result, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if json_out:
        Path(json_out).write_text(text + "\n")


# -------------------------------------------------------------------------- networking
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http_ok(url: str, timeout: float, procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} while starting")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s")


# ------------------------------------------------------------------------ scratch stores
@contextmanager
def scratch_postgres(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database `bench_<prefix>_<random>`, dropped afterwards; yields its URL."""
    from sqlalchemy import create_engine, text

    name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        from jobcore.db.session import get_engine

        get_engine.cache_clear()  # engines of this process hold connections to the database
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def scratch_redis() -> Iterator[str]:
    """Our own Redis db, flushed before and after; yields its URL."""
    import redis

    url = f"{REDIS_BASE_URL}/{REDIS_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


# ------------------------------------------------------------------------- the service
def twinkle_jobs_command() -> list[str]:
    """The `twinkle-jobs` console script of this interpreter's environment (module form as fallback)."""
    script = Path(sys.executable).parent / "twinkle-jobs"
    return [str(script)] if script.exists() else [sys.executable, "-m", "twinkle_cli.main"]


@dataclass
class Service:
    """`twinkle-jobs server` and `twinkle-jobs worker` as child processes on the given stores."""

    data_dir: Path
    database_url: str
    broker_url: str | None
    extra_env: dict[str, str] = field(default_factory=dict)
    worker_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: "tw-bench-" + secrets.token_hex(12))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "TWINKLE_DATA_DIR": str(self.data_dir),
            "TWINKLE_DATABASE_URL": self.database_url,
            "TWINKLE_BOOTSTRAP_TOKEN": self.token,
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            **self.extra_env,
        }
        if self.broker_url:
            env["TWINKLE_BROKER_URL"] = self.broker_url
        return env

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / log_name, "ab") as out:
            proc = subprocess.Popen(
                [*twinkle_jobs_command(), *args], env=self.env(), stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(["server", "--host", "127.0.0.1", "--port", str(self.port)], "server.log")
        wait_http_ok(f"{self.url}/healthz", timeout, self.procs)
        self._spawn(["worker", "--no-beat", *self.worker_args], "worker.log")
        self.wait_worker_online(timeout)

    def wait_worker_online(self, timeout: float) -> None:
        """The worker registers itself in `workers` once it is ready to claim."""
        from sqlalchemy import select

        from jobcore.db.models import WorkerNode
        from jobcore.db.session import session_scope

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[-1].poll() is not None:
                raise RuntimeError(f"the worker exited; see {self.data_dir / 'logs' / 'worker.log'}")
            with session_scope(self.database_url) as session:
                if session.scalars(select(WorkerNode).where(WorkerNode.status == "online")).first():
                    time.sleep(1.0)  # registered before its Celery consumer subscribes: let it settle
                    return
            time.sleep(0.2)
        raise TimeoutError(f"no worker came online within {timeout:.0f} s")

    def client(self) -> Any:
        import httpx

        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30.0
        )

    def stop(self, grace: float = 30.0) -> None:
        for proc in reversed(self.procs):  # the worker first: it stops its jobs while the API still runs
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> Service:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------ training assets
def tiny_assets(directory: Path, dataset_rows: int = 256) -> tuple[Path, Path]:
    """The tiny hub-free Llama and a text dataset from `twinkle_core.assets` (reused if present)."""
    from twinkle_core.assets import build_tiny_model, write_text_dataset

    model_dir = directory / "tiny-llama"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir)
    dataset = directory / "train.jsonl"
    if not dataset.exists():
        write_text_dataset(dataset, n=dataset_rows)
    return model_dir, dataset


def read_events(progress_file: Path) -> list[dict[str, Any]]:
    """Whole lines of a progress.jsonl (a line being written is skipped)."""
    if not progress_file.exists():
        return []
    events = []
    for line in progress_file.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def wait_for_event(progress_file: Path, kind: str, timeout: float, poll: float = 0.01) -> dict[str, Any]:
    """Block until `progress_file` holds an event of `kind`; return the first one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in read_events(progress_file):
            if event.get("event") == kind:
                return event
            if event.get("event") == "error":
                raise RuntimeError(f"{progress_file}: the run failed: {event.get('message')}")
        time.sleep(poll)
    raise TimeoutError(f"no '{kind}' event in {progress_file} within {timeout:.0f} s")
