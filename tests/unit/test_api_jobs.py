"""Jobs API: submit (validation, idempotency, limits), read, list, envelopes — on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import Job, Project


def test_no_token_is_401_in_the_envelope_with_a_request_id(api: Api) -> None:
    response = api.client.get("/v1/jobs")
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "missing_token"
    assert set(error) == {"type", "code", "message", "param"}
    assert response.headers["x-request-id"].startswith("req_")
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_and_revoked_tokens_are_401(api: Api) -> None:
    assert api.client.get("/v1/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    headers = api.token("p1")
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    from server.auth.service import list_tokens, revoke_token

    with api.session() as session, session.begin():
        token = next(t for t in list_tokens(session, "p1"))
        revoke_token(session, token.id)
    assert api.client.get("/v1/jobs", headers=headers).json()["error"]["code"] == "invalid_token"


def test_request_id_is_echoed_when_valid_and_replaced_when_not(api: Api) -> None:
    assert (
        api.client.get("/healthz", headers={"x-request-id": "abc-123"}).headers["x-request-id"] == "abc-123"
    )
    replaced = api.client.get("/healthz", headers={"x-request-id": "bad id\twith spaces"}).headers[
        "x-request-id"
    ]
    assert replaced.startswith("req_")
    assert api.client.get("/v1/nothing-here").headers["x-request-id"].startswith("req_")


def test_healthz(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}


def test_unknown_precision_is_422_naming_the_field(api: Api) -> None:
    body = spec_body()
    body["spec"]["model"]["mixed_precision"] = "fp9"
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "spec.model.mixed_precision"
    assert api.dispatched == []


def test_unknown_keys_are_422_naming_them(api: Api) -> None:
    response = api.client.post("/v1/jobs", json=spec_body(colour="blue"), headers=api.admin)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "colour"
    assert response.json()["error"]["code"] == "unknown_field"
    body = spec_body()
    body["spec"]["data"]["trian_file"] = "x"
    error = api.client.post("/v1/jobs", json=body, headers=api.admin).json()["error"]
    assert error["param"] == "spec.data.trian_file"
    # The message names the field that was meant (twinkle_core/spec_hints.py).
    assert error["message"] == "unknown field 'spec.data.trian_file' (did you mean 'spec.data.train_file'?)"
    body = spec_body()
    body["spec"]["training"] = {"learning_rate": 1e-4}  # Trainer's name
    error = api.client.post("/v1/jobs", json=body, headers=api.admin).json()["error"]
    assert error["message"].endswith("(did you mean 'spec.optimizer.lr'?)")


def test_one_answer_names_every_bad_field_the_typo_first(api: Api) -> None:
    body = spec_body()
    body["spec"]["model"]["mixed_precision"] = "fp9"
    body["spec"]["training"] = {"max_steps": 0, "learning_rate": 1e-4}
    error = api.client.post("/v1/jobs", json=body, headers=api.admin).json()["error"]
    assert error["param"] == "spec.training.learning_rate" and error["code"] == "unknown_field"
    message = error["message"]
    assert message.startswith(
        "unknown field 'spec.training.learning_rate' (did you mean 'spec.optimizer.lr'?); also "
    )
    assert "spec.model.mixed_precision: Input should be" in message
    assert "spec.training.max_steps: Input should be greater than or equal to 1" in message
    assert "more error" not in message
    many = spec_body()
    many["spec"]["training"] = {f"unknown_{i}": i for i in range(8)}
    message = api.client.post("/v1/jobs", json=many, headers=api.admin).json()["error"]["message"]
    assert message.count("unknown field") == 5 and message.endswith("(and 3 more errors)")


def test_malformed_json_and_missing_spec_are_422(api: Api) -> None:
    response = api.client.post(
        "/v1/jobs", content=b"{not json", headers={**api.admin, "content-type": "application/json"}
    )
    assert response.status_code == 422
    response = api.client.post("/v1/jobs", json={"name": "x"}, headers=api.admin)
    assert response.status_code == 422 and response.json()["error"]["param"] == "spec"


def test_create_returns_the_resolved_spec_and_wakes_a_worker_after_commit(api: Api) -> None:
    job = api.submit(metadata={"team": "nlp"}, priority=5)
    assert job["status"] == "queued" and job["object"] == "job"
    assert job["spec"]["model"]["mixed_precision"] == "bf16"  # a default, filled in
    assert job["spec"]["training"]["batch_size"] == 8
    assert job["spec"]["optimizer"]["name"] == "adamw"
    assert job["queue_position"] == 1 and job["attempt"] == 0
    assert set(job["progress"]) == {
        "step",
        "total_steps",
        "epoch",
        "percent",
        "loss",
        "lr",
        "tokens_per_second",
        "eta_seconds",
    }
    assert job["metadata"] == {"team": "nlp"} and job["priority"] == 5
    assert api.dispatched == [job["id"]]
    with api.session() as session:  # committed before the dispatch ran
        assert session.get(Job, job["id"]) is not None


def test_queue_position_follows_priority_then_age(api: Api) -> None:
    first = api.submit()
    second = api.submit()
    urgent = api.submit(priority=10)
    positions = {
        j["id"]: j["queue_position"] for j in api.client.get("/v1/jobs", headers=api.admin).json()["data"]
    }
    assert positions == {urgent["id"]: 1, first["id"]: 2, second["id"]: 3}
    api.force_status(urgent["id"], "running")
    assert api.client.get(f"/v1/jobs/{urgent['id']}", headers=api.admin).json()["queue_position"] is None
    assert api.client.get(f"/v1/jobs/{second['id']}", headers=api.admin).json()["queue_position"] == 2


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("train_file", "file-doesnotexist", "spec.data.train_file"),
        ("train_file", "/etc/passwd", "spec.data.train_file"),
        ("train_file", "relative/../../etc/passwd", "spec.data.train_file"),
        ("train_file", "not a hub id", "spec.data.train_file"),
        ("train_file", "hf://", "spec.data.train_file"),
        ("validation_file", "../secret.jsonl", "spec.data.validation_file"),
        ("model_id", "/root", "spec.model.model_id"),
        ("tokenizer_id", "~/tok", "spec.model.tokenizer_id"),
    ],
)
def test_references_that_are_not_files_paths_or_hub_ids_are_422(
    api: Api, field: str, value: str, param: str
) -> None:
    body = spec_body()
    section = "data" if field in ("train_file", "validation_file") else "model"
    body["spec"][section][field] = value
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param


def test_paths_inside_the_allowed_roots_and_hub_ids_are_accepted(api: Api, tmp_path: Path) -> None:
    data = tmp_path / "roots" / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    body = spec_body()
    body["spec"]["data"]["train_file"] = str(data)
    body["spec"]["data"]["validation_file"] = "hf://datasets/org/val-set"
    body["spec"]["model"]["model_id"] = "ms://Qwen/Qwen3-0.6B"
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 201, response.text


def test_a_symlink_out_of_the_allowed_roots_is_refused(api: Api, tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"text": "secret"}\n')
    link = tmp_path / "roots" / "innocent.jsonl"
    os.symlink(outside, link)
    body = spec_body()
    body["spec"]["data"]["train_file"] = str(link)
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 422 and "outside the allowed" in response.json()["error"]["message"]
    # The message says where files may be, and which setting says so.
    roots = ", ".join(str(root) for root in api.settings.allowed_root_paths)
    assert f"({roots}; TWINKLE_ALLOWED_ROOTS)" in response.json()["error"]["message"]


def _service_storage_paths(api: Api) -> dict[str, Path]:
    """Paths inside the data dir (an allowed root) that are the service's own."""
    owner = api.submit()
    checkpoint = Path(api.add_checkpoint(owner["id"], 1)["path"])
    upload = api.client.post(
        "/v1/files", files={"file": ("d.jsonl", b'{"text": "a"}\n')}, headers=api.token("other")
    )
    assert upload.status_code == 201, upload.text
    data_dir = api.settings.data_dir
    (data_dir / "local-admin-token").write_text("tw-secret")
    (data_dir / "logs").mkdir(exist_ok=True)
    (data_dir / "logs" / "server.log").write_text("...")
    (data_dir / "archives").mkdir(exist_ok=True)
    (data_dir / "archives" / "ckpt-1.jsonl").write_text("{}\n")
    (data_dir / "twinkle.db-wal").write_bytes(b"\0")
    return {
        "a job's checkpoint": checkpoint,
        "a job's progress": checkpoint.parent.parent / "progress.jsonl",
        "an upload": next(api.settings.files_dir.rglob("*.jsonl")),
        "the admin token": data_dir / "local-admin-token",
        "the stack's logs": data_dir / "logs" / "server.log",
        "a checkpoint archive": data_dir / "archives" / "ckpt-1.jsonl",
        "the database's journal": data_dir / "twinkle.db-wal",
    }


