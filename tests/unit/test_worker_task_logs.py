"""A worker's log keeps what happened and loses the reconciler's routine: of Celery's own lines for
the scheduled reconcile runs only the first run's stay (the schedule works), every other task's
and every failure's stay. The lines are made with Celery's own loggers and message formats."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery.app import trace

from worker import celery_app
from worker.celery_app import RECONCILE_TASK, WAKE_TASK, quiet_routine_task_logs


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture()
def kept() -> Iterator[Kept]:
    handler = Kept()
    celery = logging.getLogger("celery")
    old_level = celery.level
    celery.addHandler(handler)
    celery.setLevel(logging.INFO)
    celery_app._ROUTINE_FILTER.shown.clear()  # a fresh process's filter
    quiet_routine_task_logs()
    quiet_routine_task_logs()  # a second call (the worker restarted in-process) adds nothing
    try:
        yield handler
    finally:
        celery.removeHandler(handler)
        celery.setLevel(old_level)


def log_a_run(task: str) -> None:
    run = {"id": "7f1c", "name": task, "runtime": 0.007, "return_value": []}
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", task.split(".")[-1], task)
    logging.getLogger("celery.worker.strategy").info(trace.LOG_RECEIVED, run)
    logging.getLogger("celery.app.trace").info(trace.LOG_SUCCESS, run)


def test_of_the_reconcilers_scheduled_runs_only_the_first_leaves_lines(kept: Kept) -> None:
    for _ in range(5):
        log_a_run(RECONCILE_TASK)
    assert len(kept.messages) == 3  # beat sent it, the worker received it, it succeeded
    assert kept.messages[0] == "Scheduler: Sending due task reconcile (worker.reconcile)"


def test_other_tasks_and_failures_are_still_logged(kept: Kept) -> None:
    log_a_run(RECONCILE_TASK)
    kept.messages.clear()
    log_a_run(WAKE_TASK)
    log_a_run(WAKE_TASK)
    assert len(kept.messages) == 6 and all(WAKE_TASK in m for m in kept.messages)
    failure = {
        "id": "7f1d",
        "name": RECONCILE_TASK,
        "description": "raised unexpected",
        "exc": "OperationalError('database is locked')",
    }
    logging.getLogger("celery.app.trace").error(trace.LOG_FAILURE, failure)
    assert RECONCILE_TASK in kept.messages[-1] and "database is locked" in kept.messages[-1]


def test_the_filter_is_installed_once_per_logger(kept: Kept) -> None:
    for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace"):
        assert len(logging.getLogger(name).filters) == 1, name
