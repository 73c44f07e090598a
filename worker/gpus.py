"""Which GPUs a worker may lease, and the in-process ledger of who holds them.

A worker leases `nproc_per_node` GPUs to each job so that jobs sharing a machine get disjoint
`CUDA_VISIBLE_DEVICES`. The list comes from `TWINKLE_WORKER_GPUS` when set (tests give a CPU
worker pretend ids to check the leases), else from `nvidia-smi`, without importing torch.
A worker without GPUs runs jobs on CPU, `slots` of them at once.

Other processes of the machine (a serving host, another worker) hold GPUs through the shared
`gpu_leases` table (`jobcore.gpu_leases`); the agent reads them into `reserved` before each claim,
so that `fits` and `acquire` never hand them to a job.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from jobcore.gpu_leases import discover_gpus

__all__ = ["GpuLedger", "Lease", "discover_gpus"]


@dataclass
class Lease:
    job_id: str
    gpu_ids: list[str]


@dataclass
class GpuLedger:
    """Thread-safe record of leased GPUs (or CPU slots when the worker has no GPUs)."""

    gpus: list[str]
    cpu_slots: int
    _leases: dict[str, Lease] = field(default_factory=dict)
    _reserved: set[str] = field(default_factory=set)  # held by other processes of the machine
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def uses_gpus(self) -> bool:
        return bool(self.gpus)

    def reserve(self, gpu_ids: set[str]) -> None:
        """Set the GPUs other processes of the machine hold now (replacing the previous set)."""
        with self._lock:
            self._reserved = set(gpu_ids)

    def free_gpus(self) -> list[str]:
        with self._lock:
            return self._free_locked()

    def _free_locked(self) -> list[str]:
        taken = {g for lease in self._leases.values() for g in lease.gpu_ids}
        return [g for g in self.gpus if g not in taken and g not in self._reserved]

    def has_capacity(self) -> bool:
        with self._lock:
            if self.uses_gpus:
                return bool(self._free_locked())
            return len(self._leases) < self.cpu_slots

    def fits(self, nproc_per_node: int) -> bool:
        with self._lock:
            if self.uses_gpus:
                return nproc_per_node <= len(self._free_locked())
            return len(self._leases) < self.cpu_slots

    def acquire(self, job_id: str, nproc_per_node: int) -> Lease | None:
        """Lease GPUs (or a CPU slot) to `job_id`; None when they are not free."""
        with self._lock:
            if job_id in self._leases:
                raise AssertionError(f"{job_id} already holds a lease")
            if self.uses_gpus:
                free = self._free_locked()
                if nproc_per_node > len(free):
                    return None
                lease = Lease(job_id, free[:nproc_per_node])
            else:
                if len(self._leases) >= self.cpu_slots:
                    return None
                lease = Lease(job_id, [])
            self._leases[job_id] = lease
            return lease

    def release(self, job_id: str) -> None:
        with self._lock:
            self._leases.pop(job_id, None)

    def active_jobs(self) -> list[str]:
        with self._lock:
            return list(self._leases)