def test_no_spec_reads_the_services_own_storage_by_path(api: Api) -> None:
    # Another project's weights and data, or the service's secrets, must not be one path away: the
    # data dir is an allowed root by default, and it holds every project's jobs and uploads.
    paths = _service_storage_paths(api)
    paths["a job's progress"].write_text('{"event": "started"}\n')
    for token in (api.admin, api.token("other")):  # not even a project's own: those go by id or name
        for what, path in paths.items():
            for field in ("data.train_file", "model.model_id"):
                body = spec_body()
                section, key = field.split(".")
                body["spec"][section][key] = str(path)
                answer = api.client.post("/v1/jobs", json=body, headers=token)
                assert answer.status_code == 422, (what, field, answer.text)
                error = answer.json()["error"]
                assert error["param"] == f"spec.{field}" and "service's own storage" in error["message"]
    # A user's own model and dataset beside them in the data dir stay usable.
    model = api.settings.data_dir / "models" / "tiny"
    model.mkdir(parents=True)
    dataset = api.settings.data_dir / "train.jsonl"
    dataset.write_text('{"text": "hi"}\n')
    body = spec_body()
    body["spec"]["model"]["model_id"] = str(model)
    body["spec"]["data"]["train_file"] = str(dataset)
    assert api.client.post("/v1/jobs", json=body, headers=api.admin).status_code == 201


