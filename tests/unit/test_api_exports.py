"""Exports API: what `merge` means per job, idempotency, the 404/409/422 rules, tenancy, and the
tar download of a finished export. The worker's part is simulated by writing its row and folder;
tests/integration/test_exports.py runs the real one."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import Export, utcnow

LORA_SPEC = {
    "model": {"model_id": "org/tiny-llama"},
    "data": {"train_file": "hf://datasets/org/d"},
    "adapter": {},
}


def export_url(job_id: str, step: int | str) -> str:
    return f"/v1/jobs/{job_id}/checkpoints/{step}/export"


def lora_job(api: Api, headers: dict[str, str] | None = None, **model: Any) -> dict[str, Any]:
    spec = {**LORA_SPEC, "model": {**LORA_SPEC["model"], **model}}
    response = api.client.post("/v1/jobs", json=spec_body(spec=spec), headers=headers or api.admin)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def dispatched(api: Api) -> list[str]:
    sent: list[str] = api.app.state.export_dispatch.sent
    return sent


class Recorder:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, export_id: str) -> None:
        self.sent.append(export_id)


def with_recorder(api: Api) -> Api:
    api.app.state.export_dispatch = Recorder()
    return api


def test_a_lora_checkpoint_exports_merged_by_default_and_once_per_kind(api: Api) -> None:
    with_recorder(api)
    job = lora_job(api)
    api.add_checkpoint(job["id"], 10)
    first = api.client.post(export_url(job["id"], 10), headers=api.admin)
    assert first.status_code == 202, first.text
    export = first.json()
    assert export["object"] == "checkpoint.export" and export["id"].startswith("export-")
    assert (export["kind"], export["merged"], export["status"], export["step"]) == (
        "merged",
        True,
        "pending",
        10,
    )
    assert dispatched(api) == [export["id"]]  # sent after the commit
    again = api.client.post(export_url(job["id"], 10), json={"merge": True}, headers=api.admin)
    assert again.status_code == 200 and again.json()["id"] == export["id"]
    alone = api.client.post(export_url(job["id"], 10), json={"merge": False}, headers=api.admin)
    assert alone.status_code == 202 and alone.json()["kind"] == "adapter" and not alone.json()["merged"]
    assert dispatched(api) == [export["id"], alone.json()["id"]]
    got = api.client.get(f"/v1/exports/{export['id']}", headers=api.admin).json()
    assert got == export
    page = api.client.get(f"/v1/jobs/{job['id']}/exports?limit=1", headers=api.admin).json()
    assert [e["id"] for e in page["data"]] == [alone.json()["id"]] and page["has_more"]
    rest = api.client.get(f"/v1/jobs/{job['id']}/exports?after={page['last_id']}", headers=api.admin).json()
    assert [e["id"] for e in rest["data"]] == [export["id"]] and not rest["has_more"]


def test_a_full_job_exports_its_model_and_refuses_an_adapter_alone(api: Api) -> None:
    with_recorder(api)
    job = api.submit()
    api.add_checkpoint(job["id"], 4)
    export = api.client.post(export_url(job["id"], 4), json={"merge": True}, headers=api.admin)
    assert export.status_code == 202 and export.json()["kind"] == "full"
    refused = error_of(
        api.client.post(export_url(job["id"], 4), json={"merge": False}, headers=api.admin), 422
    )
    assert refused["param"] == "merge" and "no adapter" in refused["message"]
    for body in ({"merge": "yes"}, {"merge": 1}, {"merged": True}):
        bad = error_of(api.client.post(export_url(job["id"], 4), json=body, headers=api.admin), 422)
        assert bad["param"] is not None and "merge" in bad["param"], body
    assert dispatched(api) == [export.json()["id"]]


def test_a_lora_job_without_base_weights_exports_only_its_adapter(api: Api) -> None:
    with_recorder(api)
    spec = {**LORA_SPEC, "model": {"config": {"model_type": "llama", "hidden_size": 64}}}
    job = api.client.post("/v1/jobs", json=spec_body(spec=spec), headers=api.admin).json()
    api.add_checkpoint(job["id"], 2)
    refused = error_of(api.client.post(export_url(job["id"], 2), headers=api.admin), 422)
    assert refused["param"] == "merge" and "merge=false" in refused["message"]
    alone = api.client.post(export_url(job["id"], 2), json={"merge": False}, headers=api.admin)
    assert alone.status_code == 202 and alone.json()["kind"] == "adapter"


def test_unknown_jobs_steps_and_exports_are_404_and_an_incomplete_checkpoint_409(api: Api) -> None:
    with_recorder(api)
    job = lora_job(api, headers=api.token("a"))
    ckpt = api.add_checkpoint(job["id"], 3)
    assert error_of(api.client.post(export_url("job-nope", 3), headers=api.admin), 404)["param"] == "job_id"
    assert error_of(api.client.post(export_url(job["id"], 4), headers=api.token("a")), 404)["param"] == "step"
    assert (
        error_of(api.client.post(export_url(job["id"], "three"), headers=api.token("a")), 422)["param"]
        == "step"
    )
    for step in (-1, 10**23):  # out of range either way: named, not "cannot be stored"
        error = error_of(api.client.post(export_url(job["id"], step), headers=api.token("a")), 422)
        assert error["param"] == "step", error
    # Another project's job, and its export, are as good as absent.
    assert (
        error_of(api.client.post(export_url(job["id"], 3), headers=api.token("b")), 404)["param"] == "job_id"
    )
    mine = api.client.post(export_url(job["id"], 3), headers=api.token("a")).json()
    assert api.client.get(f"/v1/exports/{mine['id']}", headers=api.token("b")).status_code == 404
    assert api.client.get(f"/v1/exports/{mine['id']}/content", headers=api.token("b")).status_code == 404
    assert api.client.get(f"/v1/jobs/{job['id']}/exports", headers=api.token("b")).status_code == 404
    assert error_of(api.client.get("/v1/exports/export-nope", headers=api.admin), 404)["param"] == "export_id"
    (Path(ckpt["path"]) / "COMPLETE").unlink()
    incomplete = error_of(
        api.client.post(export_url(job["id"], 3), json={"merge": False}, headers=api.token("a")), 409
    )
    assert incomplete["code"] == "checkpoint_incomplete" and incomplete["param"] == "step"
    shutil.rmtree(ckpt["path"])
    gone = error_of(
        api.client.post(export_url(job["id"], 3), json={"merge": False}, headers=api.token("a")), 404
    )
    assert "no longer on disk" in gone["message"]
    assert dispatched(api) == [mine["id"]]  # no refused request wrote or sent anything
    with api.session() as session:
        assert session.query(Export).count() == 1


def finish_as_worker(api: Api, export_id: str, job_id: str, *, failed: str | None = None) -> None:
    """What the worker leaves behind: the folder under the job dir and the row's outcome."""
    folder = api.settings.jobs_dir / job_id / "exports" / export_id
    with api.session() as session, session.begin():
        export = session.get(Export, export_id)
        assert export is not None
        export.status, export.finished_at = ("failed" if failed else "succeeded"), utcnow()
        if failed:
            export.error = failed
            return
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
        (folder / "model.safetensors").write_bytes(b"\x01\x02" * 5000)
        export.path, export.size_bytes = str(folder), 10_000 + len('{"model_type": "llama"}')


