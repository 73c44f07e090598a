"""The GPUs a serving host serves on, leased from its machine's pool like a training job's.

At start the host takes `TWINKLE_SERVING_GPUS` GPUs (default 1) of the machine's pool
(`TWINKLE_WORKER_GPUS`, else the GPUs it sees) through the shared `gpu_leases` table, waiting while
workers' jobs hold them all, and then sees only those (`CUDA_VISIBLE_DEVICES`), so that a worker on
the same machine does not give them to training while the host runs. Its heartbeat refreshes the
lease, a clean stop releases it, and a host that dies stops refreshing it: after
`TWINKLE_STALE_AFTER_SECONDS` the GPUs are free again (the reconciler deletes the rows). A machine
without GPUs leases nothing and serves on the CPU.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

from sqlalchemy.exc import IntegrityError

from jobcore import gpu_leases
from jobcore.db.session import session_scope
from jobcore.settings import Settings

log = logging.getLogger(__name__)


class ServingGpus:
    def __init__(
        self,
        database_url: str,
        *,
        host: str,
        pool: list[str],
        want: int,
        stale_after_seconds: float,
        poll_seconds: float,
    ) -> None:
        self.database_url = database_url
        self.host = host  # the machine's identity in the lease table (TWINKLE_WORKER_HOST)
        self.pool = pool
        self.want = min(want, len(pool))  # a CPU machine (empty pool) leases nothing
        self.stale_after_seconds = stale_after_seconds
        self.poll_seconds = poll_seconds
        self.owner = f"serve-{host[:36]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.gpu_ids: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> ServingGpus:
        return cls(
            settings.resolved_database_url,
            host=settings.worker_host,
            pool=gpu_leases.discover_gpus(settings.worker_gpus),
            want=settings.serving_gpus,
            stale_after_seconds=settings.stale_after_seconds,
            poll_seconds=settings.serving_heartbeat_seconds,
        )

    def try_acquire(self) -> bool:
        """Take `want` free GPUs of the pool if there are that many; True when held (or none wanted)."""
        if self.gpu_ids or not self.want:
            return True
        try:
            with session_scope(self.database_url) as session:
                taken = gpu_leases.held_elsewhere(session, self.host, self.owner, self.stale_after_seconds)
                free = [g for g in self.pool if g not in taken]
                if len(free) < self.want:
                    return False
                chosen = free[: self.want]
                gpu_leases.take(
                    session,
                    self.host,
                    self.owner,
                    self.owner,
                    gpu_leases.SERVING,
                    chosen,
                    self.stale_after_seconds,
                )
        except IntegrityError:
            return False  # a worker's claim took one of them meanwhile: choose again
        self.gpu_ids = chosen
        return True

    def acquire(self, stop: threading.Event | None = None) -> list[str]:
        """Wait until the GPUs are leased (or `stop` is set); the leased ids."""
        stop = stop or threading.Event()
        waiting = False
        while not self.try_acquire():
            if not waiting:
                log.info(
                    "serving host waiting for %d free GPU(s) of %s on %s (the others are leased)",
                    self.want,
                    ",".join(self.pool),
                    self.host,
                )
                waiting = True
            if stop.wait(self.poll_seconds):
                return []
        if self.gpu_ids:
            log.info("serving host leased GPU(s) %s on %s", ",".join(self.gpu_ids), self.host)
        return self.gpu_ids

    def refresh(self) -> None:
        if not self.gpu_ids:
            return
        with session_scope(self.database_url) as session:
            held = gpu_leases.refresh(session, self.owner)
        if held < len(self.gpu_ids):
            # Only after this host's heartbeat stopped for `stale_after_seconds` (a frozen host):
            # the lease went stale and may have been given to a job.
            log.error("serving host lost its lease of GPU(s) %s", ",".join(self.gpu_ids))

    def release(self) -> None:
        if not self.gpu_ids:
            return
        with session_scope(self.database_url) as session:
            gpu_leases.release(session, self.owner)
        log.info("serving host released GPU(s) %s", ",".join(self.gpu_ids))
        self.gpu_ids = []
