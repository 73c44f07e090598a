"""The dashboard's JavaScript modules, run in Chromium against the real JobSpec schema.

Only the dashboard router (and a test event stream) is served, no database or worker, so these
run in seconds: the SSE parser and its reconnection with Last-Event-ID, the schema-driven form
(defaults left out, client-side checks, server errors placed at their field) and the charts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import Response

from server.dashboard.router import router
from server.errors import install_error_handlers
from twinkle_cli.stack import free_port

STREAM_EVENTS = 5
STREAM_BATCH = 2  # events per connection: the client has to reconnect to get them all
stream_requests: list[dict[str, str | None]] = []


def add_test_stream(app: FastAPI) -> None:
    """An event stream that closes after every STREAM_BATCH events, like a server restarting."""

    @app.get("/test/events")
    def events(request: Request, last_event_id: Annotated[str | None, Header()] = None) -> Response:
        stream_requests.append({"authorization": request.headers.get("authorization"), "last": last_event_id})
        start = int(last_event_id or 0)
        chunks = ["retry: 10\n\n"]
        for i in range(start + 1, min(start + STREAM_BATCH, STREAM_EVENTS) + 1):
            event = {"id": i, "type": "metrics", "message": f"step {i}", "data": {"step": i}}
            chunks.append(f"id: {i}\nevent: metrics\ndata: {json.dumps(event)}\n\n")
        return Response("".join(chunks), media_type="text/event-stream")


@pytest.fixture(scope="module")
def static_url() -> Iterator[str]:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    add_test_stream(app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the static server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture()
def js(page: Any, static_url: str) -> Any:
    """Evaluate an async function body with the dashboard's modules imported as `m.<file>`."""
    # An empty HTML page of the dashboard's origin (modules import by absolute path); the app
    # itself never starts.
    blank = f"{static_url}/__blank__"
    page.route(
        blank, lambda route: route.fulfill(content_type="text/html", body="<!doctype html><body></body>")
    )
    page.goto(blank)

    def run(body: str, arg: Any = None) -> Any:
        script = f"""async (arg) => {{
            const load = (name) => import(`/dashboard/static/lib/${{name}}.js`);
            const m = {{
                sse: await load("sse"), schema: await load("schema"), form: await load("schema-form"),
                chart: await load("chart"), format: await load("format"),
            }};
            {body}
        }}"""
        return page.evaluate(script, arg)

    return run


def test_sse_parser_handles_split_chunks_comments_and_ids(js: Any) -> None:
    events = js(
        """
        const p = new m.sse.SseParser();
        const out = [];
        const chunks = [
            "retry: 2000\\n\\n: keep-alive\\n\\nid: 7\\nevent: metrics\\nda",
            "ta: {\\"a\\":1}\\r",
            "\\n\\r\\nid: 8\\ndata: line1\\ndata: line2\\n\\n",
            "event: end\\ndata: {}\\n\\n",
        ];
        for (const chunk of chunks) {
            out.push(...p.push(chunk));
        }
        return {out, retry: p.retry};
        """
    )
    assert events["retry"] == 2000
    assert events["out"] == [
        {"id": "7", "event": "metrics", "data": '{"a":1}'},
        {"id": "8", "event": "message", "data": "line1\nline2"},
        {"id": "8", "event": "end", "data": "{}"},  # an event without id keeps the last one
    ]


def test_event_stream_reconnects_with_last_event_id(js: Any) -> None:
    stream_requests.clear()
    result = js(
        """
        localStorage.setItem("twinkle.apiToken", "tw-stream-test");
        const got = [];
        const states = [];
        await m.sse.followEventStream("/test/events", {
            onEvent: (event) => got.push(event.id),
            onState: (state) => states.push(state),
            shouldReconnect: () => got.length < arg,
        });
        localStorage.clear();
        return {got, states};
        """,
        STREAM_EVENTS,
    )
    assert result["got"] == [1, 2, 3, 4, 5]  # every event once, in order
    assert result["states"][0] == "live" and result["states"][-1] == "closed"
    assert [r["last"] for r in stream_requests] == [None, "2", "4"]
    assert {r["authorization"] for r in stream_requests} == {"Bearer tw-stream-test"}


