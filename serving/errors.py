"""The service's error envelope, `{"error": {"type", "code", "message", "param"}}`, on the host.

The API server relays a host's 4xx answers to its client as they are, so the host speaks the
same envelope (server/errors.py is the server's copy; the two packages may not import each other).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ServingError(Exception):
    status_code = 400
    type = "invalid_request_error"
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = {"Retry-After": str(max(1, retry_after))} if retry_after is not None else {}


class InvalidRequest(ServingError):
    """What the request asks cannot be done as asked (over the context, an unsupported option)."""


class InvalidValue(ServingError):
    """A field's value is refused (`param` names it): a 400, as OpenAI answers it."""

    code = "invalid_value"


class Unauthorized(ServingError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_token"


class Forbidden(ServingError):
    status_code = 403
    type = "permission_error"
    code = "outside_jobs_root"


class NotFound(ServingError):
    status_code = 404
    type = "not_found_error"
    code = "checkpoint_not_found"


class Unavailable(ServingError):
    """Try again later: the model is still loading, or every generation slot is busy."""

    status_code = 503
    type = "service_unavailable"
    code = "unavailable"


class LoadFailed(ServingError):
    status_code = 500
    type = "api_error"
    code = "model_load_failed"


def error_json(error: ServingError) -> JSONResponse:
    body = {"error": {"type": error.type, "code": error.code, "message": error.message, "param": error.param}}
    return JSONResponse(status_code=error.status_code, content=body, headers=error.headers)


def _param(loc: Sequence[Any]) -> str | None:
    """`("body", "messages", 0, "content")` -> `messages.0.content`; pydantic's union member names
    (`list[str]`, `function-after[...]`) are not fields and are dropped."""
    parts = [str(p) for p in loc[1:] if not any(ch in str(p) for ch in "[]('")] if loc else []
    return ".".join(parts) or None


async def _serving_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServingError)
    return error_json(exc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    param = None if first.get("type") == "json_invalid" else _param(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return error_json(InvalidValue(f"{param}: {message}" if param else message, param=param))


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error = ServingError(str(exc.detail), code="http_error")
    error.status_code = exc.status_code
    if exc.status_code == 404:
        error.type, error.code = "not_found_error", "not_found"
    return error_json(error)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    error = ServingError("internal error of the serving host", code="internal_error")
    error.status_code, error.type = 500, "api_error"
    return error_json(error)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServingError, _serving_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
