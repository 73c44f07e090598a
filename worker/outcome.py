"""How an attempt ended, decided from the runner's exit and its last progress events.

The runner's contract: exit 0 after `done` -> succeeded (also a non-zero exit after `done` when
the final checkpoint it names is complete: the training is over, only the interpreter's teardown
crashed, and a retry would redo nothing); a `stopped` event with reason "pause"
and exit 0 -> paused; an `error` event of kind "user" or a rank exit code 2 -> failed without
retry; anything else (a signal, an infra error, a hang, a lost worker) -> retry from the latest
complete checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from twinkle_core import checkpoint as ckpt
from worker.ingest import Observed

USER_ERROR_EXIT_CODE = 2
# torchrun's failure summary names each failed rank's exit code ("exitcode  : 2 (pid: 123)").
_RANK_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    USER_ERROR = "user_error"
    INFRA_ERROR = "infra_error"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class StopCause:
    """Why the supervisor itself ended the attempt, if it did."""

    outcome: Outcome
    message: str


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    message: str
    exit_code: int | None
    log_tail: str = ""

    @property
    def retryable(self) -> bool:
        return self.outcome == Outcome.INFRA_ERROR


def rank_exit_codes(log_text: str) -> list[int]:
    return [int(code) for code in _RANK_EXITCODE.findall(log_text)]


def classify(
    exit_code: int | None,
    seen: Observed,
    stop: StopCause | None,
    log_tail: str,
    ended: StopCause | None = None,
) -> AttemptResult:
    """`stop`: why the supervisor ended the attempt; `ended`: why the engine running it did, where
    the exit code cannot say (Slurm's time limit). A run that finished or paused before the engine
    ended it keeps that outcome."""
    if stop is not None:
        return AttemptResult(stop.outcome, stop.message, exit_code, log_tail)
    if exit_code == 0 and seen.done:
        return AttemptResult(Outcome.SUCCEEDED, "training finished", exit_code, log_tail)
    if seen.done and seen.final_checkpoint and ckpt.is_complete(seen.final_checkpoint):
        # Seen under load on CPU: a rank aborting in C++ static teardown ("terminate called
        # without an active exception") after its last collective. Everything the job promised
        # is on disk; say what happened instead of failing or retrying a finished job.
        return AttemptResult(
            Outcome.SUCCEEDED,
            f"training finished; torchrun then exited with {exit_code} during shutdown",
            exit_code,
            log_tail,
        )
    if exit_code == 0 and seen.stopped_reason == "pause":
        return AttemptResult(Outcome.PAUSED, "paused after a checkpoint", exit_code, log_tail)
    if ended is not None:
        return AttemptResult(ended.outcome, ended.message, exit_code, log_tail)
    if seen.error_kind == "user":
        return AttemptResult(Outcome.USER_ERROR, seen.error_message or "user error", exit_code, log_tail)
    rank_codes = rank_exit_codes(log_tail)
    if exit_code == USER_ERROR_EXIT_CODE or (
        rank_codes and all(c == USER_ERROR_EXIT_CODE for c in rank_codes)
    ):
        return AttemptResult(
            Outcome.USER_ERROR, "the runner rejected the job (exit code 2)", exit_code, log_tail
        )
    if exit_code is not None and exit_code < 0:
        why = f"torchrun killed by signal {-exit_code}"
    elif seen.error_kind:
        why = f"{seen.error_kind} error: {seen.error_message}"
    elif rank_codes:
        why = f"torchrun exited with {exit_code}; rank exit codes {rank_codes}"
    else:
        why = f"torchrun exited with {exit_code} without finishing"
    return AttemptResult(Outcome.INFRA_ERROR, why, exit_code, log_tail)


def read_tail(path: Path, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
