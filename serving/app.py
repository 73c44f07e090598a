"""The host's HTTP app: OpenAI's `POST /v1/chat/completions` and `POST /v1/completions` for the
API server (authenticated by `Authorization: Bearer <serving secret>`), and `GET /healthz`.

Each request names its checkpoint in the `twinkle` key; the host checks it (targets.py), gets
the model from its cache (503 + Retry-After while it loads), renders and measures the prompt
(400 over the context), takes a slot (503 + Retry-After when none frees) and answers as OpenAI
does, streamed or whole.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from serving import answers
from serving.engine import Engine, Generation
from serving.errors import Unauthorized, install_error_handlers
from serving.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    Answer,
    ChatRequest,
    Choice,
    CompletionRequest,
    chat_prompt_ids,
    completion_prompt_ids,
)
from serving.targets import check_target

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RequestBody = TypeVar("RequestBody", bound=BaseModel)


async def parse_body(request: Request, model: type[RequestBody]) -> RequestBody:
    """The JSON body as `model`, validated straight from its bytes. A FastAPI body parameter (and
    the secret as a dependency) does the same through FastAPI's dependency machinery, on the path
    to every first token; the host publishes no OpenAPI document, so its generation endpoints are
    plain routes that parse for themselves. Errors take FastAPI's path (the 400 envelope naming
    the field).

    With `GenerationStream` below, this took 0.44 ms off the host's time to first token (median
    of 150 paired requests against the previous host, 95% CI 0.11-0.76 ms; ~30 ms in all)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


class GenerationStream(StreamingResponse):
    """Server-Sent Events of one generation, which is cancelled however the answer ends: also
    when the client left before the first chunk, and the body iterator (whose own `finally`
    cancels it too and logs the answer) never started; the answer is then logged here.

    Starlette's `__call__` runs the body and a disconnect listener in an anyio task group; this
    one sends the headers, then watches for the disconnect with a plain task, which leaves the
    loop less to do before the first token. A client that leaves cancels the generation, which
    ends within a token, and the stream with it."""

    def __init__(self, stream: AsyncIterator[bytes], generation: Generation, answer: Answer) -> None:
        super().__init__(stream, media_type="text/event-stream", headers=SSE_HEADERS)
        self.generation = generation
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher: asyncio.Task[None] | None = None
        iterated = False
        try:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)  # raises when the client has gone (ASGI 2.4)
            watcher = asyncio.create_task(self._cancel_on_disconnect(receive))
            iterated = True  # the first step below enters the body's `try`: its `finally` logs
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if watcher is not None:
                watcher.cancel()
            self.generation.cancel()
            if not iterated:
                answers.log_answered(self.answer, "streamed")

    async def _cancel_on_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.generation.cancel()


def create_app(
    engine: Engine,
    *,
    secret: str,
    jobs_root: Path,
    allowed_roots: Sequence[Path],
    owned_dirs: Sequence[Path] = (),
) -> FastAPI:
    app = FastAPI(title="Twinkle Jobs serving host", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    expected = f"Bearer {secret}".encode()

    def check_secret(request: Request) -> None:
        if not is_authorized(request.headers.get("authorization")):
            raise Unauthorized("the serving secret is missing or wrong")

    def is_authorized(authorization: str | None) -> bool:
        return authorization is not None and hmac.compare_digest(authorization.encode(), expected)

    @app.get("/healthz")
    async def healthz(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        # Open to a load balancer's probe; what is loaded (checkpoint paths) only with the secret.
        if not is_authorized(authorization):
            return {"status": "ok"}
        return {"status": "ok", **engine.health()}

    async def chat_completions(request: Request) -> Response:
        check_secret(request)
        body = await parse_body(request, ChatRequest)
        body.refuse_unsupported()
        target = check_target(body.twinkle, jobs_root, allowed_roots, owned_dirs)
        loaded = await engine.model(target)
        prompt = chat_prompt_ids(loaded.tokenizer, body.messages)
        params = body.sampling(len(prompt), loaded.context_length, param="messages", default=None)
        answer = Answer("chatcmpl", target.model, len(prompt), [Choice() for _ in range(params.n)])
        generation = await engine.start(loaded, [prompt], params)
        if body.stream:
            stream = answers.stream_chat(generation, answer, body.include_usage)
            return GenerationStream(stream, generation, answer)
        return JSONResponse(
            (await answers.collect(generation, answer, request.is_disconnected)).chat_completion()
        )

    async def completions(request: Request) -> Response:
        check_secret(request)
        body = await parse_body(request, CompletionRequest)
        body.refuse_unsupported()
        target = check_target(body.twinkle, jobs_root, allowed_roots, owned_dirs)
        loaded = await engine.model(target)
        texts = body.prompts
        prompts = [completion_prompt_ids(loaded.tokenizer, p, i, len(texts) > 1) for i, p in enumerate(texts)]
        longest = max(prompts, key=len)
        params = body.sampling(
            len(longest), loaded.context_length, param="prompt", default=COMPLETIONS_DEFAULT_MAX_TOKENS
        )
        choices = [Choice() for _ in range(len(prompts) * params.n)]
        answer = Answer("cmpl", target.model, sum(len(p) for p in prompts), choices)
        generation = await engine.start(loaded, prompts, params)
        if body.stream:
            stream = answers.stream_completion(generation, answer, body.include_usage)
            return GenerationStream(stream, generation, answer)
        return JSONResponse(
            (await answers.collect(generation, answer, request.is_disconnected)).text_completion()
        )

    # Plain Starlette routes: a FastAPI route would run its dependency solver and response
    # handling for endpoints that take the bare request and return a response; the exception
    # handlers above still answer their errors.
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    return app
