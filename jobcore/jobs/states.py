"""The job state machine: every status change in the project goes through `transition`.

Keeping the table in one place means the API (409 on an action that does not apply), the worker
(claim, finish, retry) and the reconciler agree on what may happen, and terminal states never
change.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


S = JobStatus

TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States in which a worker owns the job and processes may exist.
ACTIVE: frozenset[JobStatus] = frozenset({S.STARTING, S.RUNNING, S.PAUSING, S.CANCELLING})
# States that count against a project's queue/concurrency limits and block deleting a used file.
LIVE: frozenset[JobStatus] = frozenset({S.QUEUED, S.RETRYING, *ACTIVE})

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.PAUSED}),
    S.STARTING: frozenset({S.RUNNING, S.CANCELLING, S.PAUSING, S.FAILED, S.RETRYING, S.SUCCEEDED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.RETRYING, S.CANCELLING, S.PAUSING}),
    S.PAUSING: frozenset({S.PAUSED, S.SUCCEEDED, S.FAILED, S.RETRYING, S.CANCELLING}),
    S.PAUSED: frozenset({S.QUEUED, S.CANCELLED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.RETRYING: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset({S.QUEUED}),  # only through an explicit user resume
    S.CANCELLED: frozenset({S.QUEUED}),  # only through an explicit user resume
}


class InvalidTransition(Exception):
    def __init__(self, current: str, target: str, action: str | None = None) -> None:
        self.current = current
        self.target = target
        self.action = action
        what = action or f"move to '{target}'"
        super().__init__(f"cannot {what}: the job is '{current}'")


def can_transition(current: str, target: str) -> bool:
    return JobStatus(target) in ALLOWED[JobStatus(current)]


def check_transition(current: str, target: str, action: str | None = None) -> JobStatus:
    """Return the target status, or raise InvalidTransition naming the current state."""
    if not can_transition(current, target):
        raise InvalidTransition(current, target, action)
    return JobStatus(target)
