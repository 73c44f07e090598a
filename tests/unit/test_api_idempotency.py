"""Idempotency keys on the creates a client retries besides `POST /v1/jobs`: clone and file upload.

A retried request with the same key and body answers with what the first one made (200,
`Idempotent-Replayed`), so a client retrying after a lost answer never makes a second job or file;
the same key with another body is a 409. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import httpx
from test_api_support import *  # noqa: F403
from test_api_support import Api

TEXT = b'{"text": "hello"}\n{"text": "world"}\n'


def test_clone_with_a_key_makes_one_job_however_often_it_is_retried(api: Api) -> None:
    source = api.submit()
    headers = {**api.admin, "Idempotency-Key": "clone-7"}
    body = {"name": "again", "spec": {"training": {"max_steps": 3}}}
    first = api.client.post(f"/v1/jobs/{source['id']}/clone", json=body, headers=headers)
    again = api.client.post(f"/v1/jobs/{source['id']}/clone", json=body, headers=headers)
    assert first.status_code == 201 and again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] != source["id"]
    assert api.dispatched == [source["id"], first.json()["id"]]
    listed = api.client.get("/v1/jobs", headers=api.admin).json()["data"]
    assert sorted(j["id"] for j in listed) == sorted([source["id"], first.json()["id"]])

    other = api.client.post(
        f"/v1/jobs/{source['id']}/clone", json={"spec": {"training": {"max_steps": 5}}}, headers=headers
    )
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.json()["error"]["param"] == "Idempotency-Key"


def test_a_clone_key_is_not_a_create_key_for_another_request(api: Api) -> None:
    a, b = api.submit(), api.submit()
    headers = {**api.admin, "Idempotency-Key": "k-1"}
    assert api.client.post(f"/v1/jobs/{a['id']}/clone", json={}, headers=headers).status_code == 201
    # The same overrides on another source is another request: refused, not silently replayed.
    reused = api.client.post(f"/v1/jobs/{b['id']}/clone", json={}, headers=headers)
    assert reused.status_code == 409
    # And a plain create with that key too.
    created = api.client.post("/v1/jobs", json={"spec": a["spec"]}, headers=headers)
    assert created.status_code == 409


def test_clone_without_a_key_still_makes_a_job_per_call(api: Api) -> None:
    source = api.submit()
    ids = {
        api.client.post(f"/v1/jobs/{source['id']}/clone", headers=api.admin).json()["id"] for _ in range(2)
    }
    assert len(ids) == 2


def _upload(api: Api, content: bytes, key: str | None, name: str = "train.jsonl") -> httpx.Response:
    headers = {**api.admin, **({"Idempotency-Key": key} if key else {})}
    return api.client.post("/v1/files", files={"file": (name, content)}, headers=headers)


def test_upload_with_a_key_stores_one_file(api: Api) -> None:
    first = _upload(api, TEXT, "up-1")
    again = _upload(api, TEXT, "up-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    listed = api.client.get("/v1/files", headers=api.admin).json()["data"]
    assert [f["id"] for f in listed] == [first.json()["id"]]
    # Only the one stored copy (plus nothing half-written) is on disk.
    stored = [p.name for p in api.settings.files_dir.iterdir()]
    assert stored == [f"{first.json()['id']}.jsonl"]

    changed = _upload(api, TEXT + b'{"text": "more"}\n', "up-1")
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    renamed = _upload(api, TEXT, "up-1", name="other.jsonl")
    assert renamed.status_code == 409
    assert len(list(api.settings.files_dir.iterdir())) == 1


def test_upload_without_a_key_stores_each_copy(api: Api) -> None:
    ids = {_upload(api, TEXT, None).json()["id"] for _ in range(2)}
    assert len(ids) == 2
