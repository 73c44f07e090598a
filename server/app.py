"""The FastAPI application: `create_app(settings)` builds a fully wired API server.

Start-up brings the schema to the latest migration (the schema changes only through Alembic)
and registers the bootstrap token as an admin of the project "default", so a fresh install is
usable with one environment variable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from jobcore.broker import send_export, send_wakeup
from jobcore.db import migrate
from jobcore.db.session import make_engine, make_read_engine
from jobcore.settings import Settings, get_settings
from server.artifacts.router import router as artifacts_router
from server.auth.ratelimit import make_rate_limiter
from server.auth.service import DEFAULT_PROJECT, register_token
from server.checkpoints.router import router as checkpoints_router
from server.cluster.prometheus import ApiLatency
from server.cluster.router import router as cluster_router
from server.common.body_limit import BodyLimitMiddleware
from server.common.heap import freeze_startup_heap
from server.common.middleware import RequestContextMiddleware
from server.common.ratelimit_headers import RateLimitHeadersMiddleware
from server.dashboard.router import router as dashboard_router
from server.errors import OPENAI_SHAPED_TAGS, install_error_handlers
from server.exports.router import router as exports_router
from server.files.router import MULTIPART_OVERHEAD
from server.files.router import router as files_router
from server.inference.relay import HostConnections
from server.inference.router import router as inference_router
from server.jobs.router import router as jobs_router
from server.openai_compat.router import router as openai_router
from server.progress.router import router as progress_router
from server.progress.stream import StreamTiming
from server.projects.router import projects_router, tokens_router

log = logging.getLogger(__name__)

API_VERSION = "1.0.0"
# The API's routers in the reading order of its document (their tags are its sections).
API_ROUTERS = (
    jobs_router,
    progress_router,
    checkpoints_router,
    exports_router,
    artifacts_router,
    files_router,
    cluster_router,
    openai_router,
    inference_router,
    projects_router,
    tokens_router,
)
# Multipart uploads; every other request body is JSON and held to TWINKLE_MAX_REQUEST_BYTES.
UPLOAD_PATHS = ("/v1/files",)
DESCRIPTION = """Submit, watch and control fine-tuning jobs.

Authenticate with `Authorization: Bearer <token>`. Errors share one envelope,
`{"error": {"type", "code", "message", "param"}}`; lists share
`{"object": "list", "data", "first_id", "last_id", "has_more"}` with `after`/`limit` cursors.
Every response carries an `x-request-id` header.
"""


def default_dispatch(settings: Settings) -> Callable[[str], None]:
    """Wake a worker for a job through the broker (jobcore's wake-up contract); the CLI, which
    composes the processes, may inject another (tests inject a recorder)."""

    def dispatch(job_id: str) -> None:
        send_wakeup(job_id, settings)

    return dispatch


def bootstrap(settings: Settings, session_factory: sessionmaker[Session]) -> None:
    migrate.upgrade(settings.resolved_database_url)
    if not settings.bootstrap_token:
        return
    for attempt in range(2):  # two server processes may register it at the same moment
        try:
            with session_factory.begin() as session:
                register_token(session, settings.bootstrap_token, DEFAULT_PROJECT, ["admin"], "bootstrap")
            return
        except IntegrityError:
            if attempt:
                raise


def body_limits(settings: Settings) -> Callable[[str, str], int]:
    """The body size limit of a request: an upload's own, or the JSON limit for everything else."""
    upload_limit = settings.max_upload_bytes + MULTIPART_OVERHEAD
    upload_paths = {route_path.rstrip("/") for route_path in UPLOAD_PATHS}

    def limit_for(method: str, path: str) -> int:
        if method == "POST" and path.rstrip("/") in upload_paths:
            return upload_limit
        return settings.max_request_bytes

    return limit_for


def complete_document(app: FastAPI) -> None:
    """What the routes cannot say for themselves in the OpenAPI document: the middleware's 413 on
    every operation that takes a body, and no FastAPI 422 on the routes shaped after OpenAI's,
    which refuse a value with 400 (FastAPI adds its own `{"detail": [...]}` 422 to a route that
    documents none; this API never sends that shape)."""
    generate = app.openapi
    too_large = {
        "description": "The request body is larger than TWINKLE_MAX_REQUEST_BYTES (uploads: "
        "TWINKLE_MAX_UPLOAD_BYTES); refused before it is read",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()
        for path_item in document.get("paths", {}).values():
            for operation in path_item.values():
                if "requestBody" in operation:
                    operation["responses"].setdefault("413", dict(too_large))
                if OPENAI_SHAPED_TAGS.intersection(operation.get("tags", ())):
                    operation["responses"].pop("422", None)
        schemas = document.get("components", {}).get("schemas", {})
        if '"#/components/schemas/HTTPValidationError"' not in json.dumps(document.get("paths", {})):
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _operation_id(route: APIRoute) -> str:
    return route.operation_id or route.name


def create_app(settings: Settings | None = None, dispatch: Callable[[str], None] | None = None) -> FastAPI:
    settings = settings or get_settings()
    settings.ensure_dirs()
    engine = make_engine(settings.resolved_database_url)
    session_factory = sessionmaker(bind=engine, expire_on_commit=False)
    read_engine = make_read_engine(settings.resolved_database_url)  # None on SQLite

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        bootstrap(settings, session_factory)
        freeze_startup_heap()  # full GCs stalled requests for 60 ms (server/common/heap.py)
        yield
        await app.state.host_connections.aclose()
        await app.state.rate_limits.close()
        if read_engine is not None:
            await read_engine.dispose()
        engine.dispose()

    app = FastAPI(
        title="Twinkle Jobs API",
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        openapi_tags=[{"name": str(tag)} for router in API_ROUTERS for tag in router.tags],
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.read_engine = read_engine  # the hot reads' engine (server/common/reads.py)
    app.state.session_factory = session_factory
    app.state.dispatch = dispatch or default_dispatch(settings)
    # Checkpoint exports go to a worker through the broker's export task (tests replace it).
    app.state.export_dispatch = lambda export_id: send_export(export_id, settings)
    # Per-token rate limits: shared in Redis when one is configured, else counted per process.
    app.state.rate_limits = make_rate_limiter(settings.resolved_rate_limit_url)
    app.state.host_connections = HostConnections()  # the inference relay's kept connections
    app.state.latency = ApiLatency()
    app.state.stream_timing = StreamTiming()

    install_error_handlers(app)
    # Inside the request-context middleware, so a 413 still has its request id and latency.
    app.add_middleware(RateLimitHeadersMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limits(settings))
    app.add_middleware(RequestContextMiddleware, latency=app.state.latency)
    # The inference router first: the router tries routes in order, and the generation
    # endpoints are the ones whose every request waits for it (12 routers scanned before them
    # cost ~0.2 ms of the way to the first token, bench's relay A/B). The document's sections
    # keep API_ROUTERS' order through openapi_tags above.
    for router in (inference_router, *(r for r in API_ROUTERS if r is not inference_router)):
        app.include_router(router)
    app.include_router(dashboard_router)  # the web UI (include_in_schema=False: not in the API document)
    complete_document(app)
    return app