def test_another_projects_file_id_is_refused(api: Api) -> None:
    upload = api.client.post(
        "/v1/files", files={"file": ("d.jsonl", b'{"text": "a"}\n')}, headers=api.token("other")
    )
    assert upload.status_code == 201, upload.text
    body = spec_body()
    body["spec"]["data"]["train_file"] = upload.json()["id"]
    body["spec"]["training"] = {"batch_size": 1}  # the file's one row
    assert api.client.post("/v1/jobs", json=body, headers=api.admin).status_code == 422
    assert api.client.post("/v1/jobs", json=body, headers=api.token("other")).status_code == 201


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (
            lambda s: s["model"].update(strategy="native_fsdp", mixed_precision="fp8"),
            "spec.model.strategy",
        ),
        (
            lambda s: s["model"].update(kwargs={"trust_remote_code": True}),
            "spec.model.kwargs.trust_remote_code",
        ),
        (lambda s: s["model"].update(model_cls="os.system"), "spec.model.model_cls"),
        (
            lambda s: s.update(
                resources={"nproc_per_node": 2}, model={**s["model"], "device_mesh": {"dp_size": 3}}
            ),
            "spec.model.device_mesh",  # a check across fields: the field it is about
        ),
        (
            lambda s: s.update(training={"batch_size": 3}, resources={"nproc_per_node": 2}),
            "spec.training.batch_size",
        ),
    ],
)
def test_policy_violations_in_the_spec_are_422(api: Api, mutate: object, param: str) -> None:
    body = spec_body()
    mutate(body["spec"])  # type: ignore[operator]
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)
    assert not error["message"].startswith(f"{param}: {param.removeprefix('spec.')}")  # said once


