"""The generation endpoints' route: FastAPI's description of them, a shorter way in.

On a generation request's way to its first token, FastAPI's request handler (the content type
parsed through `email.message`, `json.loads`, the dependency solver walking the endpoint's
dependencies, then pydantic validating the decoded dict) was most of the API server's own time
in a trace under bench/bench_serving_api.py. These endpoints take a JSON body, the settings and
a token, nothing else, so `GenerationRoute` serves a well-formed request directly: pydantic
validates the body straight from its bytes, the endpoint's own `TokenAuth` dependency checks
the token (scope and rate limit included), and the endpoint runs with them.

Anything else (another content type, a body that does not validate) goes to FastAPI's handler,
which answers exactly as it did: its errors, and its order of checks (the token first), are
unchanged, and the token is checked once per request either way, since it is checked here only
after the body validated. What FastAPI derives from the endpoint (the OpenAPI operation) is its
own. A change to the endpoint's signature that this route would not honour fails at start-up;
with dependency overrides in place (tests) every request takes FastAPI's way. Dependencies given
where the router is included would not run on the short way: the app includes it without any
(server/app.py); a check that a request needs goes on the endpoint, where it fails the start.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from server.deps import TokenAuth, get_settings

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def is_json(content_type: str | None) -> bool:
    """FastAPI's test of a JSON body: `application/json` or `application/*+json`, any parameters."""
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


@dataclass(frozen=True)
class _Shape:
    """Where an endpoint takes what this route hands it."""

    body: str
    model: type[BaseModel]
    request: str
    settings: str
    principal: str
    token_auth: TokenAuth


def _shape(path: str, dependant: Dependant) -> _Shape:
    auth = [d for d in dependant.dependencies if isinstance(d.call, TokenAuth)]
    settings = [d for d in dependant.dependencies if d.call is get_settings]
    others = [*dependant.path_params, *dependant.query_params, *dependant.header_params]
    others += dependant.cookie_params
    model = dependant.body_params[0].field_info.annotation if len(dependant.body_params) == 1 else None
    if not (
        len(auth) == len(settings) == 1
        and len(dependant.dependencies) == 2
        and not others
        and dependant.request_param_name
        and isinstance(model, type)
        and issubclass(model, BaseModel)
        and isinstance(auth[0].call, TokenAuth)
    ):
        raise TypeError(f"{path}: a GenerationRoute endpoint takes a body, the request, settings and a token")
    return _Shape(
        body=dependant.body_params[0].name,
        model=model,
        request=dependant.request_param_name,
        settings=str(settings[0].name),
        principal=str(auth[0].name),
        token_auth=auth[0].call,
    )


class GenerationRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        fastapi_handler = super().get_route_handler()
        shape = _shape(self.path, self.dependant)
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            if request.app.dependency_overrides or not is_json(request.headers.get("content-type")):
                return await fastapi_handler(request)
            try:
                body = shape.model.model_validate_json(await request.body())
            except ValidationError:
                return await fastapi_handler(request)  # its 400 (or the token's 401 first)
            principal = await shape.token_auth(request)
            arguments = {
                shape.body: body,
                shape.request: request,
                shape.settings: request.app.state.settings,
                shape.principal: principal,
            }
            response: Response = await endpoint(**arguments)
            return response

        return handle
