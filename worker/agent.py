"""The worker agent: one per worker process. It registers the worker, heartbeats, leases GPUs,
claims jobs while it has room and runs one Supervisor thread per job.

Celery tasks only poke it (`claim_available`); it also polls the SQL queue itself every
heartbeat, so a wake-up consumed by a busy worker, or lost with a broker, delays a job by
seconds and loses nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore import gpu_leases
from jobcore.db.models import WorkerNode, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.engine import ENGINES
from jobcore.jobs.spec import resources_of
from jobcore.settings import Settings
from worker import gang, reconciler, retention, webhooks
from worker.claim import claim_next_job
from worker.exports import Exporter
from worker.gang_node import NodeSupervisor
from worker.gpus import GpuLedger, discover_gpus
from worker.launch import DEFAULT_RUNNER
from worker.registry import ONLINE, new_worker_id, register, worker_of_this_name_elsewhere
from worker.supervisor import Assignment, Supervisor

log = logging.getLogger(__name__)

RUNNER_ENV = "TWINKLE_WORKER_RUNNER"  # the module (or .py script) torchrun runs; tests only
HOUSEKEEPING_SECONDS = 30.0  # retention sweep, disk usage


class WorkerNameInUse(RuntimeError):
    """Another live worker, on another machine, registered under this worker's machine name."""


