"""The Celery app. The broker only wakes workers; SQL holds the queue and every job's status.

- JSON serialisation only; no result backend (a task returning after a revoke would be recorded
  as SUCCESS anyway: status lives in the jobs table).
- `task_acks_late` + prefetch 1: a wake-up is acknowledged after the worker tried to claim.
  The task itself returns within a second (it starts a supervisor thread), so Redis'
  visibility timeout never sees a long-running message; and a redelivered or duplicated wake-up
  finds nothing queued to claim, so it can never launch a job twice.
- kombu's SQLAlchemy transport polls its table; setting `polling_interval` through
  `broker_transport_options` crashes kombu 5.7.0, so it is set on the transport class.
"""

from __future__ import annotations

import logging

from celery import Celery

from jobcore.broker import QUEUE, WAKE_TASK, install_embedded_broker
from jobcore.settings import Settings, get_settings

__all__ = ["QUEUE", "RECONCILE_TASK", "WAKE_TASK", "make_celery", "quiet_routine_task_logs"]

RECONCILE_TASK = "worker.reconcile"

install_embedded_broker()


# The loggers through which Celery reports each run of a task: beat sending it, the worker
# receiving it, and its end.
_TASK_RUN_LOGGERS = ("celery.beat", "celery.worker.strategy", "celery.app.trace")


class _RoutineReconcileFilter(logging.Filter):
    """Keeps only the first of Celery's INFO lines about the reconciler's scheduled runs, per
    logger and process: three lines every `stale_after_seconds / 2` buried a worker's log (and
    `twinkle-jobs up`'s terminal) in routine, while the reconciler logs a warning itself for
    whatever it does. The first run's lines stay, to show the schedule works (beat sent it, the
    worker ran it); a failed run is an ERROR and stays, and so do every other task's lines (a
    job's wake-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: set[str] = set()  # loggers that have shown their first routine line

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or RECONCILE_TASK not in record.getMessage():
            return True
        first = record.name not in self.shown
        self.shown.add(record.name)
        return first


_ROUTINE_FILTER = _RoutineReconcileFilter()


def quiet_routine_task_logs() -> None:
    for name in _TASK_RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _ROUTINE_FILTER not in logger.filters:
            logger.addFilter(_ROUTINE_FILTER)


def make_celery(settings: Settings) -> Celery:
    settings.ensure_dirs()
    app = Celery("twinkle_jobs", broker=settings.resolved_broker_url, include=["worker.tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        # Forever (None), not Celery's 100 tries: a worker started before its broker (an
        # orchestrator starts everything at once; Redis restarts) waits, logging each retry.
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        # Only matters for Redis: a message unacknowledged this long is redelivered. Wake-ups are
        # acknowledged within seconds, and a redelivery is harmless (nothing left to claim).
        broker_transport_options=(
            {"visibility_timeout": 3600} if settings.resolved_broker_url.startswith("redis") else {}
        ),
        beat_schedule={
            "reconcile": {
                "task": RECONCILE_TASK,
                "schedule": max(settings.stale_after_seconds / 2, 1.0),
                "options": {"expires": max(settings.stale_after_seconds / 2, 1.0)},
            }
        },
        # Beat keeps its schedule in memory, not in Celery's default shelve file: the only entry is
        # an interval that starts over harmlessly with each beat, while a file needs a writable
        # place of its own per beat (several beats on the shared data dir would write one file at
        # once) and one per process is never removed: every worker started with a beat left its
        # .dat/.dir/.bak behind in /tmp.
        beat_scheduler="celery.beat:Scheduler",
    )
    return app


app = make_celery(get_settings())
