"""The job page's playground in Chromium: a prompt in, the answer streamed out of
`/v1/chat/completions` (fetch + ReadableStream on the SSE body), the choice of model among the
job's final model and checkpoints, Stop aborting the stream, and errors shown from the envelope.

The panel runs against the OpenAI protocol's stand-in (tests/support/openai_standin.py, served
beside the dashboard's own static files), which writes a word per tick and counts the streams it
is still writing, so the test sees that Stop closed the connection on the server's side.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai_standin import BUSY, FINE_TUNED, JOB, TOKEN, Standin, State, make_app, serve_standin

from server.dashboard.router import router

OPTIONS_JS = "els => els.map((o) => [o.value, o.textContent])"


@pytest.fixture(scope="module")
def standin() -> Iterator[Standin]:
    state = State()
    app = make_app(state)
    app.include_router(router)  # the dashboard's modules, from the same origin
    yield from serve_standin(app, state)


@pytest.fixture()
def panel(page: Any, standin: Standin) -> Any:
    """A blank page of the dashboard's origin with the playground of JOB mounted in it."""
    blank = f"{standin.url}/__blank__"
    page.route(blank, lambda route: route.fulfill(content_type="text/html", body="<!doctype html><body>"))
    page.goto(blank)
    page.evaluate(
        """async ([token, job]) => {
            localStorage.setItem("twinkle.apiToken", token);
            const { PlaygroundPanel } = await import("/dashboard/static/views/playground.js");
            window.playground = new PlaygroundPanel(job);
            document.body.append(window.playground.el);
            await window.playground.refresh({ status: "succeeded" });
        }""",
        [TOKEN, JOB],
    )
    return page


def test_choice_of_model_final_then_checkpoints(panel: Any) -> None:
    options = panel.eval_on_selector_all(".playground select[name=model] option", OPTIONS_JS)
    assert options == [
        [FINE_TUNED, "Final model"],
        [f"{JOB}:ckpt-4", "Checkpoint · step 4"],
        [f"{JOB}:ckpt-2", "Checkpoint · step 2"],
    ]


def test_the_answer_streams_in(panel: Any, standin: Standin) -> None:
    panel.select_option(".playground select[name=model]", f"{JOB}:ckpt-4")
    panel.fill(".playground input[name=temperature]", "0")
    panel.fill(".playground input[name=max_tokens]", "5")
    panel.fill(".playground textarea[name=prompt]", "one two three four five six")
    panel.click(".playground [data-action=send]")
    panel.wait_for_selector('.playground-status[data-state="done"]')
    assert panel.text_content(".playground-answer") == "one two three four five "
    assert "Done (length)" in panel.inner_text(".playground-status")
    sent = standin.state.requests[-1]
    assert sent["model"] == f"{JOB}:ckpt-4" and sent["stream"] is True
    assert (sent["temperature"], sent["max_tokens"]) == (0, 5)
    assert sent["messages"] == [{"role": "user", "content": "one two three four five six"}]


def test_stop_aborts_the_stream_and_frees_the_server(panel: Any, standin: Standin) -> None:
    standin.state.token_delay = 0.2  # 20 words: 4 s unless stopped
    try:
        panel.fill(".playground input[name=max_tokens]", "20")
        panel.fill(".playground textarea[name=prompt]", " ".join(f"w{i}" for i in range(30)))
        panel.click(".playground [data-action=send]")
        panel.wait_for_selector('.playground-status[data-state="streaming"]')
        assert standin.state.active == 1
        panel.click(".playground [data-action=stop]")
        panel.wait_for_selector('.playground-status[data-state="stopped"]')
        deadline = time.monotonic() + 5
        while standin.state.active and time.monotonic() < deadline:
            time.sleep(0.02)
        assert standin.state.active == 0  # the server saw the connection close
        answer = panel.inner_text(".playground-answer")
        assert answer.startswith("w0") and "w19" not in answer
        assert panel.is_enabled(".playground [data-action=send]")
    finally:
        standin.state.token_delay = 0.02


def test_errors_show_the_envelope(panel: Any) -> None:
    panel.select_option(".playground select[name=model]", BUSY)  # "loading": 503
    panel.fill(".playground textarea[name=prompt]", "hello")
    panel.click(".playground [data-action=send]")
    panel.wait_for_selector(".playground .error-box")
    text = panel.inner_text(".playground .error-box")
    assert "Inference is unavailable right now" in text and "the model is loading" in text

    panel.select_option(".playground select[name=model]", FINE_TUNED)
    panel.fill(".playground input[name=max_tokens]", "500")  # over the stand-in's context: 400
    panel.click(".playground [data-action=send]")
    panel.wait_for_selector(".playground .error-box >> text=exceed the context")
    panel.fill(".playground input[name=max_tokens]", "4")
    panel.click(".playground [data-action=send]")
    panel.wait_for_selector('.playground-status[data-state="done"]')
    assert panel.locator(".playground .error-box").count() == 0  # a new answer clears the error
