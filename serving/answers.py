"""One request's answer from the engine's deltas: a whole JSON body, or Server-Sent Events.

Streams are sent as OpenAI sends them, `data: {chunk}\n\n` per event and `data: [DONE]\n\n` at
the end. Whatever ends the stream (the last token, a client that went away, an error), the
generation is cancelled on the way out, which frees its slot. An error after the first byte can
no longer change the status: it is sent as an `error` event in the envelope, then the stream
closes without `[DONE]`, so a client cannot take a broken answer for a whole one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from serving.engine import Generation
from serving.errors import ServingError
from serving.protocol import Answer

log = logging.getLogger(__name__)

DISCONNECT_POLL_SECONDS = 0.25


def log_answered(answer: Answer, how: str) -> None:
    """One line per answer once it has ended. The host runs without uvicorn's access log, which
    wrote its line as the answer started, between the generation's start and its first token;
    this one says more (the tokens, how the choices ended, the time) and comes after the answer.
    A finish reason `none` is a choice cut short: its client left, or generation failed."""
    usage = answer.usage()
    log.info(
        "%s for %s (%s): %d prompt + %d completion tokens, finish_reason %s, %.2f s",
        answer.id,
        answer.model,
        how,
        usage["prompt_tokens"],
        usage["completion_tokens"],
        ",".join(sorted({choice.finish_reason or "none" for choice in answer.choices})),
        time.monotonic() - answer.began,
    )


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def collect(generation: Generation, answer: Answer, gone: Callable[[], Awaitable[bool]]) -> Answer:
    """The whole answer. `gone` says whether the client has left: a whole answer has no body
    to break off while it is generated, so it is asked every DISCONNECT_POLL_SECONDS, and a
    client that left (its own timeout, the API server's relay closing) cancels the generation
    instead of holding a slot to max_tokens for nobody."""

    async def watch() -> None:
        while not await gone():
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)
        generation.cancel()

    watcher = asyncio.create_task(watch())
    try:
        async for delta in generation:
            choice = answer.choices[delta.index]
            choice.text += delta.text
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason
                choice.completion_tokens = delta.completion_tokens
    finally:
        watcher.cancel()
        generation.cancel()
        log_answered(answer, "whole")
    return answer


async def _stream(
    generation: Generation,
    answer: Answer,
    first: list[dict[str, Any]],
    chunk: Callable[[int, str, str | None], dict[str, Any]],
    usage_kind: str | None,
) -> AsyncIterator[bytes]:
    try:
        for event in first:
            yield sse(event)
        async for delta in generation:
            choice = answer.choices[delta.index]
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason
                choice.completion_tokens = delta.completion_tokens
            yield sse(chunk(delta.index, delta.text, delta.finish_reason))
        if usage_kind is not None:
            yield sse(answer.usage_chunk(usage_kind))
        yield sse("[DONE]")
    except ServingError as exc:
        yield sse({"error": {"type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param}})
    except Exception:
        log.exception("generation failed mid-stream")
        error = {"type": "api_error", "code": "internal_error", "message": "generation failed", "param": None}
        yield sse({"error": error})
    finally:
        generation.cancel()
        log_answered(answer, "streamed")


def stream_chat(generation: Generation, answer: Answer, include_usage: bool) -> AsyncIterator[bytes]:
    def chunk(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        if finish_reason is None:
            return answer.chat_chunk(index, {"content": text}, None)
        # OpenAI ends a choice with an empty delta; text that came with the end goes before it.
        delta = {"content": text} if text else {}
        return answer.chat_chunk(index, delta, finish_reason)

    # Each choice opens with its role, as OpenAI's first chunks do.
    first = [
        answer.chat_chunk(i, {"role": "assistant", "content": ""}, None) for i in range(len(answer.choices))
    ]
    kind = "chat.completion.chunk" if include_usage else None
    return _stream(generation, answer, first, chunk, kind)


def stream_completion(generation: Generation, answer: Answer, include_usage: bool) -> AsyncIterator[bytes]:
    kind = "text_completion" if include_usage else None
    return _stream(generation, answer, [], answer.text_chunk, kind)
