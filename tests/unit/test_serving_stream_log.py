"""The serving host logs each streamed answer once, however it ends: also when its client left
before the stream's first chunk, so that the body iterator, which logs the others, never ran."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

import pytest
from starlette.types import Message

from serving import answers
from serving.app import GenerationStream
from serving.protocol import Answer, Choice
from serving.sampling import Delta


class Tokens:
    """A generation of fixed deltas (the engine's `Generation` protocol, without a model)."""

    def __init__(self, deltas: list[Delta]) -> None:
        self.deltas = deltas
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    async def __aiter__(self) -> AsyncIterator[Delta]:
        for delta in self.deltas:
            yield delta


def _lines(caplog: pytest.LogCaptureFixture, answer: Answer) -> list[str]:
    messages = [r.getMessage() for r in caplog.records if r.name == "serving.answers"]
    return [message for message in messages if message.startswith(answer.id)]


async def _never_disconnects() -> Message:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _respond(deltas: list[Delta], send_fails_at: str | None) -> tuple[Answer, Tokens, list[str]]:
    generation = Tokens(deltas)
    answer = Answer("cmpl", "ft:x", 3, [Choice()])
    sent: list[str] = []

    async def send(message: Message) -> None:
        if message["type"] == send_fails_at:
            raise OSError("the client has gone")
        sent.append(message["type"])

    stream = answers.stream_completion(generation, answer, include_usage=False)
    response = GenerationStream(stream, generation, answer)
    with contextlib.suppress(OSError):  # the server's send raised it: the client has gone
        await response({"type": "http"}, _never_disconnects, send)
    del stream, response
    gc.collect()  # a body iterator left at a chunk is finalized by the loop: its `finally` runs
    await asyncio.sleep(0.01)
    return answer, generation, sent


@pytest.mark.parametrize("fails_at", [None, "http.response.start", "http.response.body"])
def test_a_streamed_answer_is_logged_once_however_it_ends(
    caplog: pytest.LogCaptureFixture, fails_at: str | None
) -> None:
    caplog.set_level("INFO", logger="serving.answers")
    deltas = [Delta(0, "a", None, 1), Delta(0, " b", "length", 2)]

    answer, generation, sent = asyncio.run(_respond(deltas, fails_at))
    assert generation.cancelled  # the slot is freed however the answer ended
    [line] = _lines(caplog, answer)
    assert "(streamed)" in line
    if fails_at is None:
        assert sent[0] == "http.response.start" and sent[-1] == "http.response.body"
        assert "2 completion tokens, finish_reason length" in line
    else:
        assert "finish_reason none" in line  # cut short: its client left
