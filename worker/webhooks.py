"""Webhooks: a job that reaches a terminal state POSTs its job object to its `webhook_url`.

Each delivery is a row (the outbox), created in the same transaction as the terminal
transition, so a notification is never lost to a crash between the two. Deliveries are signed
with HMAC-SHA256 over `"<timestamp>.<body>"` with the project's `webhook_secret`; the header
`Twinkle-Signature: t=<timestamp>,v1=<hex digest>` lets a receiver check both the signature and
the age (replay protection). Failures retry with exponential back-off; every attempt updates the
row (attempts, response status, last error).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from jobcore.db.models import Job, Project, WebhookDelivery, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.states import TERMINAL

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Twinkle-Signature"
MAX_ATTEMPTS = 6
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 300.0
# While one worker is delivering a row, others see it as not yet due for this long.
IN_FLIGHT_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 10.0
# Terminal jobs older than this are not swept for missing deliveries.
SWEEP_WINDOW = timedelta(days=1)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, tolerance_seconds: float = 300.0) -> bool:
    """Receiver-side check, used by tests and documented for users."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance_seconds:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), header)


def job_object(job: Job) -> dict[str, Any]:
    def iso(value: Any) -> Any:
        return value.isoformat() if value is not None else None

    return {
        "object": "job",
        "id": job.id,
        "project_id": job.project_id,
        "name": job.name,
        "status": job.status,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_retries": job.max_retries,
        "failed_attempts": job.failed_attempts,
        "error": job.error,
        "step": job.step,
        "total_steps": job.total_steps,
        "loss": job.loss,
        "metadata": job.metadata_,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
    }


def enqueue_terminal_webhook(session: Session, job: Job) -> None:
    if not job.webhook_url or job.status not in {s.value for s in TERMINAL}:
        return
    event = f"job.{job.status}"
    exists = session.scalar(
        select(WebhookDelivery.id).where(
            WebhookDelivery.job_id == job.id,
            WebhookDelivery.event == event,
            WebhookDelivery.job_attempt == job.attempt,
        )
    )
    if exists is None:
        session.add(
            WebhookDelivery(
                job_id=job.id,
                event=event,
                job_attempt=job.attempt,
                url=job.webhook_url,
                payload={"type": event, "data": job_object(job)},
            )
        )


def sweep_missing_deliveries(session: Session) -> int:
    """Create deliveries for terminal jobs that have none (e.g. a queued job cancelled by the API)."""
    missing = session.scalars(
        select(Job)
        .outerjoin(
            WebhookDelivery,
            and_(WebhookDelivery.job_id == Job.id, WebhookDelivery.job_attempt == Job.attempt),
        )
        .where(
            Job.webhook_url.is_not(None),
            Job.status.in_([s.value for s in TERMINAL]),
            Job.finished_at >= utcnow() - SWEEP_WINDOW,
            WebhookDelivery.id.is_(None),
        )
        .limit(100)
    ).all()
    for job in missing:
        enqueue_terminal_webhook(session, job)
    return len(missing)


def deliver_due(database_url: str, client: httpx.Client | None = None, limit: int = 20) -> int:
    """Attempt every due delivery once; returns how many were attempted.

    The HTTP client is built only when something is due: building one loads the CA bundle
    (~10 ms of CPU), which every idle pass of every worker paid before, a few times a minute."""
    due = _claim_due(database_url, limit)
    if not due:
        return 0
    own_client = client is None
    http = client or httpx.Client(timeout=REQUEST_TIMEOUT_SECONDS)
    attempted = 0
    try:
        for delivery_id in due:
            _attempt(database_url, delivery_id, http)
            attempted += 1
    finally:
        if own_client:
            http.close()
    return attempted


def _claim_due(database_url: str, limit: int) -> list[str]:
    claimed = []
    with session_scope(database_url) as session:
        now = utcnow()
        due = session.scalars(
            select(WebhookDelivery.id)
            .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        ).all()
        for delivery_id in due:
            won = session.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == delivery_id,
                    WebhookDelivery.status == "pending",
                    WebhookDelivery.next_attempt_at <= now,
                )
                .values(next_attempt_at=now + timedelta(seconds=IN_FLIGHT_SECONDS))
                .execution_options(synchronize_session=False)
            )
            if won.rowcount == 1:  # type: ignore[attr-defined]
                claimed.append(delivery_id)
    return claimed


def _attempt(database_url: str, delivery_id: str, http: httpx.Client) -> None:
    with session_scope(database_url) as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        if delivery is None:
            return
        secret = session.scalar(
            select(Project.webhook_secret)
            .join(Job, Job.project_id == Project.id)
            .where(Job.id == delivery.job_id)
        )
        url, payload = delivery.url, delivery.payload
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret or "", timestamp, body),
        "Twinkle-Timestamp": str(timestamp),
        "Twinkle-Delivery-Id": delivery_id,
        "Twinkle-Event": str(payload.get("type")),
    }
    status_code: int | None = None
    error: str | None = None
    try:
        response = http.post(url, content=body, headers=headers)
        status_code = response.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    with session_scope(database_url) as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        if delivery is None:
            return
        delivery.attempts += 1
        delivery.response_status = status_code
        delivery.last_error = error
        now = utcnow()
        if error is None:
            delivery.status, delivery.delivered_at = "succeeded", now
        elif delivery.attempts >= MAX_ATTEMPTS:
            delivery.status = "failed"
            log.warning("webhook %s for job %s failed for good: %s", delivery_id, delivery.job_id, error)
        else:
            delay = min(BACKOFF_BASE_SECONDS**delivery.attempts, BACKOFF_MAX_SECONDS)
            delivery.next_attempt_at = now + timedelta(seconds=delay)
