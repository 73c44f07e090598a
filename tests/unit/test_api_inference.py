"""The public inference endpoints' own rules: which `model` names resolve to which checkpoint
(404 naming `model` for everything else), project scoping of `/v1/models`, and 503 with
Retry-After when no serving host is live. Real database (SQLite and PostgreSQL), real app.

A name that resolves gets as far as choosing a host, so with no host registered "resolves" reads
as 503 `no_serving_host`, and "does not resolve" as 404 `model_not_found`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import fastapi.routing as fastapi_routing
import openai
import pytest
from openai_standin import TOKEN, Standin, serve_standin
from sqlalchemy import event
from starlette.routing import Match
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, RESPONSE_SENT, Api

from jobcore import model_names as names
from jobcore.db.models import Checkpoint, ServingHost, utcnow
from server.inference import plans
from server.inference.hosts import LiveHost, order_for
from server.inference.route import GenerationRoute
from server.inference.router import router as inference_router


@pytest.fixture(scope="module")
def host() -> Iterator[Standin]:
    """A stand-in for a serving host's protocol that records what it is sent."""
    yield from serve_standin()


def _register_host(api: Api, url: str, *, age_seconds: float = 0.0, loaded: list[Any] | None = None) -> None:
    with api.session() as session, session.begin():
        beat = utcnow() - timedelta(seconds=age_seconds)
        session.add(
            ServingHost(
                url=url, engine="transformers", memory_bytes=1 << 30, heartbeat_at=beat, loaded=loaded or []
            )
        )


