"""The web dashboard: a single page served by the API server itself (no build step, no second server).

`GET /` answers the page; its ES modules, stylesheet and icon are under `/dashboard/static/`. The
page talks to the public `/v1` API with the user's token, like any other client. Its own two
endpoints hand the submit form its JSON schemas (`JobSpec`, and the job-level fields of
`POST /v1/jobs`); the form is generated from them, so a new spec field shows up in the form
without front-end changes.
"""

from __future__ import annotations

import mimetypes
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from server.errors import NotFound
from server.jobs.schemas import JobCreate
from twinkle_core.spec import JobSpec

STATIC_DIR = Path(__file__).resolve().parent / "static"
# Assets change with every release of the package while their URLs stay the same: make the
# browser revalidate (cheap: Starlette answers 304 on a matching ETag) instead of caching blindly.
NO_STALE_CACHE = {"Cache-Control": "no-cache"}
# ES modules must be served with a JavaScript type or browsers refuse to run them; the system's
# mime table is not trusted for that (some map .js to text/plain or nothing at all).
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}

# Fields of the job body (POST /v1/jobs) besides `spec` that the submit form offers.
JOB_FORM_FIELDS = ("name", "priority", "max_retries", "timeout_seconds")

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def jobspec_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()


def static_file(relative: str) -> Path:
    """The file under STATIC_DIR that `relative` names; NotFound for anything else (`..`, dirs)."""
    candidate = (STATIC_DIR / relative).resolve()
    if not candidate.is_relative_to(STATIC_DIR) or not candidate.is_file():
        raise NotFound(f"no dashboard asset '{relative}'")
    return candidate


def _file_response(path: Path) -> FileResponse:
    media_type = (
        MEDIA_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    )
    return FileResponse(path, media_type=media_type, headers=NO_STALE_CACHE)


@router.api_route("/", methods=["GET", "HEAD"])
def index() -> FileResponse:
    return _file_response(STATIC_DIR / "index.html")


@router.get("/dashboard")
@router.get("/dashboard/")
def dashboard_home() -> RedirectResponse:
    return RedirectResponse("/", status_code=307)


@router.api_route("/dashboard/static/{relative:path}", methods=["GET", "HEAD"])
def asset(relative: str) -> FileResponse:
    return _file_response(static_file(relative))


@lru_cache(maxsize=1)
def job_fields_schema() -> dict[str, Any]:
    """The job-level fields the form offers besides the spec, with the API's own constraints."""
    full = JobCreate.model_json_schema()
    properties = {name: full["properties"][name] for name in JOB_FORM_FIELDS}
    return {"type": "object", "properties": properties, "required": []}


@router.get("/dashboard/api/jobspec-schema")
def get_jobspec_schema() -> dict[str, Any]:
    """The JobSpec JSON schema (pydantic's, with `$defs`); public: it holds no project data."""
    return jobspec_schema()


@router.get("/dashboard/api/job-fields-schema")
def get_job_fields_schema() -> dict[str, Any]:
    return job_fields_schema()
