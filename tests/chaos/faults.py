"""Fault injectors for the chaos suite: process finders, and the gatekeeper that holds fresh runs
at a known step so a fault always strikes a job mid-way (the private Redis is redis_server.py).

Everything stays on loopback and on processes this test started.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from gated_runner import gate_dir

TORCHRUN_MARKERS = ("torchrun", "torch.distributed.run")


def is_torchrun(cmdline: list[str]) -> bool:
    return any(marker in part for part in cmdline for marker in TORCHRUN_MARKERS)


def training_ranks(root_pid: int) -> list[psutil.Process]:
    """The rank processes (not torchrun itself) below a worker process: those running a job's
    spec (`.../spec.json`), whatever runner module or script they run."""
    ranks = []
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for proc in children:
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if any(part.endswith("spec.json") for part in cmdline) and not is_torchrun(cmdline):
            ranks.append(proc)
    return ranks


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@dataclass(frozen=True)
class Held:
    """A fresh run waiting at the gate (see gated_runner.py)."""

    job_id: str
    rank0_pid: int
    step: int


class Gatekeeper:
    """Opens the gate of every held run, except the one a fault injector is waiting to catch.

    `catch(predicate)` returns the first held run that matches; until then every other held run
    is let through, so the stream of jobs keeps moving while the injector waits.
    """

    def __init__(
        self, jobs_dir: Path, job_ids: Callable[[], list[str]], catching: threading.Event | None = None
    ) -> None:
        self.jobs_dir = jobs_dir
        self.job_ids = job_ids
        self.released: list[str] = []
        self.caught: set[str] = set()
        self._lock = threading.Lock()
        # Set while `catch` waits (shared with the job stream, which then keeps supplying runs).
        self._catching = catching or threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gatekeeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            if not self._catching.is_set():
                self.release_all()

    def _held(self) -> list[Held]:
        held = []
        for job_id in self.job_ids():
            gate = gate_dir(self.jobs_dir / job_id)
            if job_id in self.caught or (gate / "open").exists():
                continue
            try:
                marker = json.loads((gate / "held").read_text())
            except (OSError, ValueError):
                continue
            held.append(Held(job_id, int(marker["pid"]), int(marker["step"])))
        return held

    def release(self, job_id: str) -> None:
        gate = gate_dir(self.jobs_dir / job_id)
        gate.mkdir(parents=True, exist_ok=True)
        (gate / "open").touch()
        self.released.append(job_id)

    def release_all(self) -> None:
        with self._lock:
            for held in self._held():
                self.release(held.job_id)

    def catch(
        self,
        predicate: Callable[[Held], bool],
        timeout: float,
        hopeless: Callable[[], str | None] = lambda: None,
    ) -> Held:
        """Wait for a held run that matches (it stays held: the caller strikes it). `hopeless`
        names a reason no run can match any more (the worker it must run under died), if any."""
        deadline = time.monotonic() + timeout
        self._catching.set()
        try:
            while time.monotonic() < deadline:
                reason = hopeless()
                if reason:
                    raise TimeoutError(f"no run can reach the gate: {reason}")
                with self._lock:
                    for held in self._held():
                        if predicate(held):
                            self.caught.add(held.job_id)
                            return held
                        self.release(held.job_id)
                time.sleep(0.1)
        finally:
            self._catching.clear()
        raise TimeoutError("no run reached the gate in time")


def runs_under(worker_pid: int) -> Callable[[Held], bool]:
    """A predicate: the held run's rank 0 descends from this worker."""

    def check(held: Held) -> bool:
        try:
            return any(p.pid == worker_pid for p in psutil.Process(held.rank0_pid).parents())
        except psutil.Error:
            return False

    return check