class WorkerAgent:
    def __init__(self, settings: Settings, slots: int | None = None, runner: str | None = None) -> None:
        self.settings = settings
        self.db = settings.resolved_database_url
        self.host = settings.worker_host
        self.worker_id = new_worker_id(self.host)
        self.ledger = GpuLedger(discover_gpus(settings.worker_gpus), slots or settings.worker_slots)
        self.runner = runner or os.environ.get(RUNNER_ENV) or DEFAULT_RUNNER
        self.supervisors: dict[str, Supervisor | NodeSupervisor] = {}
        self.exporter = Exporter(settings, self.worker_id)  # checkpoint exports, its own thread
        self._claim_lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._webhooks_due = threading.Event()
        self._thread = threading.Thread(target=self._maintenance, name="worker-maintenance", daemon=True)
        # Webhook receivers can be slow; they get their own thread so heartbeats never wait on them.
        self._webhook_thread = threading.Thread(
            target=self._webhook_loop, name="worker-webhooks", daemon=True
        )

    @property
    def launchers(self) -> tuple[str, ...]:
        """The launchers this worker can run: torchrun always, Ray with a Ray address, Slurm with
        TWINKLE_SLURM."""
        ray = ("ray",) if self.settings.ray_address else ()
        slurm = ("slurm",) if self.settings.slurm else ()
        return ("torchrun", *ray, *slurm)

    @property
    def _hands_off_jobs(self) -> bool:
        return any(launcher in ENGINES for launcher in self.launchers)

    @property
    def slots(self) -> int:
        return len(self.ledger.gpus) if self.ledger.uses_gpus else self.ledger.cpu_slots

    def start(self) -> None:
        self.settings.ensure_dirs()
        other = worker_of_this_name_elsewhere(
            self.db, self.host, self.settings.heartbeat_seconds, self.settings.stale_after_seconds
        )
        if other is not None:
            raise WorkerNameInUse(
                f"worker {other} is alive under the machine name {self.host!r} but is no process of "
                "this machine: another machine or container uses the same TWINKLE_WORKER_HOST, and "
                "each would take the other for dead and requeue its jobs; give each its own name"
            )
        with session_scope(self.db) as session:
            register(session, self.worker_id, self.host, self.ledger.gpus, self.slots)
        log.info(
            "worker %s registered: GPUs %s, %d slot(s), runner %s, Ray jobs %s",
            self.worker_id,
            self.ledger.gpus or "none (CPU)",
            self.slots,
            self.runner,
            f"on {self.settings.ray_address}" if self.settings.ray_address else "not claimed",
        )
        # A predecessor that died on this host left processes and jobs: end and requeue them first.
        reconciler.reconcile(self.settings, me=self.worker_id)
        self._thread.start()
        self._webhook_thread.start()
        self.exporter.start()
        self.claim_available()

    def stop(self, timeout: float | None = None) -> None:
        """Hand running jobs back to the queue, wait for their supervisors, go offline."""
        self._stopping.set()
        self._wake.set()
        self._webhooks_due.set()
        supervisors = list(self.supervisors.values())
        for sup in supervisors:
            sup.request_shutdown()
        self.exporter.stop()
        deadline = time.monotonic() + (timeout or self.settings.cancel_grace_seconds + 30)
        for sup in supervisors:
            sup.thread.join(max(0.0, deadline - time.monotonic()))
        reconciler.mark_offline(self.settings, self.worker_id)
        with session_scope(self.db) as session:
            gpu_leases.release(session, self.worker_id)  # a supervisor still stopping holds nothing

    # -- claiming ------------------------------------------------------------------------------

    def claim_available(self, hint: str | None = None) -> int:
        """Claim and launch queued jobs while GPUs or slots are free; returns how many."""
        launched = 0
        with self._claim_lock:
            self._read_reserved_gpus()
            # A job handed to a cluster engine takes no lease: a worker with an engine claims
            # those even when its own GPUs are all leased.
            while not self._stopping.is_set() and (self.ledger.has_capacity() or self._hands_off_jobs):
                sup = self._claim_one()
                if sup is None:
                    break
                sup.start()
                launched += 1
        if hint and launched == 0:
            log.debug("wake-up for %s: nothing this worker can claim", hint)
        return launched

    def _read_reserved_gpus(self) -> None:
        """The GPUs of this machine that other processes (a serving host, another worker) hold,
        so that `fits` leaves them out: read before each round of claims. A race with one taken
        after this read ends in the claim's insert failing (`_claim_one`)."""
        if not self.ledger.uses_gpus or self._stopping.is_set():
            return
        with session_scope(self.db) as session:
            held = gpu_leases.held_elsewhere(
                session, self.host, self.worker_id, self.settings.stale_after_seconds
            )
        self.ledger.reserve(held)

    def _claim_one(self) -> Supervisor | NodeSupervisor | None:
        claimed: list[str] = []  # the job whose lease to give back if the claim does not commit
        try:
            with session_scope(self.db) as session:
                # Completing a gang that is waiting for nodes goes before leading a new one: two
                # half-formed gangs waiting on each other would both time out.
                node = self._join_gang(session, claimed)
                if node is not None:
                    self.supervisors[node.job_id] = node
                    return node
                job = claim_next_job(session, self.worker_id, self.ledger.fits, self.launchers)
                if job is None:
                    return None
                resources = resources_of(job.spec)
                nproc, nnodes = resources.nproc_per_node, resources.nnodes
                if resources.launcher in ENGINES:
                    # The engine places every node on its own cluster (a Ray placement group): no
                    # lease on this worker, and no gang of workers to lead.
                    gpu_ids, nnodes = [], 1
                else:
                    if nnodes > 1:
                        gang.lead(session, job, self.worker_id, self.host, self.settings.rendezvous_address)
                    gpu_ids = self._lease(session, job.id, nproc, claimed)
                assignment = Assignment(
                    job.id, job.attempt, self.worker_id, gpu_ids, nproc, nnodes, resources.launcher
                )
                sup = Supervisor(self.settings, assignment, self.runner, self._on_supervisor_exit)
                self.supervisors[job.id] = sup
        except Exception as exc:
            # The claim rolled back: the job is not ours, nor its GPUs.
            for job_id in claimed:
                self.supervisors.pop(job_id, None)
                self.ledger.release(job_id)
            if isinstance(exc, IntegrityError):
                # Another process of this machine (a serving host) took one of the GPUs between our
                # read of its leases and our insert: the next pass chooses again.
                log.info("GPU lease lost to another process of %s; claiming again", self.host)
                return None
            raise
        # Committed: the job is ours.
        return sup

    def _lease(self, session: Session, job_id: str, nproc: int, claimed: list[str]) -> list[str]:
        """GPUs (or a CPU slot) from the ledger, recorded in the machine's shared lease table in
        the claim's transaction."""
        lease = self.ledger.acquire(job_id, nproc)
        assert lease is not None, "jobs are claimed or joined only when they fit"
        claimed.append(job_id)
        gpu_leases.take(
            session,
            self.host,
            self.worker_id,
            job_id,
            gpu_leases.JOB,
            lease.gpu_ids,
            self.settings.stale_after_seconds,
        )
        return lease.gpu_ids

    def _join_gang(self, session: Session, claimed: list[str]) -> NodeSupervisor | None:
        joined = gang.join_forming_gang(session, self.worker_id, self.host, self.ledger.fits)
        if joined is None:
            return None
        job, member = joined
        resources = resources_of(job.spec)
        nproc = resources.nproc_per_node
        gpu_ids = self._lease(session, job.id, nproc, claimed)
        gang.update_member(session, member.id, gpu_ids=gpu_ids or None)
        return NodeSupervisor(
            self.settings,
            job.id,
            job.attempt,
            member.id,
            member.node_rank,
            resources.nnodes,
            gpu_ids,
            nproc,
            self.runner,
            self._on_supervisor_exit,
        )

    def _on_supervisor_exit(self, sup: Supervisor | NodeSupervisor) -> None:
        self.supervisors.pop(sup.job_id, None)
        self.ledger.release(sup.job_id)
        try:
            with session_scope(self.db) as session:
                gpu_leases.release(session, self.worker_id, sup.job_id)
        except Exception:  # not refreshed any more, the row goes stale and frees the GPUs
            log.exception("could not release the GPU leases of %s", sup.job_id)
        self._webhooks_due.set()  # a terminal job's webhook goes out now, not at the next sweep
        self._wake.set()  # look for more work

    # -- maintenance loop ----------------------------------------------------------------------

    def _maintenance(self) -> None:
        last_reconcile = last_housekeeping = time.monotonic()
        while not self._stopping.is_set():
            self._wake.wait(self.settings.heartbeat_seconds)
            self._wake.clear()
            if self._stopping.is_set():
                break
            now = time.monotonic()
            try:
                self._heartbeat()
                if now - last_reconcile >= self.settings.stale_after_seconds / 2:
                    last_reconcile = now
                    reconciler.reconcile(self.settings, me=self.worker_id)
                if now - last_housekeeping >= HOUSEKEEPING_SECONDS:
                    last_housekeeping = now
                    retention.sweep_deleted_jobs(self.settings)
                    retention.refresh_disk_usage(self.settings)
                self.claim_available()
            except Exception:
                log.exception("worker maintenance pass failed; retrying next heartbeat")

    def _heartbeat(self) -> None:
        with session_scope(self.db) as session:
            session.execute(
                update(WorkerNode)
                .where(WorkerNode.id == self.worker_id)
                .values(heartbeat_at=utcnow(), status=ONLINE)
            )
            # Only the running jobs' leases: a row left by a failed release goes stale.
            gpu_leases.refresh(session, self.worker_id, self.ledger.active_jobs())

    def _webhook_loop(self) -> None:
        while not self._stopping.is_set():
            self._webhooks_due.wait(self.settings.heartbeat_seconds)
            self._webhooks_due.clear()
            if self._stopping.is_set():
                break
            try:
                with session_scope(self.db) as session:
                    webhooks.sweep_missing_deliveries(session)
                webhooks.deliver_due(self.db)
            except Exception:
                log.exception("webhook delivery pass failed; retrying")


_current: WorkerAgent | None = None


def current_agent() -> WorkerAgent | None:
    return _current


def set_current_agent(agent: WorkerAgent | None) -> None:
    global _current
    _current = agent
