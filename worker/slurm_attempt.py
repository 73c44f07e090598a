"""Run a job attempt as a Slurm batch job: `RunningAttempt` over `sbatch`, `scontrol`, `scancel`.

The supervisor builds the runner command as for a local attempt; `SlurmJobAttempt.submit` writes
it into a batch script (worker.slurm_batch) and submits it. From then on the supervisor drives
the Slurm job exactly like a local process tree: `poll` follows the job's state (`scontrol show
job`), `terminate` is `scancel` and waits until Slurm lists nothing of it, the pause signal is
`scancel --signal=USR1`. The runner writes `progress.jsonl` into the job directory as always,
and Slurm's output file is the attempt's log. The worker holds no GPU lease for the job: Slurm
places it.

The engine state the job row shows (`engine`, `engine_job_id`, `engine_state`) is read from
this object by the supervisor after every poll of the job row, and so is `ended`: set when Slurm
itself ended the job for a reason the exit code cannot carry (its time limit: a timeout).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.outcome import Outcome, StopCause
from worker.slurm_batch import SlurmRequest, batch_script, sbatch_argv
from worker.slurm_state import SlurmJobState, parse_scontrol

log = logging.getLogger(__name__)

STATE_POLL_SECONDS = 2.0  # scontrol asks slurmctld: not on every 0.5 s poll of the supervisor
COMMAND_TIMEOUT_SECONDS = 60.0
# Set in the runner's environment: the reconciler leaves Slurm's processes to Slurm.
SLURM_LAUNCHED_ENV = "TWINKLE_SLURM_LAUNCHED"


@dataclass(frozen=True)
class SlurmCommands:
    """Where Slurm's client commands are (TWINKLE_SLURM_BIN_DIR, else PATH)."""

    bin_dir: str | None = None

    def path(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    def run(self, name: str, *args: str, env: dict[str, str] | None = None) -> str:
        """Run a Slurm command; its stdout. A failure raises RuntimeError with Slurm's message."""
        try:
            done = subprocess.run(
                [self.path(name), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{name}: {exc}") from exc
        if done.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def state(self, slurm_job_id: str) -> SlurmJobState | None:
        try:
            return parse_scontrol(self.run("scontrol", "show", "job", "-o", slurm_job_id))
        except RuntimeError as exc:
            if "Invalid job id" in str(exc):
                return None  # never existed, or forgotten by slurmctld (MinJobAge)
            raise

    def queued_ids(self, job_name: str) -> list[str]:
        """Ids of the jobs of that name Slurm still lists as pending or running."""
        out = self.run("squeue", "-h", f"--name={job_name}", "-o", "%i")
        return [line.strip() for line in out.splitlines() if line.strip()]


def slurm_job_name(job_id: str) -> str:
    """Every attempt of a job has the same name: a new attempt finds what an earlier one left."""
    return f"twinkle-{job_id}"


class SlurmJobAttempt:
    """One submitted Slurm batch job, driven like a local process tree."""

    engine = "slurm"

    def __init__(self, commands: SlurmCommands, slurm_job_id: str, log_path: Path) -> None:
        # No local processes: the runner runs on Slurm's nodes (Popen's pid, ProcessTree's members).
        self.pid: int | None = None
        self.members: dict[int, Any] = {}
        self.commands = commands
        self.engine_job_id = slurm_job_id
        self.engine_state: str | None = "PENDING"
        self.log_path = log_path
        self.last: SlurmJobState | None = None
        # Why Slurm ended the job, where that decides the outcome (`worker.outcome.classify`).
        self.ended: StopCause | None = None
        self._exit_code: int | None = None
        self._polled_at = 0.0
        self._unreachable = False

    @classmethod
    def submit(
        cls,
        commands: SlurmCommands,
        request: SlurmRequest,
        argv: list[str],
        env: dict[str, str],
        rank_logs: Path,
    ) -> SlurmJobAttempt:
        """Write the batch script next to the attempt's log and `sbatch` it (see worker.slurm_batch)."""
        cancel_earlier(commands, request.job_name)
        script = request.output.with_suffix(".sbatch")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(batch_script(argv, rank_logs, sys.executable, request.workdir))
        script.chmod(0o755)
        # sbatch exports its own environment (--export=ALL): the runner's, without the GPUs the
        # worker sees (Slurm sets CUDA_VISIBLE_DEVICES on the node it allocates).
        env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        env[SLURM_LAUNCHED_ENV] = "1"
        out = commands.run("sbatch", *sbatch_argv(commands.path("sbatch"), request, script)[1:], env=env)
        slurm_job_id = out.strip().split(";", 1)[0]  # --parsable: "<id>" or "<id>;<cluster>"
        log.info("submitted Slurm job %s (%s, %d node(s))", slurm_job_id, request.job_name, request.nodes)
        return cls(commands, slurm_job_id, request.output)

    @property
    def description(self) -> str:
        return f"submitted Slurm job {self.engine_job_id}, log {self.log_path.name}"

    # -- Popen's shape ------------------------------------------------------------------------

    def poll(self) -> int | None:
        """None while Slurm has the job pending or running, else its exit code (slurm_state).

        A slurmctld that does not answer counts as "still running": the supervisor's hang timeout
        ends an attempt whose controller stays away.
        """
        if self._exit_code is not None:
            return self._exit_code
        now = time.monotonic()
        if now - self._polled_at < STATE_POLL_SECONDS:
            return None
        self._polled_at = now
        try:
            state = self.commands.state(self.engine_job_id)
        except RuntimeError as exc:
            if not self._unreachable:
                log.warning("Slurm job %s: state unavailable (%s); retrying", self.engine_job_id, exc)
            self._unreachable = True
            return None
        self._unreachable = False
        if state is None:  # slurmctld forgot it: it ended long ago, we cannot know how
            self.engine_state = "UNKNOWN"
            self._exit_code = -9
            return self._exit_code
        if self.last is not None and state.restarts > self.last.restarts:
            log.warning(
                "Slurm job %s requeued (restart %d): it resumes from its newest checkpoint",
                self.engine_job_id,
                state.restarts,
            )
        self.last = state
        self.engine_state = state.shown_state
        if state.terminal:
            self._exit_code = state.attempt_exit_code()
            if state.timed_out:
                limit = f" ({state.time_limit})" if state.time_limit else ""
                why = f"timeout: Slurm ended job {self.engine_job_id} at its time limit{limit}"
                why += ", set from timeout_seconds"
                self.ended = StopCause(Outcome.TIMEOUT, why)
        return self._exit_code

    @property
    def queued(self) -> bool:
        """Waiting in Slurm's queue (first submitted, or requeued): no progress is expected."""
        return self._exit_code is None and (self.last is None or self.last.state == "PENDING")

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {self.engine_job_id} still running after {timeout} s")
            time.sleep(interval)
        return code

    # -- ProcessTree's shape ------------------------------------------------------------------

    def refresh(self) -> bool:
        return False  # the processes live on Slurm's nodes: nothing local to track

    def pids(self) -> list[int]:
        return []

    def reap(self) -> None:
        """Nothing local outlives the job; slurmd ends the job's processes itself."""

    can_signal = True

    def signal_ranks(self, sig: int) -> int:
        """Send `sig` to every process of the job's steps (torchrun ignores SIGUSR1: the ranks get
        it); 1 when Slurm took the request, 0 when it refused."""
        try:
            self.commands.run("scancel", f"--signal={int(sig)}", self.engine_job_id)
        except RuntimeError as exc:
            log.warning("Slurm job %s: could not send signal %s: %s", self.engine_job_id, sig, exc)
            return 0
        return 1

    def terminate(self, grace_seconds: float) -> None:
        """`scancel` (Slurm sends SIGTERM, then SIGKILL after its KillWait), and wait up to
        `grace_seconds` for Slurm to report the job ended."""
        if self.poll() is not None:
            return
        try:
            self.commands.run("scancel", self.engine_job_id)
        except RuntimeError as exc:
            log.error("Slurm job %s: scancel failed: %s", self.engine_job_id, exc)
        self._polled_at = 0.0
        try:
            self.wait(timeout=grace_seconds)
        except TimeoutError:
            log.error("Slurm job %s: still not ended %.0f s after scancel", self.engine_job_id, grace_seconds)


def cancel_earlier(commands: SlurmCommands, job_name: str, timeout: float = 60.0) -> None:
    """Cancel the Slurm jobs of this job's earlier attempts that are still queued or running, and
    wait until Slurm lists none: a worker that died leaves its Slurm job behind, and the next
    attempt must not train beside it in the same job directory."""
    earlier = commands.queued_ids(job_name)
    if not earlier:
        return
    log.warning("%s: cancelling Slurm job(s) %s of an earlier attempt", job_name, ", ".join(earlier))
    commands.run("scancel", f"--name={job_name}")
    deadline = time.monotonic() + timeout
    while commands.queued_ids(job_name):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Slurm job(s) {', '.join(earlier)} of an earlier attempt did not end")
        time.sleep(0.5)


def cancel_lost_job(commands: SlurmCommands, job_id: str) -> None:
    """`scancel` whatever Slurm still has of a job whose worker was lost (the reconciler requeues
    the job): its allocation is freed now rather than when the next attempt starts. Does not wait;
    the next attempt's `cancel_earlier` does."""
    try:
        commands.run("scancel", f"--name={slurm_job_name(job_id)}")
    except RuntimeError as exc:
        log.error("job %s: could not scancel its Slurm job of a lost worker: %s", job_id, exc)
