"""`client.inference`: chat and text completions, plain and streamed, over the OpenAI protocol.

Driven against the protocol's stand-in (tests/support/openai_standin.py) over real HTTP, so a
stream's early close is a real closed connection the server sees.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from openai_standin import BUSY, FINE_TUNED, JOB, RUNNING_JOB, TOKEN, Standin, serve_standin

from twinkle_client import APIError, StreamError, TwinkleClient, checkpoint_model
from twinkle_client.inference import message_text

USER = [{"role": "user", "content": "the cat sat on the mat"}]


@pytest.fixture(scope="module")
def standin() -> Iterator[Standin]:
    yield from serve_standin()


@pytest.fixture()
def client(standin: Standin, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwinkleClient]:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)  # no back-off waits
    with TwinkleClient(standin.url, TOKEN, backoff=0.001, max_retries=1) as c:
        yield c


def test_chat_sends_the_openai_body_and_returns_the_completion(
    client: TwinkleClient, standin: Standin
) -> None:
    answer = client.inference.chat(FINE_TUNED, USER, max_tokens=3, temperature=0.0, stop=["\n"], seed=7)
    assert answer["object"] == "chat.completion"
    assert message_text(answer) == "the cat sat "
    sent = standin.state.requests[-1]
    # Only what was given goes out; the server's defaults apply to the rest.
    assert sent == {
        "model": FINE_TUNED,
        "messages": USER,
        "max_tokens": 3,
        "temperature": 0.0,
        "stop": ["\n"],
        "seed": 7,
    }


def test_chat_stream_yields_deltas_until_done(client: TwinkleClient) -> None:
    with client.inference.chat(checkpoint_model(JOB, 4), USER, max_tokens=4, stream=True) as stream:
        deltas = list(stream)
    assert deltas == ["the ", "cat ", "sat ", "on "]
    assert stream.text == "the cat sat on "
    assert stream.finish_reasons == {0: "length"}
    assert stream.id and stream.model == f"{JOB}:ckpt-4"


def test_completions_plain_and_streamed_with_n(client: TwinkleClient) -> None:
    answer = client.inference.completions(FINE_TUNED, "one two three", max_tokens=2, n=2)
    assert [message_text(answer, i) for i in (0, 1)] == ["one two ", "one two "]
    stream = client.inference.completions(FINE_TUNED, "one two three", max_tokens=2, n=2, stream=True)
    assert "".join(stream) == "one one two two "  # the choices' deltas interleave
    assert stream.texts == {0: "one two ", 1: "one two "}


def test_leaving_a_stream_early_stops_the_generation(client: TwinkleClient, standin: Standin) -> None:
    prompt = [{"role": "user", "content": " ".join(["word"] * 40)}]
    stream = client.inference.chat(FINE_TUNED, prompt, max_tokens=20, stream=True)
    assert next(stream) == "word "
    assert standin.state.active == 1
    stream.close()  # closes the connection: the server stops writing
    deadline = time.monotonic() + 5
    while standin.state.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert standin.state.active == 0


@pytest.mark.parametrize(
    ("model", "status", "param"),
    [("ft:nope:job-missing", 404, "model"), (BUSY, 503, None)],
)
def test_errors_carry_the_envelope(client: TwinkleClient, model: str, status: int, param: str | None) -> None:
    with pytest.raises(APIError) as exc:
        client.inference.chat(model, USER, stream=True)
    assert (exc.value.status_code, exc.value.param) == (status, param)


def test_a_prompt_over_the_context_is_400_naming_the_field(client: TwinkleClient) -> None:
    with pytest.raises(APIError) as exc:
        client.inference.completions(FINE_TUNED, "x", max_tokens=100)
    assert (exc.value.status_code, exc.value.param) == (400, "prompt")


def test_models_lists_what_the_project_may_call(client: TwinkleClient) -> None:
    assert FINE_TUNED in {m["id"] for m in client.inference.models()}


def test_job_model_is_the_fine_tuned_model_once_succeeded(client: TwinkleClient) -> None:
    assert client.inference.job_model(JOB) == FINE_TUNED
    assert client.inference.job_model(RUNNING_JOB) is None


def test_an_error_inside_a_stream_raises_stream_error(client: TwinkleClient) -> None:
    stream = client.inference.completions(FINE_TUNED, "fine then BREAK", max_tokens=8, stream=True)
    with pytest.raises(StreamError) as exc:
        for _ in stream:
            pass
    assert exc.value.code == "generation_failed" and stream.text == "fine then "