def _chat(api: Api, model: str, headers: dict[str, str] | None = None, **extra: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    return api.client.post("/v1/chat/completions", json=body, headers=headers or api.admin)


def _assert_unknown(response: Any) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found", error


def _assert_resolved(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "no_serving_host"
    assert int(response.headers["Retry-After"]) > 0


def test_names_parse_from_their_spelling() -> None:
    name = names.fine_tuned_model_name("job-abc123", "/data/models/Qwen3-0.6B", "support bot:v2")
    assert name == "ft:Qwen3-0.6B:support-bot-v2:job-abc123"
    assert names.fine_tuned_model_name("job-abc123", "org/tiny-llama", None) == "ft:tiny-llama:job-abc123"
    assert names.parse(name) == names.FineTunedName("job-abc123")
    assert names.parse("job-abc123:ckpt-40") == names.CheckpointName("job-abc123", 40)
    for other in ("gpt-4o", "ft:", "ft:x:not-a-job", "job-abc123:ckpt-", "job-abc123:ckpt-1e3", "x:ckpt-4"):
        assert names.parse(other) is None, other
    assert names.parse("job-abc123:ckpt-" + "9" * 10) is None  # beyond a 32-bit step column


def test_hosts_holding_the_checkpoint_come_first_then_the_least_loaded() -> None:
    hosts = [
        LiveHost("http://a", frozenset({"/ck/other"}), 100),
        LiveHost("http://b", frozenset(), 10),
        LiveHost("http://c", frozenset({"/ck/1"}), 500),
    ]
    assert order_for(hosts, "/ck/1") == ["http://c", "http://b", "http://a"]
    assert order_for(hosts, "/ck/new") == ["http://b", "http://a", "http://c"]


def test_model_names_resolve_within_the_project_only(api: Api) -> None:
    done = api.submit(name="support bot")
    api.force_status(done["id"], "succeeded")
    api.add_checkpoint(done["id"], 2)
    final = api.add_checkpoint(done["id"], 4)
    fine_tuned = api.client.get(f"/v1/fine_tuning/jobs/{done['id']}", headers=api.admin).json()[
        "fine_tuned_model"
    ]
    assert fine_tuned == f"ft:tiny-llama:support-bot:{done['id']}"

    _assert_resolved(_chat(api, fine_tuned))
    _assert_resolved(_chat(api, f"{done['id']}:ckpt-2"))
    _assert_resolved(_chat(api, final["path"]))  # what fine_tuned_model was before `ft:` names
    _assert_unknown(_chat(api, f"ft:Qwen3:support-bot:{done['id']}"))  # right job, wrong name
    _assert_unknown(_chat(api, f"{done['id']}:ckpt-3"))  # no complete checkpoint at that step
    _assert_unknown(_chat(api, "gpt-4o"))
    base = _chat(api, "org/tiny-llama")  # listed by /v1/models, but not served
    _assert_unknown(base)
    assert "base model" in base.json()["error"]["message"]

    # A checkpoint dropped by retention (by the worker: another process) is gone for inference
    # too, once this process's resolution of it expires (server/inference/plans.py).
    with api.session() as session, session.begin():
        row = session.query(Checkpoint).filter_by(job_id=done["id"], step=2).one()
        row.deleted = True
    _assert_resolved(_chat(api, f"{done['id']}:ckpt-2"))
    models = plans.model_cache(api.app.state.engine)
    models.clock = lambda: time.monotonic() + plans.MODEL_TTL_SECONDS
    _assert_unknown(_chat(api, f"{done['id']}:ckpt-2"))

    # A job still running has no fine_tuned_model yet, but its checkpoints can be called.
    running = api.submit()
    api.force_status(running["id"], "running")
    api.add_checkpoint(running["id"], 1)
    running_name = names.fine_tuned_model_name(running["id"], "org/tiny-llama", "demo")
    assert (
        api.client.get(f"/v1/fine_tuning/jobs/{running['id']}", headers=api.admin).json()["fine_tuned_model"]
        is None
    )
    not_yet = _chat(api, running_name)
    _assert_unknown(not_yet)
    assert "running" in not_yet.json()["error"]["message"]
    _assert_resolved(_chat(api, f"{running['id']}:ckpt-1"))

    # A succeeded job whose checkpoints are all gone has a name but nothing to serve.
    emptied = api.submit(name="emptied")
    api.force_status(emptied["id"], "succeeded")
    nothing = _chat(api, names.fine_tuned_model_name(emptied["id"], "org/tiny-llama", "emptied"))
    _assert_unknown(nothing)
    assert "no checkpoint left to serve" in nothing.json()["error"]["message"]

    # Another project's token sees none of it, not even through the old path name.
    other = api.token("team-b")
    for model in (fine_tuned, f"{done['id']}:ckpt-4", final["path"]):
        _assert_unknown(_chat(api, model, headers=other))


def test_bad_bodies_are_400_naming_the_field_as_openai_answers_them(api: Api) -> None:
    job = api.submit()
    api.force_status(job["id"], "succeeded")
    api.add_checkpoint(job["id"], 1)
    model = f"{job['id']}:ckpt-1"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"twinkle": {"checkpoint": "/etc"}}, "twinkle"),  # only the server says what the host loads
    ]
    for extra, param in cases:
        response = _chat(api, model, **extra)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    response = api.client.post(
        "/v1/chat/completions", json={"model": model, "messages": []}, headers=api.admin
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    response = api.client.post("/v1/completions", json={"model": model}, headers=api.admin)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    for prompt in ([[]], [-1], [[1], []]):
        response = api.client.post(
            "/v1/completions", json={"model": model, "prompt": prompt}, headers=api.admin
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt", prompt
    for prompt in ("x", ["x", "y"], [1, 2, 3], [[1, 2], [3]]):  # OpenAI's four forms reach the host
        _assert_resolved(
            api.client.post("/v1/completions", json={"model": model, "prompt": prompt}, headers=api.admin)
        )


def test_models_list_is_project_scoped(api: Api) -> None:
    done = api.submit(name="a")
    api.force_status(done["id"], "succeeded")
    api.add_checkpoint(done["id"], 3)
    api.submit(spec={"model": {"model_id": "org/other-base"}, "data": {"train_file": "hf://datasets/o/d"}})
    failed = api.submit()
    api.force_status(failed["id"], "failed")
    api.add_checkpoint(failed["id"], 1)  # callable as a checkpoint, but it is no fine-tuned model
    foreign = api.submit(
        headers=api.token("team-b"),
        spec={"model": {"model_id": "org/secret-base"}, "data": {"train_file": "hf://datasets/o/d"}},
    )
    api.force_status(foreign["id"], "succeeded")
    api.add_checkpoint(foreign["id"], 1)

    client = openai.OpenAI(
        base_url="http://testserver/v1", api_key=BOOTSTRAP, http_client=api.client, max_retries=0
    )
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [f"ft:tiny-llama:a:{done['id']}", "org/tiny-llama", "org/other-base"]
    tuned = models.data[0]
    assert tuned.owned_by != "twinkle" and tuned.model_extra is not None
    assert tuned.model_extra["parent"] == "org/tiny-llama" and tuned.model_extra["servable"] is True
    assert models.data[1].owned_by == "twinkle" and models.data[1].model_extra["servable"] is False  # type: ignore[index]

    # One by one, as `client.models.retrieve` asks: what resolves, and the bases; nothing else.
    assert client.models.retrieve(ids[0]).model_extra == tuned.model_extra
    checkpoint = client.models.retrieve(f"{failed['id']}:ckpt-1")
    assert checkpoint.model_extra is not None and checkpoint.model_extra["job_id"] == failed["id"]
    assert client.models.retrieve("org/other-base").owned_by == "twinkle"
    for unknown in (f"ft:secret-base:demo:{foreign['id']}", "org/secret-base", f"{failed['id']}:ckpt-2"):
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve(unknown)
        assert missing.value.body["param"] == "model"  # type: ignore[index]

    # The native job names its model as /v1/models lists it; a failed job, or a succeeded one
    # with no checkpoint left to serve, has none.
    jobs = {j["id"]: j for j in api.client.get("/v1/jobs?limit=100", headers=api.admin).json()["data"]}
    assert jobs[done["id"]]["fine_tuned_model"] == ids[0]
    assert jobs[failed["id"]]["fine_tuned_model"] is None
    empty = api.submit(name="no-checkpoint")
    api.force_status(empty["id"], "succeeded")
    assert api.client.get(f"/v1/jobs/{empty['id']}", headers=api.admin).json()["fine_tuned_model"] is None

    theirs = api.client.get("/v1/models", headers=api.token("team-b")).json()
    assert [m["id"] for m in theirs["data"]] == [f"ft:secret-base:demo:{foreign['id']}", "org/secret-base"]


def test_inference_needs_a_token(api: Api) -> None:
    assert api.client.get("/v1/models").status_code == 401
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert api.client.post(path, json={"model": "x"}).status_code == 401


def test_a_live_host_gets_the_resolved_checkpoint(api: Api, host: Standin) -> None:
    api.settings.serving_secret = TOKEN  # the secret this stand-in expects
    lora_spec = {
        "model": {
            "model_id": "org/tiny-llama",
            "model_cls": "LlamaForCausalLM",
            "config": {"rope_theta": 500.0},
            "kwargs": {"attn_implementation": "eager"},
        },
        "data": {"train_file": "hf://datasets/org/tiny-data"},
        "adapter": {"r": 4},
    }
    lora = api.submit(name="lora", spec=lora_spec)
    full = api.submit(name="full")
    for job in (lora, full):
        api.force_status(job["id"], "succeeded")
    lora_ckpt = api.add_checkpoint(lora["id"], 3)
    full_ckpt = api.add_checkpoint(full["id"], 5)

    _register_host(api, "http://127.0.0.1:9", age_seconds=3600)  # stale: never chosen
    _assert_resolved(_chat(api, f"{lora['id']}:ckpt-3"))

    _register_host(api, host.url)
    lora_name = f"ft:tiny-llama:lora:{lora['id']}"
    answer = _chat(api, lora_name, max_tokens=3, seed=7)
    sent = host.state.requests[-1]
    # The host is told which checkpoint to load and on which base, built as the job built it,
    # and the name to echo; the client's own fields pass unchanged.
    assert sent["twinkle"] == {
        "checkpoint": lora_ckpt["path"],
        "base_model": "org/tiny-llama",
        "base_model_cls": "LlamaForCausalLM",
        "base_config": {"rope_theta": 500.0},
        "base_kwargs": {"attn_implementation": "eager"},
        "model": lora_name,
    }
    assert (
        sent["messages"] == [{"role": "user", "content": "hi"}]
        and sent["max_tokens"] == 3
        and sent["seed"] == 7
    )
    # This stand-in knows none of our names: its 404 comes back in the envelope, naming `model`.
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "model"

    api.client.post(
        "/v1/completions", json={"model": f"{full['id']}:ckpt-5", "prompt": "x"}, headers=api.admin
    )
    sent = host.state.requests[-1]
    assert sent["twinkle"] == {
        "checkpoint": full_ckpt["path"],
        "base_model": None,
        "model": f"{full['id']}:ckpt-5",
    }
    assert sent["prompt"] == "x"


@contextmanager
def _statements(api: Api) -> Iterator[list[str]]:
    """The SQL statements the app's engines send while the block runs."""
    statements: list[str] = []
    engines = [api.app.state.engine]
    if api.app.state.read_engine is not None:
        engines.append(api.app.state.read_engine.sync_engine)

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)


def test_a_warm_request_reads_no_sql_and_a_deleted_job_stops_resolving_at_once(
    api: Api, host: Standin
) -> None:
    """The model's resolution and the live hosts are kept for moments (server/inference/plans.py):
    a request right after another goes to its host without a statement, and a job deleted through
    this process is forgotten at once, not when its cached resolution expires."""
    api.settings.serving_secret = TOKEN
    job = api.submit(name="warm")
    api.force_status(job["id"], "succeeded")
    checkpoint = api.add_checkpoint(job["id"], 2)
    _register_host(api, host.url)
    model = f"{job['id']}:ckpt-2"
    _chat(api, model)  # the first resolves in SQL and reads the hosts
    assert host.state.requests[-1]["twinkle"]["checkpoint"] == checkpoint["path"]

    with _statements(api) as statements:
        seen = len(host.state.requests)
        _chat(api, model)
        assert len(host.state.requests) == seen + 1, "the warm request did not reach the host"
    assert statements == []

    assert api.client.delete(f"/v1/jobs/{job['id']}", headers=api.admin).status_code == 200
    seen = len(host.state.requests)
    _assert_unknown(_chat(api, model))
    assert len(host.state.requests) == seen  # refused here, not relayed


def test_a_model_in_steady_use_is_reloaded_after_its_response_and_a_dropped_one_ends_early(
    api: Api, host: Standin
) -> None:
    """An entry of the plan past half its life is reloaded by one request after that request's
    response, never on its way to the host; a checkpoint dropped by another process is found
    so by the reload and stops resolving before its entry would have expired."""
    api.settings.serving_secret = TOKEN
    engine = api.app.state.engine
    now = [1000.0]
    for cache in (plans.model_cache(engine), plans.host_cache(engine)):
        cache.clock = lambda: now[0]
    job = api.submit(name="steady")
    api.force_status(job["id"], "succeeded")
    api.add_checkpoint(job["id"], 2)
    _register_host(api, host.url)
    model = f"{job['id']}:ckpt-2"
    _chat(api, model)  # resolves in SQL, reads the hosts, keeps both

    now[0] += 0.6 * plans.MODEL_TTL_SECONDS
    with _statements(api) as seen, api.response_ends(seen):
        sent = len(host.state.requests)
        _chat(api, model)
        assert len(host.state.requests) == sent + 1
    ended = seen.index(RESPONSE_SENT)
    assert ended == 0, f"a statement ran on the request's way: {seen[:ended]}"
    reloads = " ".join(seen[1:])
    assert "checkpoints" in reloads and "serving_hosts" in reloads, seen
    with _statements(api) as seen:
        _chat(api, model)
    assert seen == []  # reloaded once: the entries are young again

    with api.session() as session, session.begin():  # retention, in another process
        session.query(Checkpoint).filter_by(job_id=job["id"]).delete()
    now[0] += 0.6 * plans.MODEL_TTL_SECONDS
    sent = len(host.state.requests)
    _chat(api, model)  # still within its TTL: relayed, and its reload finds the checkpoint gone
    assert len(host.state.requests) == sent + 1
    _assert_unknown(_chat(api, model))
    assert len(host.state.requests) == sent + 1


def test_generation_takes_its_short_way_and_answers_as_fastapi_did(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GenerationRoute` (server/inference/route.py) serves a well-formed request without
    FastAPI's dependency solver, and answers every request as FastAPI's own handler does (which it
    takes while a dependency override is set): the same status, envelope and rate-limit headers,
    the token checked before the body and counted once per request."""
    generation = {r.path for r in inference_router.routes if isinstance(r, GenerationRoute)}
    assert generation == {"/v1/chat/completions", "/v1/completions"}
    owner = api.token("gen")
    job = api.submit(headers=owner)
    api.force_status(job["id"], "succeeded")
    api.add_checkpoint(job["id"], 1)
    model = f"{job['id']}:ckpt-1"
    solved: list[str] = []
    solve = fastapi_routing.solve_dependencies

    async def counted(*args: Any, **kwargs: Any) -> Any:
        solved.append(kwargs["request"].url.path)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi_routing, "solve_dependencies", counted)

    def answers(limited: dict[str, str]) -> list[tuple[Any, ...]]:
        json_type = {"content-type": "application/json"}
        chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        requests: list[tuple[str, dict[str, Any]]] = [
            ("/v1/completions", {"json": {"model": model, "prompt": "x"}, "headers": limited}),
            ("/v1/completions", {"json": {"model": model, "prompt": "x", "n": 0}, "headers": limited}),
            ("/v1/completions", {"json": {"model": "no-such-model", "prompt": "x"}, "headers": limited}),
            ("/v1/completions", {"json": {"model": model, "prompt": "x"}, "headers": limited}),  # over
            ("/v1/chat/completions", {"json": chat}),
            ("/v1/chat/completions", {"json": {**chat, "twinkle": {}}}),
            ("/v1/completions", {"content": b"{not json", "headers": {**owner, **json_type}}),
            ("/v1/completions", {"content": b'{"model": "m", "prompt": "x"}'}),  # no content type
            ("/v1/completions", {"json": {"model": model, "prompt": "x"}, "headers": {}}),  # no token
            ("/v1/completions", {"json": {"model": model}, "headers": {}}),  # no token, a bad body
        ]
        out = []
        for path, request in requests:
            request.setdefault("headers", owner)
            response = api.client.post(path, **request)
            headers = {
                k: v for k, v in response.headers.items() if k.startswith("x-ratelimit") or k == "retry-after"
            }
            out.append((path, response.status_code, response.json(), headers))
        return out

    short = answers(api.token("gen", rate_limit_per_minute=3))
    assert [status for _, status, _, _ in short] == [503, 400, 404, 429, 503, 400, 400, 400, 401, 401]
    assert [h.get("x-ratelimit-remaining") for _, _, _, h in short[:4]] == ["2", "1", "0", "0"]
    # FastAPI's solver ran for the bodies that do not validate, and only for them: `n: 0`, the
    # one without a content type, and the one without a token (the token is refused inside the
    # solver). The malformed JSON fails before it; the reserved key is refused by the endpoint.
    assert solved == ["/v1/completions"] * 3, solved

    api.app.dependency_overrides[lambda: None] = lambda: None  # FastAPI's handler for everything
    try:
        fastapi_way = answers(api.token("gen", rate_limit_per_minute=3))
    finally:
        api.app.dependency_overrides.clear()
    assert short == fastapi_way


def test_the_generation_endpoints_are_tried_before_the_other_routers(api: Api) -> None:
    # The router tries routes in order and every generation request waits for its scan
    # (server/app.py); the document keeps its sections in reading order all the same.
    def position(path: str, method: str) -> int:
        scope = {
            "type": "http",
            "path": path,
            "method": method,
            "root_path": "",
            "headers": [],
            "app": api.app,
        }
        for index, route in enumerate(api.app.router.routes):
            if route.matches(scope)[0] == Match.FULL:
                return index
        raise AssertionError(f"no route for {method} {path}")

    others = [
        ("/v1/jobs", "GET"),
        ("/v1/files", "GET"),
        ("/v1/projects", "GET"),
        ("/v1/fine_tuning/jobs", "GET"),
    ]
    first_other = min(position(path, method) for path, method in others)
    assert position("/v1/completions", "POST") < first_other
    assert position("/v1/chat/completions", "POST") < first_other
    tags = [tag["name"] for tag in api.app.openapi()["tags"]]
    assert tags.index("jobs") == 0 and tags.index("inference") > tags.index("files")
