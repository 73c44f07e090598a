"""The one error envelope of the API: `{"error": {"type", "code", "message", "param"}}`.

Every failure a client can see goes through these handlers, so a dashboard or a CI script needs
one code path for errors: validation (422, `param` is the dotted field path), authentication
(401), scope (403), not found or another project's object (404), state conflicts (409), rate
limits (429 with Retry-After) and, without details, unexpected failures (500).

The routes shaped after OpenAI's API (fine-tuning jobs, models, generation) refuse a value with
400 instead, as OpenAI does: its SDK raises `BadRequestError` for a 400 and a sibling class,
`UnprocessableEntityError`, for a 422, and scripts written against OpenAI catch the first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobcore.jobs.states import InvalidTransition
from twinkle_core.spec_hints import located_error, unknown_field_message

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
# The tags of the routers shaped after OpenAI's API: their refusals of a value are 400s.
OPENAI_SHAPED_TAGS = frozenset({"openai-compatible", "inference"})


class ApiError(Exception):
    status_code = 400
    type = "invalid_request_error"
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class InvalidRequest(ApiError):
    status_code = 422
    code = "invalid_value"


class Unauthorized(ApiError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_token"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ApiError):
    status_code = 403
    type = "permission_error"
    code = "insufficient_scope"


class NotFound(ApiError):
    status_code = 404
    type = "not_found_error"
    code = "not_found"


class Conflict(ApiError):
    status_code = 409
    type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(ApiError):
    status_code = 413
    code = "payload_too_large"


class RateLimited(ApiError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, retry_after))})
        self.retry_after = retry_after


class Unavailable(ApiError):
    status_code = 503
    type = "service_unavailable"
    code = "unavailable"


class ErrorBody(BaseModel):
    type: str
    code: str
    message: str
    param: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorBody


def error_json(
    status: int, type_: str, code: str, message: str, param: str | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"type": type_, "code": code, "message": message, "param": param}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def refusal_status(request: Request) -> int:
    """The status of a refused value on this request's route: 400 where the route is shaped after
    OpenAI's API, 422 elsewhere (also where no route matched)."""
    tags = getattr(request.scope.get("route"), "tags", None) or ()
    return 400 if OPENAI_SHAPED_TAGS.intersection(tags) else 422


def _with_request_id(request: Request, response: JSONResponse) -> JSONResponse:
    # Errors answered by ServerErrorMiddleware bypass the request-id middleware's send wrapper.
    request_id = getattr(request.state, "request_id", None)
    if request_id and REQUEST_ID_HEADER not in response.headers:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response


# How pydantic names a union's plain members in an error's location (no field is called so).
UNION_MEMBER_TAGS = frozenset({"int", "float", "str", "bool", "none", "bytes", "list", "dict"})


def param_from_loc(loc: Sequence[Any]) -> str | None:
    """`("body", "spec", "model", "mixed_precision")` -> `spec.model.mixed_precision`.

    Pydantic adds the member name of a union (`int`, `list[str]`, `literal['all-linear']`) and
    the kind of a function validator to the location; they are not fields, so they are dropped.
    """
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    cleaned: list[str] = []
    for part in parts:
        text = str(part)
        if any(ch in text for ch in "[]('") or text.startswith(("function-", "literal")):
            continue
        if text in UNION_MEMBER_TAGS:
            continue
        cleaned.append(text)
    return ".".join(cleaned) or None


def validation_error_of(error: Mapping[str, Any]) -> tuple[str | None, str]:
    """One validation error's `(param, message)`."""
    if error.get("type") == "json_invalid":
        return None, "the request body is not valid JSON"
    param = param_from_loc(error.get("loc", ()))
    if error.get("type") == "extra_forbidden":
        if param and param.startswith("spec."):  # a job's spec: name the field that was meant
            return param, unknown_field_message(param.split(".")[1:])
        return param, f"unknown field '{param}'"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is not None and param.split(".")[0] == "spec":
        # A check across a spec's fields names its field first (spec_hints.located_error).
        field, message = located_error(param.split(".")[1:], message)
        return ("spec." + field, "spec." + message) if field else ("spec", f"spec: {message}")
    return param, f"{param}: {message}" if param else message


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    status = refusal_status(request) if exc.status_code == 422 else exc.status_code
    response = error_json(status, exc.type, exc.code, exc.message, exc.param, exc.headers)
    return _with_request_id(request, response)


