"""A stand-in for the OpenAI inference protocol, for the client's and `twinkle-jobs chat`'s tests.

It plays the API server's side of the contract (docs/openai-compat.md): `/v1/models`,
`/v1/chat/completions` and `/v1/completions` answering as OpenAI does (JSON, or SSE chunks ending
in `data: [DONE]`), errors in the service's envelope, and `/v1/jobs/{id}` for a job's
`fine_tuned_model`. It stands in for the *protocol*, not for our server: it generates by echoing
words of the prompt, so answers are predictable. The real endpoints are tested end to end in the
integration and browser tests.

A stream writes one word every `state.token_delay` seconds and counts itself in `state.active` while it
runs, so a test can see a closed client stop the generation. A whole answer to a prompt with the
word `SLOW` does the same before it answers (counted, and stopped by a closed client).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN = "tw-standin"
JOB = "job-standin1"
RUNNING_JOB = "job-standin2"
FAILED_JOB = "job-standin3"  # failed before its first checkpoint
FINE_TUNED = f"ft:tiny-llama:{JOB}"
CHECKPOINTS: dict[str, list[int]] = {JOB: [2, 4], RUNNING_JOB: [2], FAILED_JOB: []}
STATUSES = {JOB: "succeeded", RUNNING_JOB: "running", FAILED_JOB: "failed"}
BUSY = f"{JOB}:ckpt-2"  # a model that is "still loading": 503 with Retry-After
CONTEXT = 64  # words
TOKEN_DELAY = 0.02


@dataclass
class State:
    active: int = 0  # streams generating now
    token_delay: float = TOKEN_DELAY
    requests: list[dict[str, Any]] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)  # each request's client port: its connection


def _error(
    status: int, message: str, param: str | None, code: str, headers: dict[str, str] | None = None
) -> Any:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    body = {
        "error": {"type": kind.get(status, "unavailable"), "code": code, "message": message, "param": param}
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _known(model: str) -> bool:
    if model == FINE_TUNED:
        return True
    job, _, step = model.partition(":ckpt-")
    return step.isdigit() and int(step) in CHECKPOINTS.get(job, [])


def _words(body: dict[str, Any]) -> list[str]:
    """The prompt's words: what this stand-in "generates" back, cut at `stop` and `max_tokens`."""
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    words = [f"{w} " for w in text.split()] or ["(empty) "]
    return words[: int(body.get("max_tokens") or 16)]


class _TokenCheck:
    """The bearer token on /v1/, as plain ASGI: a `BaseHTTPMiddleware` would keep a client's
    disconnect from the endpoints' `request.is_disconnected()`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        protected = scope["type"] == "http" and scope["path"].startswith("/v1/")
        if protected and dict(scope["headers"]).get(b"authorization") != f"Bearer {TOKEN}".encode():
            await _error(401, "missing or invalid token", None, "invalid_token")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def make_app(state: State) -> FastAPI:
    app = FastAPI()

    app.add_middleware(_TokenCheck)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = [FINE_TUNED, *(f"{j}:ckpt-{s}" for j, steps in CHECKPOINTS.items() for s in steps)]
        return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "proj-1"} for n in names]}

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str) -> Any:
        if job_id not in CHECKPOINTS:
            return _error(404, f"job {job_id} not found", "job_id", "not_found")
        status = STATUSES[job_id]
        return {
            "id": job_id,
            "object": "job",
            "status": status,
            "terminal": status != "running",
            "fine_tuned_model": FINE_TUNED if status == "succeeded" else None,
        }

    @app.get("/v1/jobs/{job_id}/checkpoints")
    async def checkpoints(job_id: str) -> Any:
        if job_id not in CHECKPOINTS:
            return _error(404, f"job {job_id} not found", "job_id", "not_found")
        data = [{"id": f"ckpt-{s}", "step": s} for s in reversed(CHECKPOINTS[job_id])]
        return {"object": "list", "data": data, "has_more": False}

    async def complete(request: Request, kind: str) -> Any:
        body = await request.json()
        state.requests.append(body)
        state.peers.append(request.client.port if request.client else 0)
        model = str(body.get("model", ""))
        field_name = "messages" if kind == "chat" else "prompt"
        if not _known(model):
            return _error(404, f"The model '{model}' does not exist", "model", "model_not_found")
        if model == BUSY:
            return _error(503, "the model is loading", None, "model_loading", {"Retry-After": "1"})
        words = _words(body)
        prompt_words = len(json.dumps(body.get(field_name, "")).split())
        if prompt_words + int(body.get("max_tokens") or 16) > CONTEXT:
            return _error(
                400, "prompt + max_tokens exceed the context", field_name, "context_length_exceeded"
            )
        n = int(body.get("n") or 1)
        created, cid = int(time.time()), f"cmpl-{len(state.requests)}"
        obj = "chat.completion" if kind == "chat" else "text_completion"
        if not body.get("stream"):
            if "SLOW " in words:  # a whole answer that takes a while, as a real one does
                state.active += 1
                try:
                    for _ in words:
                        if await request.is_disconnected():
                            return _error(499, "the client left", None, "client_closed")
                        await asyncio.sleep(state.token_delay)
                finally:
                    state.active -= 1
            text = "".join(words)
            choices = [
                {"index": i, "finish_reason": "length", "logprobs": None}
                | ({"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text})
                for i in range(n)
            ]
            usage = {"prompt_tokens": prompt_words, "completion_tokens": len(words) * n}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return {
                "id": cid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage,
            }

        async def chunks() -> AsyncIterator[str]:
            def chunk(index: int, text: str | None, finish: str | None) -> str:
                if kind == "chat":
                    choice: dict[str, Any] = {
                        "index": index,
                        "delta": {} if text is None else {"content": text},
                    }
                else:
                    choice = {"index": index, "text": text or ""}
                choice["finish_reason"] = finish
                body = {"id": cid, "object": f"{obj}.chunk", "created": created, "model": model}
                return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n"

            state.active += 1
            try:
                for word in words:
                    if word == "BREAK ":  # the host failing mid-answer: an error chunk, then the end
                        error = {"type": "api_error", "code": "generation_failed", "message": "it broke"}
                        yield f"data: {json.dumps({'error': error})}\n\n"
                        return
                    for i in range(n):
                        yield chunk(i, word, None)
                    await asyncio.sleep(state.token_delay)
                for i in range(n):
                    yield chunk(i, None, "length")
                yield "data: [DONE]\n\n"
            finally:
                state.active -= 1

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, "text")

    return app


@dataclass
class Standin:
    url: str
    state: State


def serve_standin(app: FastAPI | None = None, state: State | None = None) -> Iterator[Standin]:
    """Run the stand-in (or `app` built on `make_app(state)`) on a free port in a thread until
    the generator is closed."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = state or State()
    app = app or make_app(state)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.01)
    try:
        yield Standin(f"http://127.0.0.1:{port}", state)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