def test_schema_kinds_of_the_jobspec(js: Any) -> None:
    kinds = js(
        """
        const spec = m.schema.resolveRefs(await (await fetch("/dashboard/api/jobspec-schema")).json());
        const kind = (section, key) => {
            const sectionSchema = m.schema.classify(spec.properties[section]).schema;
            const c = m.schema.classify(sectionSchema.properties[key]);
            return [c.kind, c.nullable];
        };
        return {
            adapter: ((c) => [c.kind, c.nullable])(m.schema.classify(spec.properties.adapter)),
            target_modules: kind("adapter", "target_modules"),
            mixed_precision: kind("model", "mixed_precision"),
            config: kind("model", "config"),
            device_mesh: kind("model", "device_mesh"),
            max_steps: kind("training", "max_steps"),
            betas: kind("optimizer", "betas"),
            packing: kind("data", "packing"),
            noRefsLeft: !JSON.stringify(spec).includes("$ref"),
        };
        """
    )
    assert kinds == {
        "adapter": ["object", True],
        "target_modules": ["list-or-keyword", False],
        "mixed_precision": ["enum", False],
        "config": ["dict", True],
        "device_mesh": ["object", True],
        "max_steps": ["integer", True],
        "betas": ["tuple", False],
        "packing": ["boolean", False],
        "noRefsLeft": True,
    }


def test_parse_input_checks_like_the_server(js: Any) -> None:
    results = js(
        """
        const p = (text, schema) => m.schema.parseInput(text, schema.type || "enum", schema);
        return [
            p("1", {type: "integer", minimum: 8}),
            p("1.5", {type: "integer"}),
            p("0", {type: "number", exclusiveMinimum: 0}),
            p("1e-3", {type: "number", exclusiveMinimum: 0, exclusiveMaximum: 10}),
            p("fp32", {enum: ["no", "bf16"]}),
            p("bad name!", {type: "string", pattern: "^[A-Za-z0-9_.-]{1,64}$"}),
            p("[1]", {type: "dict"}),
            p("  ", {type: "integer"}),
        ];
        """
    )
    assert results == [
        {"error": "must be greater than or equal to 8"},
        {"error": "must be a whole number"},
        {"error": "must be greater than 0"},
        {"value": 0.001},
        {"error": "must be one of no, bf16"},
        {"error": "must match the pattern ^[A-Za-z0-9_.-]{1,64}$"},
        {"error": 'must be a JSON object, e.g. {"key": 1}'},
        {"empty": True},
    ]


FORM_SETUP = """
    const get = async (path) => (await fetch(path)).json();
    const form = new m.form.SchemaForm({
        specSchema: await get("/dashboard/api/jobspec-schema"),
        jobFieldsSchema: await get("/dashboard/api/job-fields-schema"),
    });
    document.body.replaceChildren(form.el);
    const set = (path, value) => {
        const el = document.querySelector(`[name="${path}"]`);
        if (el.type === "checkbox") el.checked = value; else el.value = value;
        el.dispatchEvent(new Event("change"));
    };
"""