# How many of a request's validation errors its message lists.
LISTED_ERRORS = 5


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    # Unknown keys first: a typo is the most useful thing to name.
    errors.sort(key=lambda e: e.get("type") != "extra_forbidden")
    first = errors[0] if errors else {}
    param, message = validation_error_of(first)
    code = "unknown_field" if first.get("type") == "extra_forbidden" else "invalid_value"
    # The others too (a few), so one round trip names every field to fix; `param` is the first's.
    others = [validation_error_of(e)[1] for e in errors[1:LISTED_ERRORS]]
    if others:
        message += "; also " + "; ".join(others)
    if len(errors) > LISTED_ERRORS:
        rest = len(errors) - LISTED_ERRORS
        message += f" (and {rest} more error{'s' if rest > 1 else ''})"
    response = error_json(refusal_status(request), "invalid_request_error", code, message, param)
    return _with_request_id(request, response)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {
        401: ("authentication_error", "invalid_token"),
        403: ("permission_error", "forbidden"),
        404: ("not_found_error", "not_found"),
        405: ("invalid_request_error", "method_not_allowed"),
    }
    type_, code = kinds.get(exc.status_code, ("invalid_request_error", "http_error"))
    status = exc.status_code
    if status == 400:
        # FastAPI answers a body it cannot decode at all (bad encoding, broken multipart) with 400;
        # for clients it is the same kind of mistake as malformed JSON, which is a 422 (or 400).
        status, code = refusal_status(request), "invalid_body"
    headers = dict(exc.headers) if exc.headers else None
    response = error_json(status, type_, code, str(exc.detail), None, headers)
    return _with_request_id(request, response)


async def _transition_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidTransition)
    response = error_json(409, "conflict_error", "invalid_state", str(exc), None)
    return _with_request_id(request, response)


async def _unstorable_value(request: Request, exc: Exception) -> JSONResponse:
    # The database refused a value that passed validation: a NUL character in a PostgreSQL text
    # column, or an integer beyond 64 bits. It is the client's input, so a 422, not a 500.
    log.info("unstorable value on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    message = "a value in the request cannot be stored: it is out of range or contains a NUL character"
    response = error_json(refusal_status(request), "invalid_request_error", "invalid_value", message, None)
    return _with_request_id(request, response)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    response = error_json(500, "api_error", "internal_error", "internal server error", None)
    return _with_request_id(request, response)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(InvalidTransition, _transition_error)
    app.add_exception_handler(DataError, _unstorable_value)
    app.add_exception_handler(OverflowError, _unstorable_value)
    app.add_exception_handler(Exception, _unexpected_error)


_INT = {"type": "integer"}
# Sent with every answer to a token that has a rate limit (server/common/ratelimit_headers.py).
RATE_LIMIT_HEADERS: dict[str, Any] = {
    "X-RateLimit-Limit": {"description": "The token's requests per minute", "schema": _INT},
    "X-RateLimit-Remaining": {"description": "Requests that may follow at once", "schema": _INT},
    "X-RateLimit-Reset": {"description": "Seconds until the whole limit is available again", "schema": _INT},
}


def error_responses(*statuses: int, refusal: int = 422) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting the error envelope for the given statuses, and for
    `refusal`, the status of a refused value (400 on the routes shaped after OpenAI's)."""
    descriptions = {
        400: "Invalid request; `param` names the field",
        401: "Missing, unknown or revoked token",
        403: "The token lacks the scope this operation needs",
        404: "No such object in the caller's project",
        409: "The object's state does not allow this operation",
        413: "The upload is larger than the configured limit",
        422: "Invalid request; `param` names the field",
        429: "Rate limit or project limit reached; see Retry-After",
        503: "A dependency (database, broker) is unreachable",
    }
    # The refusal always: any route with parameters can refuse them, and FastAPI would otherwise
    # document its own 422 `{"detail": [...]}` shape, which this API never sends.
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, refusal} - ({422} if refusal != 422 else set())):
        out[status] = {"model": ErrorResponse, "description": descriptions[status]}
        if status == 429:
            retry = {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
            out[status]["headers"] = {"Retry-After": retry, **RATE_LIMIT_HEADERS}
    return out
