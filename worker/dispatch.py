"""The one thing the server imports from the worker package: send a wake-up after a commit.

Import-light on purpose (Celery only; no torch, no worker internals). The message carries the
job id alone; it is a hint, the worker claims whatever queued job has the highest priority.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import Celery

from server.settings import Settings, get_settings
from worker import embedded_broker

log = logging.getLogger(__name__)

QUEUE = "twinkle"
WAKE_TASK = "worker.wake"
SQLA_POLL_SECONDS = 0.2


@lru_cache(maxsize=8)
def _producer(broker_url: str) -> Celery:
    if broker_url.startswith("sqla+"):
        embedded_broker.install(SQLA_POLL_SECONDS)  # the publisher may create the broker tables
    app = Celery("twinkle_jobs_producer", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
    return app


def send_wakeup(job_id: str, settings: Settings | None = None) -> None:
    """Wake a worker for `job_id`. Never raises: the job is already queued in SQL, and every
    worker polls the queue each heartbeat, so a broker outage only delays it."""
    settings = settings or get_settings()
    try:
        _producer(settings.resolved_broker_url).send_task(
            WAKE_TASK,
            args=[job_id],
            queue=QUEUE,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
        )
    except Exception as exc:
        log.warning("could not send the wake-up for %s (a worker poll will pick it up): %s", job_id, exc)
