"""Process-tree handling for torchrun jobs.

torchrun starts every rank in its own session, so signalling torchrun's process group misses the
ranks. We snapshot the tree with psutil while it is alive (psutil.Process remembers each PID's
creation time, which guards against PID reuse) and signal the members one by one.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterable

import psutil


class ProcessTree:
    """The processes of one job attempt: the torchrun root and everything it started."""

    def __init__(self, root_pid: int) -> None:
        self.root = psutil.Process(root_pid)
        self.members: dict[int, psutil.Process] = {root_pid: self.root}

    def refresh(self) -> bool:
        """Add newly started descendants; True if the membership changed."""
        before = set(self.members)
        with contextlib.suppress(psutil.Error):
            for child in self.root.children(recursive=True):
                self.members.setdefault(child.pid, child)
        return set(self.members) != before

    def ranks(self) -> list[psutil.Process]:
        """The training processes: the root's descendants that are still alive."""
        return [p for pid, p in self.members.items() if pid != self.root.pid and _alive(p)]

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.members.values() if _alive(p)]

    def pids(self) -> list[int]:
        return sorted(self.members)

    def signal_ranks(self, sig: int) -> int:
        sent = 0
        for proc in self.ranks():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                sent += 1
        return sent

    def terminate(self, grace_seconds: float) -> None:
        """SIGTERM torchrun, then SIGKILL every survivor of the tree after the grace period."""
        self.refresh()
        with contextlib.suppress(psutil.Error):
            self.root.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and self.alive():
            self.refresh()  # torchrun may still be spawning ranks when the cancel arrives
            time.sleep(0.1)
        kill_all(self.members.values())


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all(procs: Iterable[psutil.Process], wait_seconds: float = 5.0) -> None:
    """SIGKILL every process still alive and wait until they are gone."""
    victims = [p for p in procs if _alive(p)]
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=wait_seconds)


def processes_referencing(prefix: str, suffix: str) -> list[psutil.Process]:
    """Processes on this host with an argument that starts with `prefix` and ends with `suffix`
    (a job's spec path: torchrun and every rank carry it)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(part.startswith(prefix) and part.endswith(suffix) for part in cmdline):
            found.append(proc)
    return found
