"""The job page's playground in Chromium: a prompt in, the answer streamed out of
`/v1/chat/completions` (fetch + ReadableStream on the SSE body), the choice of model among the
job's final model and checkpoints, Stop aborting the stream, and errors shown from the envelope.

The panel's behaviour is driven against the OpenAI protocol's stand-in
(tests/support/openai_standin.py, served beside the dashboard's own static files), which writes a
word per tick and counts the streams it is still writing, so the test sees that Stop closed the
connection on the server's side. Then the whole path, once: a real server, worker and serving
host, a tiny job trained to success, and its model answering in the dashboard, in
`twinkle-jobs chat` and in `client.inference` exactly as the API answers it whole.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from live_service import TOKEN as LIVE_TOKEN
from live_service import LiveService, tiny_spec
from openai_standin import BUSY, FINE_TUNED, JOB, TOKEN, Standin, State, make_app, serve_standin
from test_dashboard import sign_in

from server.dashboard.router import router
from twinkle_cli.stack import free_port
from twinkle_client import TwinkleClient, checkpoint_model

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
        """async ([token, job, model]) => {
            localStorage.setItem("twinkle.apiToken", token);
            const { PlaygroundPanel } = await import("/dashboard/static/views/playground.js");
            window.playground = new PlaygroundPanel(job);
            document.body.append(window.playground.el);
            await window.playground.refresh({ status: "succeeded", fine_tuned_model: model });
        }""",
        [TOKEN, JOB, FINE_TUNED],
    )
    return page


def test_choice_of_model_final_then_checkpoints(panel: Any) -> None:
    options = panel.eval_on_selector_all(".playground select[name=model] option", OPTIONS_JS)
    assert options == [
        [FINE_TUNED, "Final model"],
        [f"{JOB}:ckpt-4", "Checkpoint · step 4"],
        [f"{JOB}:ckpt-2", "Checkpoint · step 2"],
    ]
    # The chosen model's name, to call it from code, follows the choice.
    assert panel.text_content(".playground [data-role=model-name]") == FINE_TUNED
    panel.select_option(".playground select[name=model]", f"{JOB}:ckpt-2")
    assert panel.text_content(".playground [data-role=model-name]") == f"{JOB}:ckpt-2"


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


# ------------------------------------------------------------------------- the whole path
@dataclass
class Served:
    service: LiveService
    job_id: str
    model: str  # the job's fine_tuned_model


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Served]:
    """Server, worker and serving host as a user runs them; one tiny job trained to success."""
    from twinkle_core.assets import write_text_dataset

    tmp = tmp_path_factory.mktemp("playground")
    service = LiveService.configure(tmp, [tiny_model_dir], TWINKLE_SERVING_PORT=str(free_port()))
    try:
        # The worker and the host wait for the server's migrations: starting them first overlaps
        # their imports with the server's start-up.
        service.start_worker()
        service._spawn(["serve"], "serve.log")
        service.start_server()
        spec = tiny_spec(tiny_model_dir, write_text_dataset(tmp / "train.jsonl", n=16), steps=2, nproc=1)
        spec["training"]["save_every"] = 1
        with service.client() as api:
            job = api.post("/v1/jobs", json={"name": "playground", "spec": spec}).json()
            done = service.wait_terminal(job["id"], timeout=240)
            assert done["status"] == "succeeded", service.worker_log()
            model = api.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["fine_tuned_model"]
            assert done["fine_tuned_model"] == model  # the native job names what OpenAI's calls it
        yield Served(service, job["id"], model)
    finally:
        service.stop()


def whole_answer(served: Served, model: str, content: str, max_tokens: int) -> str:
    """The API's non-streamed answer (greedy): what every streamed surface must add up to. Asked
    until the host is up and has the model loaded (503 with Retry-After meanwhile)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    deadline = time.monotonic() + 120
    with served.service.client() as api:
        while True:
            response = api.post("/v1/chat/completions", json=body, timeout=120)
            if response.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(float(response.headers.get("Retry-After", "1")))
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.mark.slow  # trains a job with torchrun
def test_the_playground_answers_with_the_trained_model(served: Served, page: Any) -> None:
    expected = whole_answer(served, served.model, "the cat", 12)
    sign_in(page, served.service.url, LIVE_TOKEN)
    page.wait_for_url(re.compile(r"#/jobs"))
    page.goto(f"{served.service.url}/#/jobs/{served.job_id}")
    page.wait_for_selector(f'.playground option[value="{served.model}"]', state="attached")
    options = page.eval_on_selector_all(".playground select[name=model] option", OPTIONS_JS)
    assert options == [
        [served.model, "Final model"],
        [checkpoint_model(served.job_id, 2), "Checkpoint · step 2"],
        [checkpoint_model(served.job_id, 1), "Checkpoint · step 1"],
    ]
    page.fill(".playground input[name=temperature]", "0")
    page.fill(".playground input[name=max_tokens]", "12")
    page.fill(".playground textarea[name=prompt]", "the cat")
    page.click(".playground [data-action=send]")
    page.wait_for_selector('.playground-status[data-state="done"]', timeout=60_000)
    assert page.text_content(".playground-answer") == expected  # streamed = whole, token by token


@pytest.mark.slow  # trains a job with torchrun
def test_the_cli_and_the_client_answer_the_same(served: Served) -> None:
    expected = whole_answer(served, checkpoint_model(served.job_id, 1), "a robot", 8)
    env = {**os.environ, "TWINKLE_URL": served.service.url, "TWINKLE_TOKEN": LIVE_TOKEN}
    chat = [sys.executable, "-m", "twinkle_cli.main", "chat", served.job_id]
    one_shot = [*chat, "--checkpoint", "1", "-p", "a robot", "--max-tokens", "8", "--temperature", "0"]
    result = subprocess.run(one_shot, env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (0, expected + "\n"), result.stderr

    missing = subprocess.run([*chat, "--checkpoint", "9", "-p", "x"], env=env, capture_output=True, text=True)
    assert missing.returncode == 4 and "no complete checkpoint at step 9" in missing.stderr

    with TwinkleClient(served.service.url, LIVE_TOKEN) as client:
        assert client.inference.job_model(served.job_id) == served.model
        messages = [{"role": "user", "content": "a robot"}]
        stream = client.inference.chat(
            checkpoint_model(served.job_id, 1), messages, stream=True, max_tokens=8, temperature=0
        )
        assert "".join(stream) == expected and stream.finish_reasons[0] in ("stop", "length")
