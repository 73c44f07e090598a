"""Hostile and careless input, case by case: each gets a clear 4xx naming what is wrong and leaves
nothing behind (no job row, no stored file), on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import File, Job


def counts(api: Api) -> tuple[int, int, int]:
    with api.session() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        files = session.scalar(select(func.count()).select_from(File)) or 0
    stored = (
        sum(1 for p in api.settings.files_dir.rglob("*") if p.is_file())
        if api.settings.files_dir.exists()
        else 0
    )
    return jobs, files, stored


def refused(api: Api, body: dict[str, Any], status: int = 422) -> dict[str, Any]:
    before = counts(api)
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == status, response.text
    assert counts(api) == before, "a refused request left something behind"
    error: dict[str, Any] = response.json()["error"]
    assert error["message"]
    return error


def with_spec(**sections: Any) -> dict[str, Any]:
    body = spec_body()
    for name, value in sections.items():
        body["spec"][name] = {**body["spec"].get(name, {}), **value}
    return body


def test_oversized_upload_is_413_and_nothing_is_kept(api: Api) -> None:
    before = counts(api)
    big = b'{"text": "x"}\n' * (api.settings.max_upload_bytes // 14 + 10)
    response = api.client.post("/v1/files", files={"file": ("big.jsonl", big)}, headers=api.admin)
    assert response.status_code == 413
    assert response.json()["error"]["param"] == "file"
    assert counts(api) == before


def test_broken_jsonl_names_the_line_and_nothing_is_kept(api: Api) -> None:
    before = counts(api)
    content = b'{"text": "ok"}\n{"text": "ok"}\n{"text": oops}\n'
    response = api.client.post("/v1/files", files={"file": ("d.jsonl", content)}, headers=api.admin)
    assert response.status_code == 422
    assert "line 3" in response.json()["error"]["message"]
    assert counts(api) == before


def test_unicode_names_round_trip(api: Api) -> None:
    name = "微调 🚀 Ünïcødé — ok"
    job = api.submit(name=name, metadata={"team": "数据-ü"})
    fetched = api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()
    assert fetched["name"] == name and fetched["metadata"] == {"team": "数据-ü"}
    listed = api.client.get("/v1/jobs", params={"name": name}, headers=api.admin).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]]
    upload = api.client.post(
        "/v1/files", files={"file": ("données ✓.jsonl", b'{"text": "a"}\n')}, headers=api.admin
    )
    assert upload.status_code == 201 and upload.json()["filename"] == "données ✓.jsonl"


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(17)},  # more than 16 pairs
        {"k": "v" * 100_000},  # one huge value
        {"k" * 10_000: "v"},  # one huge key
    ],
)
def test_huge_metadata_is_refused(api: Api, metadata: dict[str, str]) -> None:
    error = refused(api, spec_body(metadata=metadata))
    assert error["param"] is not None and error["param"].startswith("metadata")


def _escapes(api: Api) -> list[str]:
    root = api.settings.allowed_root_paths[-1]
    outside = root.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.jsonl").write_text('{"text": "secret"}\n')
    link = root / "link-out"
    if not link.exists():
        os.symlink(outside, link)
    return [
        "/etc/passwd",
        "../../etc/passwd",
        f"{root}/../outside/secret.jsonl",
        f"{root}/link-out/secret.jsonl",  # a symlink that leaves the root
        "~/.ssh/id_rsa",
        "~no-such-user-of-this-machine/data.jsonl",  # expanduser raises: once a 500 (found by fuzzing)
        "file:///etc/passwd",
    ]


@pytest.mark.parametrize(
    "section, field, param",
    [
        ("data", "train_file", "spec.data.train_file"),
        ("data", "validation_file", "spec.data.validation_file"),
        ("model", "model_id", "spec.model.model_id"),
        ("model", "tokenizer_id", "spec.model.tokenizer_id"),
    ],
)
def test_path_traversal_in_every_path_field(api: Api, section: str, field: str, param: str) -> None:
    for value in _escapes(api):
        error = refused(api, with_spec(**{section: {field: value}}))
        assert error["param"] == param, (value, error)


def test_path_traversal_in_downloads_is_404(api: Api) -> None:
    job = api.submit()
    for path in (
        "/v1/files/..%2F..%2Fetc%2Fpasswd/content",
        "/v1/files/file-..%2F..%2Fetc%2Fpasswd/content",
        f"/v1/jobs/{job['id']}/checkpoints/..%2F..%2F..%2Fetc/download",
        f"/v1/jobs/{job['id']}/checkpoints/ckpt-..%2Fx/download",
    ):
        response = api.client.get(path, headers=api.admin)
        assert response.status_code == 404, (path, response.status_code)
        assert "root:" not in response.text
    logs = api.client.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": "../../etc"}, headers=api.admin)
    assert logs.status_code == 422


def test_sql_looking_strings_are_just_strings(api: Api) -> None:
    nasty = "x'; DROP TABLE jobs; --"
    job = api.submit(name=nasty, metadata={"q": "' OR '1'='1"})
    assert api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()["name"] == nasty
    for params in ({"name": "' OR 1=1 --"}, {"metadata": "q:' OR 1=1 --"}, {"status": "queued' OR '1'='1"}):
        response = api.client.get("/v1/jobs", params=params, headers=api.admin)
        assert response.status_code in (200, 422)
        if response.status_code == 200:
            assert response.json()["data"] == []
    assert counts(api)[0] == 1  # the table is still there, with its one job


@pytest.mark.parametrize(
    "body, param",
    [
        (
            with_spec(resources={"nproc_per_node": "2 --master_addr=10.0.0.1"}),
            "spec.resources.nproc_per_node",
        ),
        (
            with_spec(resources={"torchrun_args": ["--rdzv-endpoint", "evil:1"]}),
            "spec.resources.torchrun_args",
        ),
        (with_spec(resources={"env": {"LD_PRELOAD": "/tmp/x.so"}}), "spec.resources.env"),
        ({**spec_body(), "env": {"PYTHONPATH": "/tmp"}}, "env"),
        (with_spec(model={"model_id": "--nproc_per_node=64"}), "spec.model.model_id"),
        (with_spec(model={"kwargs": {"trust_remote_code": True}}), "spec.model.kwargs"),
        (with_spec(model={"model_cls": "os.system"}), "spec.model.model_cls"),
        (with_spec(data={"train_file": "$(rm -rf /)"}), "spec.data.train_file"),
    ],
)
def test_specs_cannot_smuggle_flags_environment_or_code(api: Api, body: dict[str, Any], param: str) -> None:
    error = refused(api, body)
    assert error["param"] is not None and error["param"].startswith(param), error


def test_webhook_must_be_http(api: Api) -> None:
    for url in ("file:///etc/passwd", "gopher://x", "javascript:alert(1)"):
        assert refused(api, spec_body(webhook_url=url))["param"] == "webhook_url"


def test_refusals_left_no_job_directories(api: Api) -> None:
    refused(api, with_spec(data={"train_file": "/etc/passwd"}))
    jobs_dir = Path(api.settings.jobs_dir)
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())


# --- request body size: refused before it is read, before authentication --------------------------

HUGE = 50 * 1024 * 1024


def test_huge_json_body_is_413_before_auth_and_unread(api: Api) -> None:
    before = counts(api)
    body = b'{"name": "' + b"x" * HUGE + b'"}'
    for headers in ({"Content-Type": "application/json"}, {**api.admin, "Content-Type": "application/json"}):
        response = api.client.post("/v1/jobs", content=body, headers=headers)
        assert response.status_code == 413, response.text  # not 401: the size is checked first
        assert response.json()["error"] == {
            "type": "invalid_request_error",
            "code": "payload_too_large",
            "message": f"the request body is larger than the limit of {api.settings.max_request_bytes} bytes",
            "param": "Content-Length",
        }
        assert response.headers["x-request-id"]
    assert counts(api) == before


def test_chunked_json_body_over_the_limit_is_413(api: Api) -> None:
    chunk = b" " * (64 * 1024)
    chunks = iter([b'{"name": "demo", "spec": {}, "pad": "', *([chunk] * 32), b'"}'])  # 2 MiB, no length
    response = api.client.post("/v1/jobs", content=chunks, headers=api.admin)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large" and error["param"] is None
    assert counts(api)[0] == 0


def test_a_body_under_the_limit_is_judged_on_its_content(api: Api) -> None:
    padding = "x" * (api.settings.max_request_bytes - 200)
    error = refused(api, spec_body(metadata={"pad": padding}))
    assert error["param"] == "metadata"  # too long a value: a 422, not a 413


class _Body:
    """An endless stream of body chunks (a client that never stops), counting what was pulled."""

    def __init__(self, head: bytes = b"", chunk: int = 64 * 1024, total: int = HUGE) -> None:
        self.head, self.chunk, self.left, self.pulled = head, chunk, total, 0

    async def receive(self) -> dict[str, Any]:
        size = min(self.chunk, self.left)
        data, self.head = (self.head + b"x" * size)[:size], self.head[size:]
        self.left -= size
        self.pulled += size
        return {"type": "http.request", "body": data, "more_body": self.left > 0}


def _asgi_post(api: Api, path: str, body: _Body, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    import asyncio
    import threading

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    # In a thread of its own: an earlier test may leave this thread with a running event loop,
    # in which asyncio.run() refuses to start another.
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(api.app(scope, body.receive, send))  # type: ignore[arg-type]
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the app did not answer within 60 s"
    if failure:
        raise failure[0]
    return sent


@pytest.mark.parametrize(
    ("path", "content_type", "head"),
    [
        ("/v1/jobs", b"application/json", b'{"name": "'),
        (
            "/v1/files",
            b"multipart/form-data; boundary=xyz",
            b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n',
        ),
    ],
)
def test_a_streamed_body_is_read_no_further_than_its_limit(
    api: Api, path: str, content_type: bytes, head: bytes
) -> None:
    # No Content-Length (chunked): counted while it streams, at most one chunk past the limit.
    body = _Body(head)
    authorization = f"Bearer {BOOTSTRAP}".encode()  # noqa: F405
    sent = _asgi_post(api, path, body, [(b"content-type", content_type), (b"authorization", authorization)])
    limit = api.settings.max_request_bytes
    if path == "/v1/files":
        from server.files.router import MULTIPART_OVERHEAD

        limit = api.settings.max_upload_bytes + MULTIPART_OVERHEAD
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert [m["type"] for m in sent].count("http.response.start") == 1  # only the 413 went out
    assert b"payload_too_large" in b"".join(m.get("body", b"") for m in sent)
    assert limit < body.pulled <= limit + body.chunk
    assert counts(api) == (0, 0, 0)


def test_a_declared_oversized_body_is_never_read(api: Api) -> None:
    body = _Body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(HUGE).encode())]
    sent = _asgi_post(api, "/v1/jobs", body, headers)
    assert sent[0]["status"] == 413 and body.pulled == 0


# --- what a spec may name: uploads are datasets; ids by spelling; model.kwargs allow-list ---------


def _upload(api: Api) -> str:
    upload = {"file": ("d.jsonl", b'{"text": "a"}\n' * 8)}  # one batch of spec_body's default size
    response = api.client.post("/v1/files", files=upload, headers=api.admin)
    assert response.status_code == 201, response.text
    file_id: str = response.json()["id"]
    return file_id


@pytest.mark.parametrize("field", ["model_id", "tokenizer_id"])
def test_an_uploaded_file_is_not_a_model(api: Api, field: str) -> None:
    file_id = _upload(api)  # a real file of this project: still a dataset, never a model
    error = refused(api, with_spec(model={field: file_id}))
    assert error["param"] == f"spec.model.{field}" and "uploads are datasets" in error["message"]
    accepted = api.client.post("/v1/jobs", json=with_spec(data={"train_file": file_id}), headers=api.admin)
    assert accepted.status_code == 201, accepted.text


def test_counts_past_what_the_jobs_table_records_are_refused_naming_the_field(api: Api) -> None:
    for training in ({"max_steps": 2**31}, {"max_steps": 10**23}, {"save_every": 2**31}, {"num_epochs": 1e9}):
        error = refused(api, with_spec(training=training))
        (name,) = training
        assert error["param"] == f"spec.training.{name}", error
        assert "less than or equal to" in error["message"]
    accepted = api.client.post(
        "/v1/jobs", json=with_spec(training={"max_steps": 2**31 - 1}), headers=api.admin
    )
    assert accepted.status_code == 201, accepted.text


def test_an_uploaded_file_too_small_for_one_step_is_refused_at_submit(api: Api) -> None:
    file_id = _upload(api)  # 8 rows
    error = refused(api, with_spec(data={"train_file": file_id}, training={"batch_size": 9}))
    assert error["param"] == "spec.training.batch_size"
    assert error["message"] == (
        f"spec.training.batch_size (9) is larger than the 8 rows of spec.data.train_file ({file_id}): "
        "not one full batch"
    )
    error = refused(
        api,
        with_spec(data={"train_file": file_id}, training={"batch_size": 4, "gradient_accumulation_steps": 3}),
    )
    assert error["param"] == "spec.training.gradient_accumulation_steps"
    assert "= 12 rows per optimizer step, more than the 8 rows" in error["message"]
    # Exactly one step of rows trains; packed, a long row may make several blocks: the runner decides.
    for body in (
        with_spec(data={"train_file": file_id}, training={"batch_size": 4, "gradient_accumulation_steps": 2}),
        with_spec(data={"train_file": file_id, "packing": True}, training={"batch_size": 9}),
    ):
        accepted = api.client.post("/v1/jobs", json=body, headers=api.admin)
        assert accepted.status_code == 201, accepted.text


def test_a_bare_hub_id_stays_a_hub_id_whatever_exists_in_the_cwd(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `org/tiny-llama` (spec_body's model id) also exists relative to the server's cwd, and so does
    # `org/tiny-data`, which as data is refused: data from the hub is spelled hf://datasets/org/name.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "tiny-llama").mkdir(parents=True)
    (tmp_path / "org" / "tiny-llama" / "config.json").write_text("{}")
    (tmp_path / "org" / "tiny-data").write_text('{"text": "local, not the hub"}\n')
    job = api.submit()
    assert job["spec"]["model"]["model_id"] == "org/tiny-llama"
    assert job["spec"]["data"]["train_file"] == "hf://datasets/org/tiny-data"
    error = refused(api, with_spec(data={"train_file": "org/tiny-data"}))
    assert error["param"] == "spec.data.train_file" and "hf://datasets/org/name" in error["message"]
    # Spelled as a relative path, it is a path, and a relative one is refused.
    error = refused(api, with_spec(model={"model_id": "./org/tiny-llama"}))
    assert error["param"] == "spec.model.model_id" and "must be absolute" in error["message"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("trust_remote_code", True),
        ("weights_only", False),  # unpickles arbitrary code from a .bin
        ("use_kernels", True),
        ("attn_implementation", "kernels-community/flash-attn3"),  # a hub kernel: downloaded code
        ("subfolder", "../../other-project"),
        ("gguf_file", "/etc/passwd"),
        ("cache_dir", "/tmp/elsewhere"),
        ("offload_folder", "/tmp/elsewhere"),
        ("token", "hf_secret"),
        ("proxies", {"https": "http://evil:3128"}),
        ("revision", "0123abc"),  # would not pin anything: hub models are fetched at their default
        ("device_map", "auto"),
        ("dtype", "int8"),
        ("low_cpu_mem_usage", "yes"),
        ("variant", "../x"),
    ],
)
def test_model_kwargs_outside_the_allow_list_are_refused(api: Api, key: str, value: Any) -> None:
    error = refused(api, with_spec(model={"kwargs": {key: value}}))
    assert error["param"] == f"spec.model.kwargs.{key}", error


def test_allowed_model_kwargs_are_accepted(api: Api) -> None:
    kwargs = {"attn_implementation": "sdpa", "dtype": "bfloat16", "low_cpu_mem_usage": True}
    kwargs["variant"] = "fp16"
    job = api.submit(
        spec={"model": {"model_id": "org/m", "kwargs": kwargs}, "data": {"train_file": "hf://datasets/org/d"}}
    )
    assert job["spec"]["model"]["kwargs"] == kwargs


@pytest.mark.parametrize(
    "key", ["auto_map", "quantization_config", "_attn_implementation", "trust_remote_code"]
)
def test_model_config_cannot_name_remote_code_quantizers_or_private_fields(api: Api, key: str) -> None:
    error = refused(api, with_spec(model={"config": {key: {"AutoModel": "x.Model"}}}))
    assert error["param"] == f"spec.model.config.{key}", error


CONFIG = "spec.model.config"


@pytest.mark.parametrize(
    ("config", "param"),
    [
        # transformers reads an attention implementation it does not know as a hub kernel to fetch
        ({"attn_implementation": "kernels-community/flash-attn3"}, "spec.model.config.attn_implementation"),
        (
            {"text_config": {"attn_implementation": "kernels-community/flash-attn3"}},
            "spec.model.config.text_config.attn_implementation",
        ),
        (
            {"text_config": {"_attn_implementation": "sdpa"}},
            "spec.model.config.text_config._attn_implementation",
        ),
        (
            {"vision_config": {"auto_map": {"AutoModel": "x.Model"}}},
            "spec.model.config.vision_config.auto_map",
        ),
    ],
)
def test_model_config_cannot_name_a_hub_kernel_at_any_depth(
    api: Api, config: dict[str, Any], param: str
) -> None:
    tiny = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    body = spec_body()
    body["spec"]["model"] = {"config": {**tiny, **config}, "tokenizer_id": "org/tokenizer"}
    error = refused(api, body)
    assert error["param"] == param, error


def test_a_listed_attention_implementation_in_the_config_is_accepted(api: Api) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "attn_implementation": "sdpa"}
    job = api.submit(
        spec={
            "model": {"config": config, "tokenizer_id": "org/tokenizer"},
            "data": {"train_file": "hf://datasets/org/d"},
        }
    )
    assert job["spec"]["model"]["config"]["attn_implementation"] == "sdpa"


@pytest.mark.parametrize("seed", [2**32, 2**70])
def test_a_seed_over_32_bits_is_refused_before_it_fails_the_run(api: Api, seed: int) -> None:
    assert refused(api, with_spec(training={"seed": seed}))["param"] == "spec.training.seed"
