"""The broker contract between server and worker: the queue, the wake-up task, and sending it.

The broker only wakes workers; SQL holds the queue and every job's status. The server sends a
wake-up (the job id alone) after the commit; a worker's Celery app consumes `QUEUE` and runs
`WAKE_TASK`, which claims whatever queued job has the highest priority.

The embedded broker is kombu's SQLAlchemy transport, made safe for several processes here:
kombu creates its tables and a queue's row on first use behind a process-local lock only; the
server (publishing a wake-up) and a worker (starting to consume) can both do it at the same
moment, and the loser's "table already exists" or IntegrityError kills the worker at start-up.
In both cases the loser only needs what the winner created.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from celery import Celery
from kombu.transport import sqlalchemy as kombu_sqlalchemy
from sqlalchemy.exc import IntegrityError, OperationalError

from jobcore.settings import Settings, get_settings

log = logging.getLogger(__name__)

QUEUE = "twinkle"
WAKE_TASK = "worker.wake"
# Export a checkpoint as a Hugging Face model (the export id alone; the exports table says what).
EXPORT_TASK = "worker.export"
# kombu's SQLAlchemy transport polls its table this often (about 0.2 s of dispatch latency).
SQLA_POLL_SECONDS = 0.2
# The longest a consumer on the embedded broker waits for a message before its loop looks at a
# shutdown request again (Celery's loop for polled transports asks for 2 s at a time).
SQLA_DRAIN_SLICE_SECONDS = 0.25


# kombu creates two tables (queue, message). Each "already exists" means one more of them was
# created by another process, so this many tries always get past them all.
OPEN_TRIES = 3


class RaceSafeChannel(kombu_sqlalchemy.Channel):
    def _open(self) -> Any:
        for attempt in range(1, OPEN_TRIES + 1):
            try:
                return super()._open()
            except OperationalError as exc:
                # Another process created a table between create_all's check and its CREATE; a
                # second race can follow on the other table (seen in CI), hence the loop.
                if "already exists" not in str(exc) or attempt == OPEN_TRIES:
                    raise
        raise AssertionError("unreachable")

    def _get_or_create(self, queue: str) -> Any:
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()


def _drain_in_slices(self: kombu_sqlalchemy.Transport, connection: Any, timeout: float | None = None) -> Any:
    """kombu's polling `drain_events`, waiting at most `SQLA_DRAIN_SLICE_SECONDS` per call.

    A worker's SIGTERM only sets a flag that Celery's loop reads between two calls; with the 2 s
    it asks for, every stop of a worker on the embedded broker (each Ctrl-C of `up`, each test)
    waited out the rest of them."""
    if timeout is not None:
        timeout = min(timeout, SQLA_DRAIN_SLICE_SECONDS)
    return _KOMBU_DRAIN_EVENTS(self, connection, timeout=timeout)


_KOMBU_DRAIN_EVENTS = kombu_sqlalchemy.Transport.drain_events


def install_embedded_broker(poll_seconds: float = SQLA_POLL_SECONDS) -> None:
    transport = kombu_sqlalchemy.Transport
    transport.Channel = RaceSafeChannel
    # Set on the class: passing polling_interval through broker_transport_options crashes kombu 5.7.0.
    transport.polling_interval = poll_seconds
    transport.drain_events = _drain_in_slices  # type: ignore[method-assign,assignment]


@lru_cache(maxsize=8)
def _producer(broker_url: str) -> Celery:
    if broker_url.startswith("sqla+"):
        install_embedded_broker()  # the publisher may create the broker tables
    app = Celery("twinkle_jobs_producer", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
    return app


def send_wakeup(job_id: str, settings: Settings | None = None) -> None:
    """Wake a worker for `job_id`. Never raises: the job is already queued in SQL, and every
    worker polls the queue each heartbeat, so a broker outage only delays it."""
    _send(WAKE_TASK, job_id, settings)


def send_export(export_id: str, settings: Settings | None = None) -> None:
    """Ask a worker to make export `export_id`. Never raises, like the wake-up: the export is
    already `pending` in SQL, and workers pick up pending exports at their heartbeat."""
    _send(EXPORT_TASK, export_id, settings)


def _send(task: str, row_id: str, settings: Settings | None) -> None:
    settings = settings or get_settings()
    try:
        _producer(settings.resolved_broker_url).send_task(
            task,
            args=[row_id],
            queue=QUEUE,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
        )
    except Exception as exc:
        log.warning("could not send %s for %s (a worker poll will pick it up): %s", task, row_id, exc)
