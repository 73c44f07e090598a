"""What Slurm says about a job (`scontrol show job -o`), and what that means for an attempt.

States as Slurm spells them. PENDING and RUNNING (and the short passages CONFIGURING,
COMPLETING, REQUEUED, SUSPENDED...) are "still going". A job submitted with `--requeue` that
hits NODE_FAIL or PREEMPTED is put back in the queue by Slurm: it reads PENDING again with a
higher restart count, and its batch script resumes from the newest checkpoint. Only where Slurm
does not requeue (a cluster with `JobRequeue=0`, a partition whose preemption cancels) do those
states end the attempt, as infra failures the worker retries from the checkpoint itself.

TIMEOUT is different: Slurm ended the job at its time limit, which the worker set from what was
left of the job's `timeout_seconds`. It ends the job as the supervisor's own timeout does (failed,
error kind "timeout", no retry): retrying would only run into the same limit again.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# How the supervisor's `classify` reads an ended attempt (see worker.outcome).
SUCCEEDED = "COMPLETED"
ENDED_BY_SIGNAL = {  # -> the exit code of a process killed by that signal: an infra failure
    "CANCELLED": -signal.SIGTERM,
    "NODE_FAIL": -signal.SIGKILL,
    "PREEMPTED": -signal.SIGTERM,
    "BOOT_FAIL": -signal.SIGKILL,
    "DEADLINE": -signal.SIGTERM,
    "OUT_OF_MEMORY": -signal.SIGKILL,
    "TIMEOUT": -signal.SIGTERM,
    "REVOKED": -signal.SIGTERM,
    "SPECIAL_EXIT": -signal.SIGTERM,
}
FAILED = "FAILED"
# The job's time limit (`--time`, from timeout_seconds): the job's own timeout, not an infra failure.
TIME_LIMIT = "TIMEOUT"
TERMINAL = frozenset({SUCCEEDED, FAILED, *ENDED_BY_SIGNAL})
# Shown while a requeued job waits for its next run (Slurm's own word for the passage).
REQUEUED = "REQUEUED"

_FIELD = re.compile(r"(?:^|\s)(JobId|JobState|Reason|Restarts|ExitCode|NodeList|TimeLimit)=(\S*)")


@dataclass(frozen=True)
class SlurmJobState:
    job_id: str
    state: str  # JobState, e.g. RUNNING
    reason: str = "None"
    restarts: int = 0
    exit_code: int = 0  # of the batch script
    exit_signal: int = 0  # the signal that ended it, if one did
    nodes: str = ""
    time_limit: str = ""  # as Slurm shows it, e.g. 00:05:00 or UNLIMITED

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def requeued(self) -> bool:
        """Back in the queue after a run was interrupted (node failure, preemption, requeue)."""
        return self.restarts > 0 and self.state == "PENDING"

    @property
    def shown_state(self) -> str:
        """The word the job row shows: Slurm's state, REQUEUED while a requeued job waits."""
        return REQUEUED if self.requeued else self.state

    @property
    def timed_out(self) -> bool:
        """Ended by its time limit: the supervisor ends the job as a timeout (see the module doc)."""
        return self.state == TIME_LIMIT

    def attempt_exit_code(self) -> int:
        """The exit code `worker.outcome.classify` reads for a terminal state."""
        assert self.terminal, self.state
        if self.state == SUCCEEDED:
            return 0
        if self.state in ENDED_BY_SIGNAL:
            return int(ENDED_BY_SIGNAL[self.state])
        if self.exit_signal:
            return -self.exit_signal
        return self.exit_code or 1  # FAILED: the script's code (2 = the runner's user error)


def parse_scontrol(text: str) -> SlurmJobState | None:
    """The job in `scontrol show job -o <id>` output (one line per job), or None when absent."""
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        if "JobId" not in fields or "JobState" not in fields:
            continue
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return SlurmJobState(
            job_id=fields["JobId"],
            state=fields["JobState"],
            reason=fields.get("Reason", "None"),
            restarts=int(fields.get("Restarts") or 0),
            exit_code=int(code or 0),
            exit_signal=int(sig or 0),
            nodes=fields.get("NodeList", ""),
            time_limit=fields.get("TimeLimit", ""),
        )
    return None
