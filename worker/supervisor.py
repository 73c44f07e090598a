"""One supervisor per running job (after Ray's job supervisor): it owns the attempt (torchrun
here, or a Ray job: see worker.attempt), its logs, the job's heartbeat and the stop sequence,
and decides how the attempt ended.

Every write to the job is fenced by (worker_id, attempt): if the reconciler or an operator gave
the job to someone else, the supervisor's next write fails, and it stops its processes instead of
racing the new owner.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from jobcore.db.models import Checkpoint, Job, JobEvent, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.engine import record_engine_state
from jobcore.jobs.lifecycle import transition
from jobcore.jobs.spec import training_of
from jobcore.jobs.states import InvalidTransition, JobStatus
from jobcore.settings import Settings
from jobcore.storage import artifact_store, is_remote
from twinkle_core.checkpoint import COMPLETE_MARKER, latest_complete_checkpoint, step_of
from twinkle_core.export import ExportRequest
from twinkle_core.progress import PROGRESS_FILE, ProgressReader
from worker import gang
from worker.attempt import AttemptTarget, RunningAttempt, SlurmSubmitter, start_attempt
from worker.base_merge import Merge, run_merge
from worker.checkpoints import local_copy, remove_dirs, remove_stored_checkpoints
from worker.ingest import Observed, OwnershipLost, fenced_job_update, forget_metrics_after, ingest_events
from worker.launch import AttemptPaths, Rendezvous, resolve_torchrun, runner_env, torchrun_argv
from worker.outcome import AttemptResult, Outcome, StopCause, classify, read_tail
from worker.recovery import finish, retry_or_fail
from worker.slurm_launcher import submit_slurm_attempt
from worker.spec_resolution import resolve_spec, write_spec

log = logging.getLogger(__name__)
S = JobStatus

POLL_SECONDS = 0.5  # how often progress.jsonl is read
CONTROL_SECONDS = 1.0  # how often the job row is checked for cancel / pause
LOG_TAIL_BYTES = 4000


@dataclass(frozen=True)
class Assignment:
    """A claimed job attempt and the resources leased to it."""

    job_id: str
    attempt: int
    worker_id: str
    gpu_ids: list[str]
    nproc_per_node: int
    nnodes: int = 1  # > 1: this supervisor is node 0 of a gang (see worker.gang)
    launcher: str = "torchrun"  # resources.launcher: how the runner is started (worker.attempt)


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        runner: str,
        on_exit: Callable[[Supervisor], None],
    ) -> None:
        self.settings = settings
        self.a = assignment
        self.runner = runner
        self.on_exit = on_exit
        self.db = settings.resolved_database_url
        self.job_dir = settings.jobs_dir / assignment.job_id
        node_rank = 0 if assignment.nnodes > 1 else None
        self.paths = AttemptPaths(self.job_dir, assignment.attempt, node_rank)
        self.reader = ProgressReader(self.job_dir / PROGRESS_FILE)
        self.seen = Observed()
        self.store = artifact_store(settings)
        self.result: AttemptResult | None = None
        self.run: RunningAttempt | None = None
        self._shutdown = threading.Event()
        self._node_left = False  # another node of the gang left because its worker stopped
        self.thread = threading.Thread(target=self._main, name=f"supervisor-{assignment.job_id}", daemon=True)

    @property
    def job_id(self) -> str:
        return self.a.job_id

    def start(self) -> None:
        self.thread.start()

    def request_shutdown(self) -> None:
        """The worker is stopping: end the attempt and hand the job back to the queue."""
        self._shutdown.set()

    # -- thread body ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._supervise()
        except OwnershipLost:
            log.warning("job %s attempt %s: ownership lost; stopped supervising", self.job_id, self.a.attempt)
        except Exception:
            log.exception("supervisor of job %s crashed", self.job_id)
            self._finish_safely(AttemptResult(Outcome.INFRA_ERROR, "supervisor error", None))
        finally:
            self.on_exit(self)

    def _supervise(self) -> None:
        prepared = self._prepare()
        if prepared is None:
            return
        resume_from = prepared
        rendezvous = None
        if self.a.nnodes > 1:
            rendezvous = self._await_gang()
            if rendezvous is None:
                return
        argv = torchrun_argv(
            resolve_torchrun(self.settings.torchrun),
            self.a.nproc_per_node,
            self.paths,
            resume_from or None,
            self.runner,
            rendezvous,
        )
        target = AttemptTarget(
            self.job_id, self.a.attempt, self.a.launcher, self.a.nproc_per_node, self.a.gpu_ids
        )
        env = runner_env(self.job_id, self.job_dir, self.a.gpu_ids)
        slurm = self._slurm_submitter()
        run = self.run = start_attempt(
            target, argv, env, self.job_dir, self.paths.log, self.settings.ray_address, slurm
        )
        try:
            with session_scope(self.db) as session:
                self._fenced(session, pids=run.pids())
                self._event(session, run.description, argv=argv, launcher=self.a.launcher)
                self._record_engine(session)
            stop = self._monitor(run)
        except BaseException:
            run.terminate(self.settings.cancel_grace_seconds)
            run.wait()
            raise
        exit_code = run.wait()
        run.reap()
        self._pump()
        tail = read_tail(self.paths.log, LOG_TAIL_BYTES)
        # A cluster engine that ended the job itself says why (Slurm's time limit: a timeout).
        ended: StopCause | None = getattr(run, "ended", None)
        self._finish(classify(exit_code, self.seen, stop, tail, ended))

    def _slurm_submitter(self) -> SlurmSubmitter | None:
        if not self.settings.slurm:
            return None
        return functools.partial(submit_slurm_attempt, self.settings, self.job_id, self.paths)

    def _prepare(self) -> str | None:
        """Resolve and write the spec, catch up on the log, pick the resume point.

        Returns the checkpoint to resume from ("" for none), or None when the job already ended
        (an invalid spec fails it here, without a launch).
        """
        self.job_dir.mkdir(parents=True, exist_ok=True)
        with session_scope(self.db) as session:
            job = self._job(session)
            self.reader.offset = job.progress_cursor or 0
            progress = self.job_dir / PROGRESS_FILE
            if self.reader.offset > (progress.stat().st_size if progress.exists() else 0):
                # The cursor points into a file this host does not have (no shared file system,
                # checkpoints in object storage): the new attempt's lines start a new file.
                self.reader.offset = 0
            if job.status in (S.CANCELLING, S.PAUSING):  # asked to stop before anything ran
                self._end(session, job, AttemptResult(Outcome.PAUSED, "stopped before launch", None))
                return None
            try:
                resolved = resolve_spec(session, job, self.settings)
            except ValueError as exc:
                self._end(session, job, AttemptResult(Outcome.USER_ERROR, str(exc), None))
                return None
            write_spec(resolved.spec, self.job_dir, self.a.attempt)
            # Lines a lost attempt wrote after its last commit: record them before relaunching.
            leftovers, values = ingest_events(session, self.job_id, self.reader.read_new(), None, self.store)
            resume = self._resume_point(job)
            # The new attempt recomputes everything after its checkpoint (all of it without one).
            start_step = step_of(resume) or 0
            forget_metrics_after(session, self.job_id, start_step)
            values["step"] = start_step
            self._fenced(
                session,
                job_dir=str(self.job_dir),
                gpu_ids=self.a.gpu_ids or None,
                resume_from=resume,
                progress_cursor=self.reader.offset,
                **values,
            )
            gpus = ",".join(self.a.gpu_ids) or "CPU"
            where = f"resuming from checkpoint {resume}" if resume else "from the beginning"
            self._event(
                session,
                f"attempt {self.a.attempt} on worker {self.a.worker_id} ({gpus}): {where}",
                attempt=self.a.attempt,
                resume_from=resume,
                gpu_ids=self.a.gpu_ids,
            )
        remove_dirs(leftovers.dirs_to_remove)
        remove_stored_checkpoints(leftovers.objects_to_remove, self.job_dir, self.store)
        if resolved.base_merge is not None and not self._merge_base(resolved.base_merge):
            return None
        return resume or ""

    def _merge_base(self, request: ExportRequest) -> bool:
        """Merge the LoRA job's adapter this job trains on from into its base (`worker.base_merge`;
        once: a retry or a resume finds it merged). False when the attempt ended here: stopped
        meanwhile, or the merge failed."""
        if Path(request.output_dir).is_dir():
            return True
        with session_scope(self.db) as session:
            self._event(
                session,
                f"merging the LoRA adapter of job {request.job_id} (step {request.step}) into its "
                "base: the weights this job trains on from",
                source_job_id=request.job_id,
                source_step=request.step,
            )

        def still_wanted() -> bool:
            with session_scope(self.db) as session:
                status = self._job(session).status
                self._fenced(session, heartbeat_at=utcnow())
                return status not in (S.CANCELLING, S.PAUSING)

        result = run_merge(request, self.paths.log, still_wanted, self.settings.heartbeat_seconds)
        if result.outcome is Merge.DONE:
            return True
        with session_scope(self.db) as session:
            job = self._job(session)
            if result.outcome is Merge.STOPPED:
                self._end(session, job, AttemptResult(Outcome.PAUSED, "stopped before launch", None))
            else:
                outcome = Outcome.USER_ERROR if result.user_error else Outcome.INFRA_ERROR
                tail = read_tail(self.paths.log, LOG_TAIL_BYTES)
                self._end(session, job, AttemptResult(outcome, result.message, None, tail))
        return False

    def _resume_point(self, job: Job) -> str | None:
        """The local checkpoint to resume from, downloaded first when it is in object storage."""
        if is_remote(job.resume_from):
            return str(self._download(str(job.resume_from)))
        if job.resume_from and (Path(job.resume_from) / COMPLETE_MARKER).exists():
            return job.resume_from
        latest = latest_complete_checkpoint(self.job_dir)
        if self.store is not None:
            # Another host (no shared file system) may have written newer checkpoints.
            session = object_session(job)
            assert session is not None
            row = session.scalars(
                select(Checkpoint)
                .where(Checkpoint.job_id == self.job_id, Checkpoint.deleted.is_(False))
                .order_by(Checkpoint.step.desc())
                .limit(1)
            ).first()
            remote = row.path if row is not None and is_remote(row.path) else None
            remote_step = row.step if row is not None else -1
            if remote and remote_step > (step_of(latest) or -1):
                return str(self._download(remote))
        return str(latest) if latest else None

    def _download(self, location: str) -> Path:
        return local_copy(location, self.job_dir, self.store, self.settings)

    # -- gang start (multi-node jobs) ------------------------------------------------------------

    def _await_gang(self) -> Rendezvous | None:
        """Wait until every node joined, then publish `launching`; None when the attempt ended here."""
        deadline = time.monotonic() + self.settings.gang_timeout_seconds
        while True:
            with session_scope(self.db) as session:
                job = self._job(session)
                if job.status in (S.CANCELLING, S.PAUSING):
                    self._end(session, job, AttemptResult(Outcome.PAUSED, "stopped before launch", None))
                    return None
                self._fenced(session, heartbeat_at=utcnow())
                rows = gang.members(session, self.job_id, self.a.attempt)
                if len(rows) == self.a.nnodes:
                    leader = rows[0]
                    assert leader.node_rank == 0 and leader.address and leader.port
                    gang.update_member(session, leader.id, status=gang.LAUNCHING, heartbeat_at=utcnow())
                    nodes = ", ".join(f"node {r.node_rank} on {r.host}" for r in rows)
                    endpoint = f"{leader.address}:{leader.port}"
                    self._event(session, f"gang assembled: {nodes}", rendezvous=endpoint)
                    timeout = self.settings.gang_timeout_seconds
                    return Rendezvous(self.a.nnodes, 0, leader.address, leader.port, timeout)
                if time.monotonic() > deadline or self._shutdown.is_set():
                    self._give_up_gang(session, job, len(rows))
                    return None
            time.sleep(POLL_SECONDS)

    def _give_up_gang(self, session: Session, job: Job, joined: int) -> None:
        """Not all nodes came: release every lease and requeue without charging an attempt."""
        self.result = AttemptResult(Outcome.INFRA_ERROR, "gang did not assemble", None)
        gang.release(session, self.job_id, self.a.attempt)
        why = (
            f"gang did not assemble: {joined} of {self.a.nnodes} nodes joined within "
            f"{self.settings.gang_timeout_seconds:.0f} s; leases released, back to the queue"
        )
        transition(session, job, S.RETRYING, message=why, level="warn", pids=None, gpu_ids=None)
        # The claim counted an attempt that never ran: give it back.
        transition(session, job, S.QUEUED, message="requeued (gang not assembled)", attempt=job.attempt - 1)

    def _gang_problem(self, session: Session) -> str | None:
        if self.a.nnodes <= 1:
            return None
        rows = gang.members(session, self.job_id, self.a.attempt)
        if rows:
            gang.update_member(session, rows[0].id, heartbeat_at=utcnow())
        self._node_left = self._node_left or any(r.status == gang.LEFT for r in rows)
        return gang.broken_member(rows, self.a.nnodes, self.settings.stale_after_seconds)

    # -- monitoring ----------------------------------------------------------------------------

    def _monitor(self, run: RunningAttempt) -> StopCause | None:
        launched = time.monotonic()
        last_progress = last_tick = launched
        last_control = 0.0
        pause_sent = False
        with session_scope(self.db) as session:
            job = self._job(session)
            timeout, spent = job.timeout_seconds, job.run_seconds
        # The budget is the job's: what earlier attempts ran is already spent.
        budget = None if not timeout else max(0.0, timeout - spent)
        while run.poll() is None:
            now = time.monotonic()
            if getattr(run, "queued", False):
                # Waiting in a cluster engine's queue (Slurm): neither hung nor spending the budget.
                launched += now - last_tick
                last_progress = now
            last_tick = now
            pids_changed = run.refresh()
            if self._pump(pids=run.pids() if pids_changed else None):
                last_progress = now
            if now - last_control >= CONTROL_SECONDS:
                last_control = now
                status, gang_problem = self._heartbeat_and_status()
                if gang_problem:
                    return self._stop(run, StopCause(Outcome.INFRA_ERROR, gang_problem))
                if status == S.CANCELLING:
                    return self._stop(run, StopCause(Outcome.CANCELLED, "cancelled"))
                if status == S.PAUSING and not run.can_signal:
                    # No way to send SIGUSR1 (a Ray job): stop it; it resumes from its checkpoint.
                    why = "paused: the attempt was stopped; it resumes from its latest checkpoint"
                    return self._stop(run, StopCause(Outcome.PAUSED, why))
                # SIGUSR1 before the runner installed its handler would kill it: wait for `started`.
                if status == S.PAUSING and not pause_sent and self.seen.started:
                    pause_sent = run.signal_ranks(signal.SIGUSR1) > 0
                if budget is not None and now - launched > budget:
                    why = f"timeout: ran longer than timeout_seconds={timeout}"
                    if spent:
                        why += f" ({spent:.0f} s of it in earlier attempts)"
                    return self._stop(run, StopCause(Outcome.TIMEOUT, why))
                if now - last_progress > self.settings.hang_timeout_seconds:
                    why = f"hang: no progress for {self.settings.hang_timeout_seconds:.0f} s"
                    return self._stop(run, StopCause(Outcome.INFRA_ERROR, why))
                if self._shutdown.is_set():
                    return self._stop(run, StopCause(Outcome.INFRA_ERROR, "worker shutting down"))
            time.sleep(POLL_SECONDS)
        return None

    def _stop(self, run: RunningAttempt, cause: StopCause) -> StopCause:
        log.info("job %s: stopping (%s)", self.job_id, cause.message)
        run.terminate(self.settings.cancel_grace_seconds)
        return cause

    def _pump(self, pids: list[int] | None = None) -> bool:
        """Ingest new progress lines; True if there were any."""
        events = self.reader.read_new()
        if not events and pids is None:
            return False
        with session_scope(self.db) as session:
            # `running` goes first, so the job's events read in the order things happened even
            # when one batch holds the whole run (a short job, a slow poll).
            if any(event.get("event") == "started" for event in events):
                job = self._job(session)
                mine = (job.worker_id, job.attempt) == (self.a.worker_id, self.a.attempt)
                if mine and job.status == S.STARTING:
                    # An earlier attempt's error (why it was retried) stays in the events; on
                    # the job it would outlive this attempt and be read as why it ended.
                    transition(session, job, S.RUNNING, message="runner started", error=None)
            limit = self._save_total_limit(session)
            seen, values = ingest_events(session, self.job_id, events, limit, self.store)
            if pids is not None:
                values["pids"] = pids
            self._fenced(session, progress_cursor=self.reader.offset, heartbeat_at=utcnow(), **values)
        self.seen.merge(seen)
        remove_dirs(seen.dirs_to_remove)
        remove_stored_checkpoints(seen.objects_to_remove, self.job_dir, self.store)
        return bool(events)

    def _heartbeat_and_status(self) -> tuple[str, str | None]:
        """The job's status, and why the gang broke (multi-node jobs), after a heartbeat."""
        with session_scope(self.db) as session:
            self._fenced(session, heartbeat_at=utcnow())
            self._record_engine(session)
            return self._job(session).status, self._gang_problem(session)

    def _record_engine(self, session: Session) -> None:
        """A job handed to a cluster engine (a Ray job): its id and state there, on the job row
        (written only when they change)."""
        engine = getattr(self.run, "engine", None)
        if engine is not None:
            record_engine_state(
                session,
                self._job(session),
                engine=engine,
                engine_job_id=getattr(self.run, "engine_job_id", None),
                state=getattr(self.run, "engine_state", None),
            )

    def _save_total_limit(self, session: Session) -> int | None:
        if not hasattr(self, "_limit_cache"):  # the spec does not change during an attempt
            self._limit_cache: int | None = training_of(self._job(session).spec).save_total_limit
        return self._limit_cache

    # -- the end -------------------------------------------------------------------------------

    def _finish(self, result: AttemptResult) -> None:
        self.result = result
        with session_scope(self.db) as session:
            job = self._job(session)
            if job.worker_id != self.a.worker_id or job.attempt != self.a.attempt:
                raise OwnershipLost(self.job_id)
            self._record_engine(session)  # the engine's final word (SUCCEEDED, FAILED, STOPPED)
            self._end(session, job, result)

    def _finish_safely(self, result: AttemptResult) -> None:
        try:
            self._finish(result)
        except (OwnershipLost, InvalidTransition):
            pass
        except Exception:
            log.exception("job %s: could not record the end of attempt %s", self.job_id, self.a.attempt)

    def _end(self, session: Session, job: Job, result: AttemptResult) -> None:
        self.result = result
        if self.a.nnodes > 1:
            self._gang_problem(session)  # refreshes _node_left: did a node leave, or fail?
            gang.release(session, self.job_id, self.a.attempt)  # every other node stops too
        error = {
            "kind": _error_kind(result.outcome),
            "message": result.message,
            "exit_code": result.exit_code,
            "log_tail": result.log_tail[-LOG_TAIL_BYTES:],
            "attempt": self.a.attempt,
        }
        if job.status == S.CANCELLING:
            finish(session, job, self.job_dir, S.CANCELLED, message="cancelled; every process stopped")
        elif result.outcome == Outcome.SUCCEEDED:
            # A pause asked for while the runner started (its signal handler not yet installed)
            # can meet a short run's end: say so, as the answer to the pause was "pausing".
            late = " (the training ended before the pause took effect)" if job.status == S.PAUSING else ""
            finish(session, job, self.job_dir, S.SUCCEEDED, message=f"succeeded{late}", error=None)
        elif result.outcome == Outcome.PAUSED:
            resume = self.seen.last_checkpoint or self._resume_point(job)
            finish(session, job, self.job_dir, S.PAUSED, message=f"paused at {resume}", resume_from=resume)
        elif result.outcome in (Outcome.USER_ERROR, Outcome.TIMEOUT):
            finish(session, job, self.job_dir, S.FAILED, message=result.message, level="error", error=error)
        else:
            # A worker shutting down (this one, or another node's) hands the job back without
            # charging it a retry.
            charge = not self._shutdown.is_set() and not self._node_left
            retry_or_fail(session, job, self.job_dir, result.message, error, charge_retry=charge)

    # -- helpers -------------------------------------------------------------------------------

    def _job(self, session: Session) -> Job:
        job = session.get(Job, self.job_id, populate_existing=True)
        if job is None:
            raise OwnershipLost(self.job_id)  # deleted under us
        return job

    def _fenced(self, session: Session, **values: object) -> None:
        fenced_job_update(session, self.job_id, self.a.worker_id, self.a.attempt, **values)

    def _event(self, session: Session, message: str, **data: object) -> None:
        session.add(JobEvent(job_id=self.job_id, type="message", message=message, data=data or None))


def _error_kind(outcome: Outcome) -> str:
    return {Outcome.USER_ERROR: "user", Outcome.TIMEOUT: "timeout"}.get(outcome, "infra")