def test_content_is_a_tar_of_the_folder_once_succeeded(api: Api) -> None:
    with_recorder(api)
    job = lora_job(api)
    api.add_checkpoint(job["id"], 6)
    export = api.client.post(export_url(job["id"], 6), headers=api.admin).json()
    url = f"/v1/exports/{export['id']}/content"
    early = error_of(api.client.get(url, headers=api.admin), 409)
    assert early["code"] == "export_not_ready" and "pending" in early["message"]
    finish_as_worker(api, export["id"], job["id"])
    response = api.client.get(url, headers=api.admin)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    root = f"{job['id']}-step-6-merged"
    assert f"{root}.tar" in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        assert sorted(tar.getnames()) == [f"{root}/config.json", f"{root}/model.safetensors"]
    partial = api.client.get(url, headers={**api.admin, "Range": "bytes=100-"})
    assert partial.status_code == 206 and partial.content == response.content[100:]
    done = api.client.get(f"/v1/exports/{export['id']}", headers=api.admin).json()
    assert done["status"] == "succeeded" and done["size_bytes"] > 10_000


def test_a_failed_export_says_why_and_is_queued_again_when_asked_again(api: Api) -> None:
    with_recorder(api)
    job = lora_job(api)
    api.add_checkpoint(job["id"], 8)
    export = api.client.post(export_url(job["id"], 8), headers=api.admin).json()
    finish_as_worker(api, export["id"], job["id"], failed="out of memory")
    failed = api.client.get(f"/v1/exports/{export['id']}/content", headers=api.admin)
    assert "out of memory" in error_of(failed, 409)["message"]
    retried = api.client.post(export_url(job["id"], 8), headers=api.admin)
    assert retried.status_code == 202
    assert (retried.json()["id"], retried.json()["status"], retried.json()["error"]) == (
        export["id"],
        "pending",
        None,
    )
    assert dispatched(api) == [export["id"], export["id"]]


def test_an_export_folder_outside_the_data_dir_is_never_served(api: Api, tmp_path: Path) -> None:
    with_recorder(api)
    job = lora_job(api)
    api.add_checkpoint(job["id"], 1)
    export = api.client.post(export_url(job["id"], 1), headers=api.admin).json()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_text("no")
    with api.session() as session, session.begin():
        row = session.get(Export, export["id"])
        assert row is not None
        row.status, row.path = "succeeded", str(outside)
    gone = error_of(api.client.get(f"/v1/exports/{export['id']}/content", headers=api.admin), 404)
    assert "no longer on disk" in gone["message"]
