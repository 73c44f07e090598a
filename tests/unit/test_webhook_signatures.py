"""A webhook receiver written from docs/webhooks.md alone verifies real deliveries.

The receiver is the doc's Python block, executed as printed. The secret comes from the admin
API (creation, then rotation), the deliveries from the worker's own outbox and signing code,
sent over real HTTP to the receiver; a tampered body is refused.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import WebhookDelivery, utcnow
from jobcore.db.session import session_scope
from worker import webhooks

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


def doc_receiver() -> dict[str, Any]:
    """The namespace of the doc's receiver block, run as a module that is not `__main__`."""
    section = DOC.read_text().split("## A receiver", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "docs/webhooks.md lost its receiver example"
    namespace: dict[str, Any] = {"__name__": "webhook_receiver"}
    exec(compile(block.group(1), str(DOC), "exec"), namespace)  # our own doc, run as printed
    return namespace


@pytest.fixture()
def receiver() -> Iterator[tuple[str, dict[str, Any]]]:
    namespace = doc_receiver()

    class Quiet(namespace["Receiver"]):  # type: ignore[misc, name-defined]
        def log_message(self, *args: Any) -> None:  # the doc's handler as is, minus access logs
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", namespace
    server.shutdown()
    server.server_close()


def finish_job(api: Api, token: dict[str, str]) -> str:
    """A job of the project ends; the worker's sweep puts its delivery in the outbox."""
    job = api.submit(token)
    api.force_status(job["id"], "succeeded", finished_at=utcnow())
    with session_scope(api.settings.resolved_database_url) as session:
        assert webhooks.sweep_missing_deliveries(session) == 1
    return str(job["id"])


def delivery_of(api: Api, job_id: str) -> WebhookDelivery:
    with session_scope(api.settings.resolved_database_url) as session:
        return session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)).one()


def test_the_documented_receiver_verifies_real_deliveries(
    api: Api, receiver: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, doc = receiver
    monkeypatch.setattr(webhooks, "BACKOFF_BASE_SECONDS", 0.0)  # a refused delivery is due again at once
    created = api.client.post("/v1/projects", json={"name": "hooks", "webhook_url": url}, headers=api.admin)
    assert created.status_code == 201, created.text
    monkeypatch.setenv("TWINKLE_WEBHOOK_SECRET", created.json()["webhook_secret"])
    token = api.token("hooks")
    database = api.settings.resolved_database_url

    # 1. A delivery signed with the secret from creation is accepted (204 from the doc's handler).
    first = finish_job(api, token)
    assert webhooks.deliver_due(database) == 1
    assert (delivery_of(api, first).status, delivery_of(api, first).response_status) == ("succeeded", 204)

    # 2. After a rotation the old secret no longer verifies; the new one, from the answer, does.
    rotated = api.client.post("/v1/projects/hooks/rotate-webhook-secret", headers=api.admin)
    second = finish_job(api, token)
    assert webhooks.deliver_due(database) == 1
    refused = delivery_of(api, second)
    assert (refused.status, refused.response_status) == ("pending", 401)
    monkeypatch.setenv("TWINKLE_WEBHOOK_SECRET", rotated.json()["webhook_secret"])
    assert webhooks.deliver_due(database) == 1  # the retry, signed anew
    assert (delivery_of(api, second).status, delivery_of(api, second).response_status) == ("succeeded", 204)

    # 3. A captured delivery verifies as sent, and fails once its body is changed.
    captured: list[httpx.Request] = []
    third = finish_job(api, token)
    recorder = httpx.Client(
        transport=httpx.MockTransport(lambda r: captured.append(r) or httpx.Response(200))
    )
    assert webhooks.deliver_due(database, client=recorder) == 1
    request = captured[0]
    body, signature = request.content, request.headers["Twinkle-Signature"]
    assert third.encode() in body
    secret = rotated.json()["webhook_secret"]
    assert doc["verify_signature"](secret, signature, body) is True
    tampered = body.replace(b'"succeeded"', b'"failed"')
    assert tampered != body and doc["verify_signature"](secret, signature, tampered) is False
    assert doc["verify_signature"](created.json()["webhook_secret"], signature, body) is False
    stale = int(request.headers["Twinkle-Timestamp"]) + doc["TOLERANCE_SECONDS"] + 1
    assert doc["verify_signature"](secret, signature, body, now=stale) is False  # a replay, later
    with httpx.Client() as http:
        headers = {"Twinkle-Signature": signature, "Twinkle-Delivery-Id": "whd-replayed"}
        assert http.post(url, content=tampered, headers=headers).status_code == 401
        assert http.post(url, content=body, headers=headers).status_code == 204