@pytest.mark.parametrize(
    ("overrides", "param"),
    [
        ({"webhook_url": "ftp://example.com/hook"}, "webhook_url"),
        ({"webhook_url": "http://"}, "webhook_url"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"priority": 1000}, "priority"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_job_fields_are_validated(api: Api, overrides: dict[str, object], param: str) -> None:
    response = api.client.post("/v1/jobs", json=spec_body(**overrides), headers=api.admin)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == param


def test_idempotency_key_replays_the_same_job_and_rejects_another_body(api: Api) -> None:
    headers = {**api.admin, "Idempotency-Key": "build-42"}
    first = api.client.post("/v1/jobs", json=spec_body(), headers=headers)
    again = api.client.post("/v1/jobs", json=spec_body(), headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert api.dispatched == [first.json()["id"]]
    other = api.client.post("/v1/jobs", json=spec_body(name="different"), headers=headers)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    # Keys are per project: the same key in another project is a new job.
    elsewhere = api.client.post(
        "/v1/jobs", json=spec_body(), headers={**api.token("p2"), "Idempotency-Key": "build-42"}
    )
    assert elsewhere.status_code == 201 and elsewhere.json()["id"] != first.json()["id"]


def test_project_queue_limit_is_429_with_retry_after(api: Api) -> None:
    headers = api.token("small")
    api.limit_project("small", max_queued_jobs=1)
    api.submit(headers)
    response = api.client.post("/v1/jobs", json=spec_body(), headers=headers)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "project_queue_limit"
    assert int(response.headers["retry-after"]) > 0


def _submit_at_once(api: Api, headers: dict[str, str], count: int, path: str = "/v1/jobs") -> list[Any]:
    """`count` submits released together from their own threads (each request its own connection)."""
    start = threading.Barrier(count)

    def submit(i: int) -> Any:
        start.wait(timeout=60)
        return api.client.post(path, json=spec_body(name=f"race-{i}"), headers=headers)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(submit, range(count)))


def _queued(api: Api, project: str) -> int:
    with api.session() as session:
        query = (
            select(func.count())
            .select_from(Job)
            .join(Project, Project.id == Job.project_id)
            .where(Project.name == project, Job.status == "queued")
        )
        return session.scalar(query) or 0


@pytest.mark.parametrize("limit", [1, 3])
def test_concurrent_submits_never_exceed_the_queue_limit(api: Api, limit: int) -> None:
    headers = api.token("race")
    api.limit_project("race", max_queued_jobs=limit)
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200  # token cached: no row lock
    for burst in range(3):
        responses = _submit_at_once(api, headers, 8)
        created = [r for r in responses if r.status_code == 201]
        assert len(created) == (limit if burst == 0 else 1)  # after the first burst: one free place
        assert _queued(api, "race") == limit
        for response in responses:
            if response.status_code == 201:
                continue
            assert response.status_code == 429, response.text
            error = response.json()["error"]
            assert error["code"] == "project_queue_limit" and f"max_queued_jobs = {limit}" in error["message"]
            assert int(response.headers["retry-after"]) > 0
        api.force_status(created[0].json()["id"], "running")  # a worker takes one: one place frees


def test_clones_and_resumes_count_against_the_queue_limit_too(api: Api) -> None:
    headers = api.token("race")
    api.limit_project("race", max_queued_jobs=2)
    source = api.submit(headers)
    paused = api.submit(headers)
    api.force_status(source["id"], "succeeded")
    api.force_status(paused["id"], "paused")
    clones = _submit_at_once(api, headers, 6, path=f"/v1/jobs/{source['id']}/clone")
    assert sorted(r.status_code for r in clones) == [201, 201, 429, 429, 429, 429]
    resumed = api.client.post(f"/v1/jobs/{paused['id']}/resume", headers=headers)
    assert resumed.status_code == 429 and resumed.json()["error"]["code"] == "project_queue_limit"
    assert _queued(api, "race") == 2
    first_clone = next(r.json()["id"] for r in clones if r.status_code == 201)
    api.force_status(first_clone, "running")
    assert api.client.post(f"/v1/jobs/{paused['id']}/resume", headers=headers).status_code == 200


def test_get_and_list_are_scoped_to_the_project(api: Api) -> None:
    mine = api.submit(api.token("a"))
    other = api.token("b")
    response = api.client.get(f"/v1/jobs/{mine['id']}", headers=other)
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    assert api.client.get("/v1/jobs", headers=other).json()["data"] == []
    assert api.client.get(f"/v1/jobs/{mine['id']}/events", headers=other).status_code == 404


def test_list_pages_with_cursors_newest_first(api: Api) -> None:
    ids = [api.submit()["id"] for _ in range(5)]
    page = api.client.get("/v1/jobs?limit=2", headers=api.admin).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [j["id"] for j in page["data"]] == ids[::-1][:2]
    assert page["first_id"] == ids[4] and page["last_id"] == ids[3]
    seen = [j["id"] for j in page["data"]]
    while page["has_more"]:
        page = api.client.get(f"/v1/jobs?limit=2&after={page['last_id']}", headers=api.admin).json()
        seen += [j["id"] for j in page["data"]]
    assert seen == ids[::-1]
    bad = api.client.get("/v1/jobs?after=job-unknown", headers=api.admin)
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "after"
    assert api.client.get("/v1/jobs?limit=0", headers=api.admin).json()["error"]["param"] == "limit"


def test_list_filters_by_status_name_and_metadata(api: Api) -> None:
    a = api.submit(name="alpha", metadata={"team": "nlp", "run": "1"})
    b = api.submit(name="beta", metadata={"team": "vision"})
    api.force_status(b["id"], "running")

    def ids(query: str) -> list[str]:
        response = api.client.get(f"/v1/jobs?{query}", headers=api.admin)
        assert response.status_code == 200, response.text
        return [j["id"] for j in response.json()["data"]]

    assert ids("status=running") == [b["id"]]
    assert set(ids("status=running&status=queued")) == {a["id"], b["id"]}
    assert ids("name=alpha") == [a["id"]]
    assert ids("metadata=team:nlp") == [a["id"]]
    assert ids("metadata=team:nlp&metadata=run:2") == []
    assert api.client.get("/v1/jobs?status=bogus", headers=api.admin).json()["error"]["param"] == "status.0"
    assert api.client.get("/v1/jobs?metadata=nocolon", headers=api.admin).status_code == 422


def test_progress_fields_percent_eta_and_error(api: Api) -> None:
    job = api.submit()
    api.force_status(job["id"], "running", step=10, total_steps=40, loss=1.5, lr=1e-5, epoch=0.25)
    api.add_metrics(job["id"], "loss", [2.0 - i * 0.05 for i in range(10)], seconds_per_step=2.0)
    progress = api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()["progress"]
    assert progress["percent"] == 25.0 and progress["loss"] == 1.5 and progress["step"] == 10
    assert progress["eta_seconds"] == pytest.approx(60.0, rel=0.05)  # 30 steps left at 2 s/step
    api.force_status(job["id"], "failed", error={"kind": "user", "message": "bad data, line 3"})
    failed = api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()
    assert failed["error"] == {"kind": "user", "message": "bad data, line 3"}
    assert failed["progress"]["eta_seconds"] is None


def test_events_are_a_cursor_list_in_order(api: Api) -> None:
    job = api.submit()
    for i in range(4):
        api.add_event(job["id"], f"step {i}", type_="metrics")
    api.add_event(job["id"], "disk is slow", level="warn")
    url = f"/v1/jobs/{job['id']}/events"
    page = api.client.get(f"{url}?limit=3", headers=api.admin).json()
    assert [e["message"] for e in page["data"]] == ["job queued", "step 0", "step 1"] and page["has_more"]
    rest = api.client.get(f"{url}?after={page['last_id']}", headers=api.admin).json()
    assert [e["message"] for e in rest["data"]] == ["step 2", "step 3", "disk is slow"] and not rest[
        "has_more"
    ]
    warn = api.client.get(f"{url}?level=warn", headers=api.admin).json()["data"]
    assert [e["message"] for e in warn] == ["disk is slow"]
    newest = api.client.get(f"{url}?order=desc&limit=1", headers=api.admin).json()["data"]
    assert newest[0]["message"] == "disk is slow"
    assert api.client.get(f"{url}?type=bogus", headers=api.admin).status_code == 422


def test_a_broker_outage_does_not_fail_the_submission(api: Api) -> None:
    def broken_dispatch(job_id: str) -> None:
        raise ConnectionError("broker down")

    api.app.state.dispatch = broken_dispatch
    response = api.client.post("/v1/jobs", json=spec_body(), headers=api.admin)
    assert response.status_code == 201  # the job is recorded in SQL; a worker poll or the reconciler finds it
    assert api.client.get(f"/v1/jobs/{response.json()['id']}", headers=api.admin).json()["status"] == "queued"
