"""The supervisor of a node other than 0 of a multi-node job.

It owns this host's torchrun (`--node-rank i`) and nothing of the job row: node 0's supervisor
records progress, checkpoints and the outcome. The attempt itself runs through the same protocol
as any job's (`worker.attempt.start_attempt` and its `RunningAttempt`: start, process tree, pause
signal, stop sequence, reaping), and its resume checkpoint comes through the same local copy
(`worker.checkpoints.local_copy`). This one heartbeats its `gang_members` row, marks
it `failed` when its torchrun dies (node 0 then fails the attempt on every node), and stops its
process tree as soon as its row disappears or the job leaves the attempt it joined (node 0
released the gang, the reconciler requeued the job, a user cancelled it).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint, Job, JobEvent, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.states import ACTIVE, JobStatus
from jobcore.settings import Settings
from jobcore.storage import artifact_store, is_remote
from twinkle_core.checkpoint import CHECKPOINTS_DIR, is_complete, step_of
from twinkle_core.export import ExportRequest
from worker import gang
from worker.attempt import AttemptTarget, RunningAttempt, start_attempt
from worker.base_merge import Merge, run_merge
from worker.checkpoints import local_copy
from worker.launch import AttemptPaths, Rendezvous, resolve_torchrun, runner_env, torchrun_argv
from worker.spec_resolution import resolve_spec, spec_written_for, write_spec

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
CONTROL_SECONDS = 1.0
RUNNING = "running"


class LaunchRefused(Exception):
    """This host cannot launch its node of the job (the spec does not resolve here)."""


class NodeSupervisor:
    def __init__(
        self,
        settings: Settings,
        job_id: str,
        attempt: int,
        member_id: str,
        node_rank: int,
        nnodes: int,
        gpu_ids: list[str],
        nproc_per_node: int,
        runner: str,
        on_exit: Callable[[NodeSupervisor], None],
    ) -> None:
        self.settings = settings
        self.job_id = job_id
        self.attempt = attempt
        self.member_id = member_id
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.gpu_ids = gpu_ids
        self.nproc_per_node = nproc_per_node
        self.runner = runner
        self.on_exit = on_exit
        self.db = settings.resolved_database_url
        self.job_dir = settings.jobs_dir / job_id
        self.paths = AttemptPaths(self.job_dir, attempt, node_rank)
        self.exit_code: int | None = None
        self._shutdown = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"node-{node_rank}-{job_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def request_shutdown(self) -> None:
        self._shutdown.set()

    def _main(self) -> None:
        try:
            self._run()
        except LaunchRefused as exc:
            # Not a crash: this host cannot run the job as node 0's host could (its stored data
            # or a path is not here). Said where the user reads, and node 0 retries the attempt.
            log.warning("job %s node %d: %s", self.job_id, self.node_rank, exc)
            self._say(str(exc))
            self._record_exit(gang.FAILED, None)
        except Exception as exc:
            log.exception("node %d supervisor of job %s crashed", self.node_rank, self.job_id)
            self._say(
                f"node {self.node_rank}'s supervisor crashed ({type(exc).__name__}); see its worker's log"
            )
            self._record_exit(gang.FAILED, None)
        finally:
            self.on_exit(self)

    def _run(self) -> None:
        ready = self._await_launch()
        if ready is None:
            return
        rendezvous, resume_from, base_merge = ready
        if base_merge is not None:  # this host's own copy of the weights the job trains on from
            poll = self.settings.heartbeat_seconds
            merged = run_merge(base_merge, self.paths.log, self._still_a_member, poll)
            if merged.outcome is not Merge.DONE:
                log.warning("node %d of job %s: %s", self.node_rank, self.job_id, merged.message or "stopped")
                if merged.outcome is Merge.FAILED:
                    self._say(f"node {self.node_rank}: {merged.message or 'the base merge failed'}")
                self._record_exit(gang.FAILED if merged.outcome is Merge.FAILED else gang.LEFT, None)
                return
        argv = torchrun_argv(
            resolve_torchrun(self.settings.torchrun),
            self.nproc_per_node,
            self.paths,
            resume_from,
            self.runner,
            rendezvous,
        )
        self.paths.rank_logs.mkdir(parents=True, exist_ok=True)
        # A gang's other nodes always run torchrun here (a Ray job has one node).
        target = AttemptTarget(self.job_id, self.attempt, "torchrun", self.nproc_per_node, self.gpu_ids)
        env = runner_env(self.job_id, self.job_dir, self.gpu_ids)
        run = start_attempt(target, argv, env, self.job_dir, self.paths.log, ray_address=None)
        self._launched_at = utcnow()
        try:
            self._monitor(run)
        finally:
            if run.poll() is None:
                run.terminate(self.settings.cancel_grace_seconds)
            self.exit_code = run.wait()
            run.reap()
        # A node that leaves because its worker stops is not the job's fault: node 0 requeues it
        # without charging a retry.
        ended = gang.EXITED if self.exit_code == 0 else gang.FAILED
        self._record_exit(gang.LEFT if self._shutdown.is_set() else ended, self.exit_code)

    def _still_a_member(self) -> bool:
        with session_scope(self.db) as session:
            return gang.update_member(session, self.member_id, heartbeat_at=utcnow())

    def _await_launch(self) -> tuple[Rendezvous, str | None, ExportRequest | None] | None:
        """Wait for node 0 to mark the gang `launching`; None when the gang ended first. With the
        rendezvous and the resume point comes the merge this host must run first, if any (a LoRA
        job's model as the base, on a host that does not share node 0's job directory)."""
        # Node 0 gives up after gang_timeout_seconds; the margin covers its last poll.
        deadline = time.monotonic() + self.settings.gang_timeout_seconds + 30
        while time.monotonic() < deadline and not self._shutdown.is_set():
            with session_scope(self.db) as session:
                if not gang.update_member(session, self.member_id, heartbeat_at=utcnow()):
                    return None  # released by node 0
                job = session.get(Job, self.job_id, populate_existing=True)
                if not self._same_attempt(job):
                    return None
                assert job is not None
                rows = gang.members(session, self.job_id, self.attempt)
                leader = rows[0] if rows else None
                if leader is not None and leader.status == gang.LAUNCHING and len(rows) == self.nnodes:
                    assert leader.address and leader.port
                    base_merge = None
                    if not spec_written_for(self.job_dir, self.attempt):
                        # No shared file system (or only an earlier attempt's copy here): resolve
                        # and check the spec on this host, as node 0 did on its own.
                        self.job_dir.mkdir(parents=True, exist_ok=True)
                        try:
                            resolved = resolve_spec(session, job, self.settings)
                        except ValueError as exc:
                            host = next((r.host for r in rows if r.id == self.member_id), "?")
                            raise LaunchRefused(
                                f"node {self.node_rank} ({host}) cannot launch the job: {exc}"
                            ) from None
                        write_spec(resolved.spec, self.job_dir, self.attempt)
                        base_merge = resolved.base_merge
                    resume_from = local_resume_point(self.settings, session, self.job_id, job.resume_from)
                    gang.update_member(session, self.member_id, status=RUNNING)
                    rendezvous = Rendezvous(
                        self.nnodes,
                        self.node_rank,
                        leader.address,
                        leader.port,
                        self.settings.gang_timeout_seconds,
                    )
                    return rendezvous, resume_from, base_merge
            time.sleep(POLL_SECONDS)
        with session_scope(self.db) as session:  # leave, so that another host can take the rank
            gang.release_member(session, self.member_id)
        return None

    def _monitor(self, run: RunningAttempt) -> None:
        pause_sent = False
        while run.poll() is None:
            run.refresh()
            with session_scope(self.db) as session:
                still_member = gang.update_member(session, self.member_id, heartbeat_at=utcnow())
                job = session.get(Job, self.job_id, populate_existing=True)
                if not still_member or not self._same_attempt(job):
                    log.info("job %s node %d: the gang ended; stopping", self.job_id, self.node_rank)
                    run.terminate(self.settings.cancel_grace_seconds)
                    return
                assert job is not None
                runner_started = job.running_since is not None and job.running_since >= self._launched_at
                if job.status == JobStatus.PAUSING and runner_started and not pause_sent:
                    # Every rank must reach the pause checkpoint together, not only node 0's. (Only
                    # once the runner started: SIGUSR1 before its handler is installed kills it.)
                    pause_sent = run.signal_ranks(signal.SIGUSR1) > 0
            if self._shutdown.is_set():
                # Say so before stopping: node 0's ranks fail as soon as ours are gone, and its
                # supervisor must already see why.
                with session_scope(self.db) as session:
                    gang.update_member(session, self.member_id, status=gang.LEFT)
                run.terminate(self.settings.cancel_grace_seconds)
                return
            time.sleep(CONTROL_SECONDS)

    def _same_attempt(self, job: Job | None) -> bool:
        return job is not None and job.attempt == self.attempt and JobStatus(job.status) in ACTIVE

    def _say(self, message: str) -> None:
        try:
            with session_scope(self.db) as session:
                data = {"node_rank": self.node_rank}
                session.add(JobEvent(job_id=self.job_id, type="message", message=message, data=data))
        except Exception:
            log.exception("job %s node %d: could not record an event", self.job_id, self.node_rank)

    def _record_exit(self, status: str, exit_code: int | None) -> None:
        try:
            with session_scope(self.db) as session:
                gang.update_member(session, self.member_id, status=status, exit_code=exit_code)
        except Exception:
            log.exception("job %s node %d: could not record its exit", self.job_id, self.node_rank)


def local_resume_point(
    settings: Settings, session: Session, job_id: str, resume_from: str | None
) -> str | None:
    """Node 0's resume checkpoint as a path on this host.

    With a shared file system that is node 0's own path. Otherwise it is the same `step-N` in this
    host's job dir, downloaded from object storage (marker last) when this host lacks it.
    """
    if not resume_from:
        return None
    if is_complete(resume_from):
        return resume_from
    job_dir = settings.jobs_dir / job_id
    local = job_dir / CHECKPOINTS_DIR / Path(resume_from).name
    if is_complete(local):
        return str(local)
    query = select(Checkpoint).where(
        Checkpoint.job_id == job_id, Checkpoint.step == step_of(resume_from), Checkpoint.deleted.is_(False)
    )
    row = session.scalar(query)
    if row is None or not is_remote(row.path):
        raise FileNotFoundError(f"resume checkpoint {resume_from} is not on this host nor in object storage")
    return str(local_copy(row.path, job_dir, artifact_store(settings), settings))
