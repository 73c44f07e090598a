"""The reconciler: finds jobs whose worker is gone, cleans up after it and requeues them.

A lost job whose runner had already finished (the worker died between `done` and recording it)
is marked succeeded instead (see `worker.recovery.succeed_if_finished`).

It runs at worker start and periodically (Celery beat, and each worker's maintenance loop; every
pass is idempotent because each requeue is a compare-and-set). A worker counts as gone when its
heartbeat is older than `stale_after_seconds`, or, on this host, as soon as its process is dead.
Processes of this host's jobs whose ancestry holds no live worker are orphans of a dead
predecessor: they are killed before their job is requeued, so two attempts never overlap here.
A Ray job's runner is not: Ray owns it. A lost job's Ray jobs are stopped through Ray before it is
requeued (which frees a multi-node job's placement group), and again by the next attempt.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import psutil
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobcore import gpu_leases
from jobcore.db.models import Job, WorkerNode, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.spec import resources_of
from jobcore.jobs.states import ACTIVE, InvalidTransition
from jobcore.settings import Settings
from jobcore.storage import artifact_store
from worker.checkpoints import remove_dirs, remove_stored_checkpoints
from worker.process_tree import kill_all, processes_referencing
from worker.ray_launcher import RAY_LAUNCHED_ENV, stop_lost_attempts
from worker.recovery import retry_or_fail, succeed_if_finished
from worker.registry import DEAD, ONLINE, process_is_alive
from worker.slurm_attempt import SLURM_LAUNCHED_ENV, SlurmCommands, cancel_lost_job

log = logging.getLogger(__name__)


def reconcile(settings: Settings, me: str | None = None) -> list[str]:
    """One pass; returns the ids of the jobs it took back from lost workers."""
    db = settings.resolved_database_url
    with session_scope(db) as session:
        live_local = _mark_dead_workers(session, settings)
        worker_pids = _live_worker_pids_on_this_machine(session)
    kill_orphans(settings, worker_pids)
    with session_scope(db) as session:
        lost = _lost_jobs(session, settings, me, set(live_local))
    recovered = []
    store = artifact_store(settings) if lost else None
    for job_id, worker_id, attempt, launcher in lost:
        job_dir = settings.jobs_dir / job_id
        if launcher == "ray" and settings.ray_address:
            stop_lost_attempts(settings.ray_address, job_id, attempt)
        if launcher == "slurm" and settings.slurm:
            cancel_lost_job(SlurmCommands(settings.slurm_bin_dir), job_id)
        try:
            with session_scope(db) as session:
                job = session.get(Job, job_id, populate_existing=True)
                if job is None or job.worker_id != worker_id or job.attempt != attempt:
                    continue  # it moved on meanwhile
                reason = f"worker {worker_id} lost (no heartbeat)"
                finished = succeed_if_finished(session, job, job_dir, store, reason)
                if finished is None:
                    error = {"kind": "infra", "message": reason, "attempt": attempt}
                    retry_or_fail(session, job, job_dir, reason, error)
            if finished is not None:
                remove_dirs(finished.dirs_to_remove)
                remove_stored_checkpoints(finished.objects_to_remove, job_dir, store)
            recovered.append(job_id)
            log.warning("reconciler: took job %s back from lost worker %s", job_id, worker_id)
        except InvalidTransition:
            continue
    return recovered


def _mark_dead_workers(session: Session, settings: Settings) -> dict[str, int]:
    """Mark lost workers dead; return {worker id: pid} of the live workers of this host.

    On this host a worker is alive exactly while its process is (a loaded machine may delay a
    heartbeat, never a death); elsewhere only the heartbeat can tell.
    """
    stale = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    live_local: dict[str, int] = {}
    for row in session.scalars(select(WorkerNode).where(WorkerNode.status == ONLINE)).all():
        local = row.host == settings.worker_host
        alive = process_is_alive(row) if local else row.heartbeat_at >= stale
        if local and alive:
            live_local[row.id] = row.pid
        if not alive:
            row.status = DEAD
            gpu_leases.release(session, row.id)  # its jobs are requeued: their GPUs are free
    # Leases of owners that stopped refreshing them (a worker or serving host that died): they
    # already hold nothing; deleting them keeps the table to what is held.
    gpu_leases.drop_stale(session, settings.stale_after_seconds)
    return live_local


def _live_worker_pids_on_this_machine(session: Session) -> set[int]:
    """PIDs of online workers whose process runs on this machine, whatever host id they report.

    Several workers may share a machine under different host ids (tests, or one worker per GPU
    group); their job processes are not orphans, so every live worker process counts as a parent.
    """
    rows = session.scalars(select(WorkerNode).where(WorkerNode.status == ONLINE)).all()
    return {row.pid for row in rows if psutil.pid_exists(row.pid)}


def _lost_jobs(
    session: Session, settings: Settings, me: str | None, live_local: set[str]
) -> list[tuple[str, str, int, str]]:
    """Active jobs whose owner is gone, or whose heartbeat went stale under a remote owner:
    (id, worker id, attempt, launcher)."""
    stale = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    online = set(session.scalars(select(WorkerNode.id).where(WorkerNode.status == ONLINE)).all())
    lost: list[tuple[str, str, int, str]] = []
    for job in session.scalars(select(Job).where(Job.status.in_([s.value for s in ACTIVE]))).all():
        if job.worker_id == me or job.worker_id in live_local:
            continue  # supervised by a live process of this host
        owner_gone = job.worker_id not in online
        silent = job.heartbeat_at is None or job.heartbeat_at < stale
        if owner_gone or silent:
            lost.append((job.id, job.worker_id or "", job.attempt, resources_of(job.spec).launcher))
    return lost


def kill_orphans(settings: Settings, live_worker_pids: set[int]) -> list[int]:
    """Kill this host's job processes that no live worker started; returns their PIDs."""
    orphans = []
    for proc in processes_referencing(str(settings.jobs_dir) + "/", "spec.json"):
        if not _descends_from(proc, live_worker_pids) and not _runs_under_engine(proc):
            orphans.append(proc)
    if orphans:
        log.warning("killing orphaned job processes %s", [p.pid for p in orphans])
        kill_all(orphans)
    return [p.pid for p in orphans]


def _runs_under_engine(proc: psutil.Process) -> bool:
    """A Ray or Slurm job's runner (on a node that is also this host) descends from Ray or from
    slurmd, not from a worker: the engine owns it, and the next attempt stops it through the engine
    (worker.ray_launcher, worker.slurm_attempt)."""
    try:
        env = proc.environ()
    except psutil.Error:
        return False
    return env.get(RAY_LAUNCHED_ENV) == "1" or env.get(SLURM_LAUNCHED_ENV) == "1"


def _descends_from(proc: psutil.Process, ancestors: set[int]) -> bool:
    try:
        return any(parent.pid in ancestors for parent in proc.parents())
    except psutil.Error:
        return True  # gone already, or not ours to judge


def mark_offline(settings: Settings, worker_id: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        session.execute(update(WorkerNode).where(WorkerNode.id == worker_id).values(status="offline"))


def job_dir(settings: Settings, job_id: str) -> Path:
    return settings.jobs_dir / job_id
