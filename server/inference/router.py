"""`/v1/models`, `/v1/chat/completions`, `/v1/completions`: OpenAI's inference API over what the
project trained, for the official `openai` client unchanged (streaming included).

The API server does no GPU work: it resolves `model` to a checkpoint in SQL, picks a live
serving host (both kept for moments and reloaded ahead: server/inference/plans.py) and relays
the request there (server/inference/relay.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Request
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session
from starlette.responses import Response

from jobcore import model_names as names
from jobcore.settings import Settings
from server.auth.principal import Principal
from server.common import after_response, reads
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal, run_read
from server.errors import ErrorResponse, InvalidRequest, Unavailable, error_responses
from server.inference import hosts, plans, service
from server.inference.relay import NO_HOST_RETRY_AFTER_SECONDS, HostRelay
from server.inference.route import GenerationRoute
from server.inference.schemas import (
    ChatCompletion,
    ChatCompletionCreate,
    Completion,
    CompletionCreate,
    ModelList,
    ModelObject,
)
from server.jobs import service as jobs
from server.jobs.schemas import Deleted

router = APIRouter(prefix="/v1", tags=["inference"])
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])

_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
}
GENERATION_ERRORS: dict[int | str, dict[str, Any]] = {
    **error_responses(401, 403, 404, 429, refusal=400),
    400: {
        "model": ErrorResponse,
        "description": "Invalid request (`param` names the field), or the prompt plus `max_tokens` "
        "exceed the model's context",
    },
    502: {"model": ErrorResponse, "description": "The serving host failed"},
    503: {
        "model": ErrorResponse,
        "description": "No serving host is live, the model did not load within the host's load "
        "timeout (the load goes on), or no generation slot freed in time",
        "headers": _RETRY_AFTER,
    },
}


def _generation(path: str, **route: Any) -> Callable[[Endpoint], Endpoint]:
    """`@router.post(path, ...)` on a `GenerationRoute` (server/inference/route.py)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.add_api_route(path, endpoint, methods=["POST"], route_class_override=GenerationRoute, **route)
        return endpoint

    return register


def _sse(described: str) -> dict[str, Any]:
    return {"text/event-stream": {"schema": {"type": "string"}, "description": described}}


async def _relay(
    request: Request,
    settings: Settings,
    principal: Principal,
    path: str,
    body: ChatCompletionCreate | CompletionCreate,
) -> Response:
    body.refuse_reserved_key()
    engine: Engine = request.app.state.engine
    plan = plans.cached(engine, principal, body.model)
    if plan is None:

        def load(connection: Connection) -> plans.Plan:
            with Session(bind=connection) as session:
                return plans.load(session, engine, settings, principal, body.model)

        # On the read engine: on PostgreSQL no hop into the thread pool (server/common/reads.py).
        plan = await reads.run_read(request, load)
    elif due := plans.refresh_due(engine, principal, body.model):

        def refresh(connection: Connection) -> None:
            with Session(bind=connection) as session:
                plans.refresh(session, engine, settings, principal, body.model, due)

        after_response.defer(request, functools.partial(reads.run_read, request, refresh))
    served, live = plan
    urls = hosts.order_for(live, served.checkpoint)
    if not urls:
        raise Unavailable(
            "no serving host is running: start one with `twinkle-jobs serve` (`twinkle-jobs up` starts one)",
            code="no_serving_host",
            headers={"Retry-After": str(NO_HOST_RETRY_AFTER_SECONDS)},
        )
    return HostRelay(urls, path, body.host_body(served.host_target()), settings.serving_secret_value)


@router.get(
    "/models",
    operation_id="listModels",
    response_model=ModelList,
    responses=error_responses(401, 403, 429, refusal=400),
)
async def list_models(session: SessionDep, principal: ReadPrincipal) -> ModelList:
    """What the project can call (every succeeded job's `fine_tuned_model`), then the base models
    its jobs train on (listed, not served)."""
    return await run_read(session, lambda: service.list_models(session, principal))


@router.get(
    "/models/{model:path}",
    operation_id="retrieveModel",
    response_model=ModelObject,
    responses=error_responses(401, 403, 404, 429, refusal=400),
)
async def retrieve_model(
    model: Annotated[str, Path(max_length=512, description="A name from /v1/models, or JOB_ID:ckpt-STEP")],
    session: SessionDep,
    principal: ReadPrincipal,
) -> ModelObject:
    """One model: a fine-tuned model or checkpoint the project can call, or a base model its jobs
    train on; anything else is a 404 naming `model`."""
    return await run_read(session, lambda: service.get_model(session, principal, model))


@router.delete(
    "/models/{model:path}",
    operation_id="deleteModel",
    response_model=Deleted,
    responses=error_responses(401, 403, 404, 409, 429, refusal=400),
)
def delete_model(
    model: Annotated[str, Path(max_length=512, description="A fine-tuned model's name (ft:...)")],
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
) -> Deleted:
    """Delete a fine-tuned model (`client.models.delete`). Its job is where it lives, so the job
    goes with it, as `DELETE /v1/jobs/{id}` deletes one (checkpoints and files included; 409
    while other jobs still train from it). A checkpoint's name or a base model is a 400."""
    service.get_model(session, principal, model)  # the same 404 as a call, for what is not the project's
    named = names.parse(model)
    if not isinstance(named, names.FineTunedName):
        raise InvalidRequest(
            f"'{model}' is not a fine-tuned model: only a job's model (ft:...) is deleted, with its job",
            param="model",
        )
    jobs.delete_job(session, settings, principal, named.job_id)
    return Deleted(id=model, object="model")


@_generation(
    "/chat/completions",
    operation_id="createChatCompletion",
    response_model=ChatCompletion,
    responses={
        200: {"content": _sse("With `stream: true`: `chat.completion.chunk` objects, then `[DONE]`")},
        **GENERATION_ERRORS,
    },
)
async def chat_completions(
    body: ChatCompletionCreate, request: Request, settings: SettingsDep, principal: ReadPrincipal
) -> Response:
    """Chat with a fine-tuned model or a checkpoint; the messages are rendered with the
    checkpoint's own chat template."""
    return await _relay(request, settings, principal, "/v1/chat/completions", body)


@_generation(
    "/completions",
    operation_id="createCompletion",
    response_model=Completion,
    responses={
        200: {"content": _sse("With `stream: true`: `text_completion` chunks, then `[DONE]`")},
        **GENERATION_ERRORS,
    },
)
async def completions(
    body: CompletionCreate, request: Request, settings: SettingsDep, principal: ReadPrincipal
) -> Response:
    """Continue a prompt with a fine-tuned model or a checkpoint."""
    return await _relay(request, settings, principal, "/v1/completions", body)