def test_form_sends_only_what_differs_from_the_defaults(js: Any) -> None:
    bodies = js(
        FORM_SETUP
        + """
        const untouched = form.values();
        set("spec.model.model_id", "/models/tiny");
        set("spec.data.train_file", "/data/train.jsonl");
        const minimal = form.values().body;
        set("spec.training.max_steps", "6");
        set("spec.optimizer.betas.1", "0.95");
        set("spec.model.kwargs", '{"attn_implementation": "eager"}');
        set("spec.adapter.__enabled", true);
        document.querySelector('[name="spec.adapter.__enabled"]').dispatchEvent(new Event("change"));
        set("spec.adapter.target_modules", "q_proj, v_proj");
        set("priority", "5");
        const edited = form.values().body;
        return {untouched: untouched.error, minimal, edited};
        """
    )
    assert bodies["untouched"]  # the train file is required
    assert bodies["minimal"] == {
        "spec": {"model": {"model_id": "/models/tiny"}, "data": {"train_file": "/data/train.jsonl"}}
    }
    assert bodies["edited"] == {
        "priority": 5,
        "spec": {
            "model": {"model_id": "/models/tiny", "kwargs": {"attn_implementation": "eager"}},
            "adapter": {"type": "lora", "target_modules": ["q_proj", "v_proj"]},
            "data": {"train_file": "/data/train.jsonl"},
            "training": {"max_steps": 6},
            "optimizer": {"betas": [0.9, 0.95]},
        },
    }


def test_form_round_trips_a_resolved_spec(js: Any) -> None:
    """ "Edit & resubmit" fills the form from a stored job: explicit nulls stay null."""
    body = js(
        FORM_SETUP
        + """
        form.fill({name: "run-2", priority: 1, spec: {
            model: {model_id: "/m", mixed_precision: "no", config: null},
            data: {train_file: "/d", max_length: 64},
            training: {save_total_limit: null, max_steps: 10},
            adapter: {type: "lora", r: 16},
        }});
        return form.values().body;
        """
    )
    assert body == {
        "name": "run-2",
        "priority": 1,
        "spec": {
            "model": {"model_id": "/m", "mixed_precision": "no"},
            "adapter": {"type": "lora", "r": 16},
            "data": {"train_file": "/d", "max_length": 64},
            "training": {"max_steps": 10, "save_total_limit": None},
        },
    }


def test_server_errors_land_at_the_named_field_or_its_section(js: Any) -> None:
    placed = js(
        FORM_SETUP
        + """
        const where = (param, message) => {
            form.clearErrors();
            const node = form.showServerError(param, message);
            return node ? node.path : (form.banner.hidden ? null : "banner");
        };
        return [
            where("spec.model.mixed_precision", "bad precision"),
            where("spec.model.device_mesh.dp_size", "bad mesh"),
            where("spec.adapter.r", "bad rank"),
            document.querySelector('[name="spec.adapter.__enabled"]').checked,
            where("spec.training.no_such_field", "unknown field"),
            where("spec", "batch size not divisible"),
            where(null, "rate limited"),
            document.querySelector('[data-path="spec.model.mixed_precision"] .field-error').hidden,
        ];
        """
    )
    assert placed == [
        "spec.model.mixed_precision",
        "spec.model.device_mesh.dp_size",
        "spec.adapter.r",
        True,  # the switched-off adapter section was opened to show its field's message
        "spec.training",
        "banner",
        "banner",
        True,  # clearErrors() hid the earlier message
    ]


def test_line_chart_draws_one_vertex_per_point(js: Any) -> None:
    drawn = js(
        """
        const svg = m.chart.lineChart({width: 400, height: 200, series: [
            {name: "loss", points: [[1, 5.9], [2, 5.7], [3, 5.6]]},
            {name: "eval_loss", points: [[3, 5.8]]},
        ]});
        const paths = [...svg.querySelectorAll("path")]
            .map((p) => [p.dataset.series, p.dataset.points, p.getAttribute("d")]);
        const empty = m.chart.lineChart({width: 300, height: 100, series: [{name: "x", points: []}]});
        return {paths, ticks: m.chart.niceTicks(0, 1, 5), empty: empty.textContent};
        """
    )
    (loss_name, loss_count, loss_d), (eval_name, eval_count, _) = drawn["paths"]
    assert (loss_name, loss_count, eval_name, eval_count) == ("loss", "3", "eval_loss", "1")
    assert loss_d.count("M") == 1 and loss_d.count("L") == 2
    assert drawn["ticks"] == [0, 0.2, 0.4, 0.6, 0.8, 1]
    assert "waiting for data" in drawn["empty"]
