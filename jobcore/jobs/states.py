"""The job state machine and the user's actions: the one vocabulary of job statuses.

Every status change in the project goes through `jobcore.jobs.lifecycle.transition`, which
checks it against ALLOWED, so the API, the worker (claim, finish, retry) and the reconciler agree
on what may happen. ACTIONS says which user action applies in which status and where it moves the
job; the API answers 409 for any other, and publishes each job's `actions` and `terminal` from
here, so the client, the CLI and the dashboard read them instead of keeping copies.

A terminal status (succeeded, failed, cancelled) ends a run: no worker owns the job and nothing
moves it on its own. It is not always final: a user's resume of a failed or cancelled job queues
it again, a new attempt of the same job (FAILED/CANCELLED -> QUEUED happens only that way).
A succeeded job never changes.
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

# States in which a run has ended. Only a user's resume (failed, cancelled) leaves them.
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


class JobAction(StrEnum):
    """What a user may ask of a job: `POST /v1/jobs/{id}/{action}` (delete: `DELETE /v1/jobs/{id}`)."""

    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    CLONE = "clone"
    DELETE = "delete"


A = JobAction

# The statuses each action applies in, and the status it moves the job to from there (None: the
# job's status stays: clone makes another job, delete removes this one). A job whose processes
# may exist (ACTIVE) is asked to stop through the -ing status the worker acts on; any other
# changes at once. The API offers exactly these (`actions_for`) and answers 409 otherwise.
ACTIONS: dict[JobAction, dict[JobStatus, JobStatus | None]] = {
    A.PAUSE: {S.QUEUED: S.PAUSED, S.STARTING: S.PAUSING, S.RUNNING: S.PAUSING},
    # A resume of a failed or cancelled job starts a new attempt of it; of a paused one, goes on.
    A.RESUME: {S.PAUSED: S.QUEUED, S.FAILED: S.QUEUED, S.CANCELLED: S.QUEUED},
    A.CANCEL: {
        S.QUEUED: S.CANCELLED,
        S.PAUSED: S.CANCELLED,
        S.RETRYING: S.CANCELLED,
        S.STARTING: S.CANCELLING,
        S.RUNNING: S.CANCELLING,
        S.PAUSING: S.CANCELLING,
    },
    A.CLONE: dict.fromkeys(JobStatus),
    A.DELETE: dict.fromkeys(s for s in JobStatus if s in TERMINAL),  # only a run that ended, with its files
}

# Statuses in which an action was already asked for: asking again returns the job as it is (a
# retried request does no harm), but the action is not offered.
ALREADY_REQUESTED: dict[JobAction, frozenset[JobStatus]] = {
    A.CANCEL: frozenset({S.CANCELLING}),
    A.PAUSE: frozenset({S.PAUSING, S.PAUSED}),
}


def actions_for(status: str) -> list[str]:
    """The actions a job in `status` offers, in ACTIONS' order (the order buttons show them)."""
    current = JobStatus(status)  # once, not once per action: a list page asks for every job
    return [action.value for action, applies in ACTIONS.items() if current in applies]


def already_requested(status: str, action: JobAction) -> bool:
    return JobStatus(status) in ALREADY_REQUESTED.get(action, frozenset())


def check_action(status: str, action: JobAction) -> JobStatus | None:
    """The status `action` moves a job in `status` to (None: unchanged), or InvalidTransition."""
    applies = ACTIONS.get(action, {})
    current = JobStatus(status)
    if current not in applies:
        raise InvalidTransition(current.value, "", action.value)
    return applies[current]
