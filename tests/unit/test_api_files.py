"""Files API: validated uploads, size limit, listing, download, delete refused while in use."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

CHAT = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'


def upload(api: Api, name: str, content: bytes, headers: dict[str, str] | None = None, **form: str) -> Any:
    return api.client.post(
        "/v1/files", files={"file": (name, content)}, data=form, headers=headers or api.admin
    )


def parquet_bytes(rows: list[dict[str, str]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


@pytest.mark.parametrize(
    ("name", "content", "fmt", "rows"),
    [
        ("chat.jsonl", CHAT * 3, "jsonl", 3),
        ("text.json", b'[{"text": "a"}, {"text": "b"}]', "json", 2),
        ("pc.csv", b"prompt,completion\nq,a\nq2,a2\n", "csv", 2),
        ("t.parquet", parquet_bytes([{"text": "x"}, {"text": "y"}, {"text": "z"}]), "parquet", 3),
    ],
)
def test_upload_valid_datasets(api: Api, name: str, content: bytes, fmt: str, rows: int) -> None:
    response = upload(api, name, content)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["object"] == "file" and body["format"] == fmt and body["rows"] == rows
    assert body["bytes"] == len(content) and body["filename"] == name and body["purpose"] == "fine-tune"
    assert api.client.get(f"/v1/files/{body['id']}", headers=api.admin).json() == body
    download = api.client.get(f"/v1/files/{body['id']}/content", headers=api.admin)
    assert download.status_code == 200 and download.content == content


def test_a_bad_line_is_named_and_nothing_is_kept(api: Api) -> None:
    content = b'{"text": "ok"}\n{"text": "ok"}\n{"text": broken\n'
    response = upload(api, "bad.jsonl", content)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_file" and error["param"] == "file"
    assert error["message"].startswith("bad.jsonl, line 3:")
    assert api.client.get("/v1/files", headers=api.admin).json()["data"] == []
    assert [p.name for p in api.settings.files_dir.iterdir()] == []  # no half-written upload left


@pytest.mark.parametrize(
    ("name", "content", "param"),
    [
        ("data.exe", b"MZ", "file"),
        ("empty.jsonl", b"", "file"),
        ("wrong.jsonl", b'{"nope": 1}\n', "file"),
    ],
)
def test_unusable_uploads_are_422(api: Api, name: str, content: bytes, param: str) -> None:
    response = upload(api, name, content)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param


def test_purpose_must_be_fine_tune(api: Api) -> None:
    response = upload(api, "a.jsonl", CHAT, purpose="assistants")
    assert response.status_code == 422 and response.json()["error"]["param"] == "purpose"


def test_uploads_over_the_size_limit_are_413(api: Api) -> None:
    big = b'{"text": "' + b"x" * (api.settings.max_upload_bytes + 10) + b'"}\n'
    response = upload(api, "big.jsonl", big)
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    assert [p.name for p in api.settings.files_dir.iterdir()] == []


def test_a_path_in_the_filename_is_reduced_to_its_name(api: Api) -> None:
    response = upload(api, "../../etc/evil.jsonl", CHAT)
    assert response.status_code == 201 and response.json()["filename"] == "evil.jsonl"
    stored = list(api.settings.files_dir.iterdir())
    assert len(stored) == 1 and stored[0].parent == api.settings.files_dir


def test_list_files_pages_newest_first(api: Api) -> None:
    ids = [upload(api, f"f{i}.jsonl", CHAT).json()["id"] for i in range(3)]
    page = api.client.get("/v1/files?limit=2", headers=api.admin).json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = api.client.get(f"/v1/files?after={page['last_id']}", headers=api.admin).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and not rest["has_more"]


def test_delete_is_refused_while_a_live_job_uses_the_file(api: Api) -> None:
    file_id = upload(api, "train.jsonl", CHAT).json()["id"]
    body = spec_body()
    body["spec"]["data"]["train_file"] = file_id
    body["spec"]["training"] = {"batch_size": 1}
    job = api.client.post("/v1/jobs", json=body, headers=api.admin).json()
    assert job["status"] == "queued"
    refused = api.client.delete(f"/v1/files/{file_id}", headers=api.admin)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "file_in_use"
    assert job["id"] in refused.json()["error"]["message"]
    # Paused, it reads the file again when it resumes.
    paused = api.client.post(f"/v1/jobs/{job['id']}/pause", headers=api.admin).json()
    assert paused["status"] == "paused"
    refused = api.client.delete(f"/v1/files/{file_id}", headers=api.admin)
    assert refused.status_code == 409 and f"{job['id']} (paused)" in refused.json()["error"]["message"]
    api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=api.admin)
    stored = Path(api.settings.files_dir)
    assert api.client.delete(f"/v1/files/{file_id}", headers=api.admin).json()["deleted"] is True
    assert list(stored.iterdir()) == []
    assert api.client.get(f"/v1/files/{file_id}", headers=api.admin).status_code == 404


def test_files_are_invisible_to_other_projects(api: Api) -> None:
    file_id = upload(api, "train.jsonl", CHAT, headers=api.token("a")).json()["id"]
    other = api.token("b")
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        assert api.client.get(path, headers=other).status_code == 404
    assert api.client.delete(f"/v1/files/{file_id}", headers=other).status_code == 404
    assert api.client.get("/v1/files", headers=other).json()["data"] == []


def test_a_failed_request_leaves_no_stored_file(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.files import router

    def broken_present(_: object) -> None:
        raise RuntimeError("failure after the file was stored")

    monkeypatch.setattr(router.service, "present", broken_present)
    with pytest.raises(RuntimeError):
        upload(api, "train.jsonl", CHAT)
    assert list(api.settings.files_dir.iterdir()) == []
    with api.session() as session:
        from jobcore.db.models import File

        assert session.query(File).count() == 0
