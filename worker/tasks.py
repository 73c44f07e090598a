"""Celery tasks. They run in the worker process (thread pool) and only poke its agent."""

from __future__ import annotations

import logging

from celery import shared_task

from jobcore.settings import get_settings
from worker import reconciler
from worker.agent import current_agent

log = logging.getLogger(__name__)


@shared_task(name="worker.wake", ignore_result=True)
def wake(job_id: str) -> int:
    """Claim queued jobs while this worker has room (the id is a hint, not an order)."""
    agent = current_agent()
    if agent is None:
        log.warning("wake-up for %s reached a process without a worker agent; ignored", job_id)
        return 0
    return agent.claim_available(hint=job_id)


@shared_task(name="worker.export", ignore_result=True)
def export(export_id: str) -> None:
    """Make a pending export soon (the id is a hint: the exporter takes pending ones in order)."""
    agent = current_agent()
    if agent is None:
        log.warning("export request %s reached a process without a worker agent; ignored", export_id)
        return
    agent.exporter.poke()


@shared_task(name="worker.reconcile", ignore_result=True)
def reconcile() -> list[str]:
    """Periodic (beat): take back the jobs of lost workers."""
    agent = current_agent()
    settings = agent.settings if agent is not None else get_settings()
    return reconciler.reconcile(settings, me=agent.worker_id if agent else None)
