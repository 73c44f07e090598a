"""`/v1/fine_tuning/jobs`: the OpenAI fine-tuning API over our jobs, for the official `openai` client.

Files need no routes of their own: `/v1/files` already answers multipart uploads with
`purpose=fine-tune` and returns `object: "file"` objects.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request

from server.checkpoints import service as checkpoints
from server.common.pagination import MAX_LIMIT
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal
from server.errors import InvalidRequest, error_responses
from server.files.repository import get_file
from server.jobs import service as jobs
from server.jobs.router import DispatchDep
from server.jobs.schemas import METADATA_KEY, JobResume
from server.openai_compat import service
from server.openai_compat.schemas import FineTuningJob, FineTuningJobCreate, OpenAIList
from server.progress import service as progress

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai-compatible"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
# Any size is taken, as OpenAI's lists take sizes up to 10,000; a page holds at most MAX_LIMIT
# and `has_more` says that more follow (the openai package's iteration fetches them).
Limit = Annotated[int, Query(ge=1, description=f"Page size; a page holds at most {MAX_LIMIT}")]
ERRORS = error_responses(401, 403, 404, 409, 429, refusal=400)


def _page(data: list[Any], has_more: bool) -> OpenAIList:
    return OpenAIList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


def _render(session: SessionDep, job: jobs.Job) -> FineTuningJob:
    return service.present_job(job, jobs.present_jobs(session, [job])[0])


@router.post("", operation_id="openaiCreateFineTuningJob", response_model=FineTuningJob, responses=ERRORS)
def create(
    body: FineTuningJobCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
    dispatch: DispatchDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=256)] = None,
) -> FineTuningJob:
    """Create a fine-tuning job from an OpenAI-style body ("auto" hyperparameters resolved and recorded)."""
    uploaded = get_file(session, principal.project_id, body.training_file)
    try:
        job_body = service.to_job_create(body, uploaded.rows if uploaded else None)
        job, _created = jobs.create_job(session, settings, principal, job_body, dispatch, idempotency_key)
    except InvalidRequest as exc:
        raise service.in_openai_terms(exc) from exc
    return _render(session, job)


def metadata_filter(request: Request) -> dict[str, str]:
    """The `metadata[key]=value` query pairs, the form in which the openai package sends
    `jobs.list(metadata={...})`: every pair must be in the job's metadata."""
    filters: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name != "metadata" and not name.startswith("metadata["):
            continue
        key = name.removeprefix("metadata[").removesuffix("]")
        if name == "metadata" or not name.endswith("]") or not METADATA_KEY.match(key):
            raise InvalidRequest(
                f"'{name}': filter by metadata with metadata[key]=value (key: letters, digits, _.-)",
                param="metadata",
            )
        filters[key] = value
    return filters


METADATA_FILTER = {
    "name": "metadata",
    "in": "query",
    "style": "deepObject",
    "explode": True,
    "required": False,
    "description": "Only jobs whose metadata holds every pair: `metadata[team]=nlp`",
    "schema": {"type": "object", "additionalProperties": {"type": "string"}},
}


@router.get(
    "",
    operation_id="openaiListFineTuningJobs",
    response_model=OpenAIList,
    responses=ERRORS,
    openapi_extra={"parameters": [METADATA_FILTER]},
)
def list_jobs(
    request: Request,
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = 20,
) -> OpenAIList:
    """The project's jobs, newest first."""
    filters = metadata_filter(request)
    rows, has_more = jobs.list_jobs(
        session, principal, statuses=[], name=None, metadata=filters, after=after, limit=min(limit, MAX_LIMIT)
    )
    natives = jobs.present_jobs(session, rows)
    data = [service.present_job(job, native) for job, native in zip(rows, natives, strict=True)]
    return _page(data, has_more)


@router.get(
    "/{job_id}", operation_id="openaiRetrieveFineTuningJob", response_model=FineTuningJob, responses=ERRORS
)
def retrieve(job_id: JobId, session: SessionDep, principal: ReadPrincipal) -> FineTuningJob:
    return _render(session, jobs.get_job(session, principal, job_id))


@router.post(
    "/{job_id}/cancel",
    operation_id="openaiCancelFineTuningJob",
    response_model=FineTuningJob,
    responses=ERRORS,
)
def cancel(job_id: JobId, session: SessionDep, principal: WritePrincipal) -> FineTuningJob:
    return _render(session, jobs.cancel_job(session, principal, job_id))


@router.post(
    "/{job_id}/pause", operation_id="openaiPauseFineTuningJob", response_model=FineTuningJob, responses=ERRORS
)
def pause(job_id: JobId, session: SessionDep, principal: WritePrincipal) -> FineTuningJob:
    return _render(session, jobs.pause_job(session, principal, job_id))


@router.post(
    "/{job_id}/resume",
    operation_id="openaiResumeFineTuningJob",
    response_model=FineTuningJob,
    responses=ERRORS,
)
def resume(
    job_id: JobId,
    session: SessionDep,
    principal: WritePrincipal,
    dispatch: DispatchDep,
    body: JobResume | None = None,
) -> FineTuningJob:
    """Resume from the latest checkpoint (or `{"checkpoint": id}`)."""
    checkpoint = body.checkpoint if body else None
    return _render(session, jobs.resume_job(session, principal, job_id, checkpoint, dispatch))


@router.get(
    "/{job_id}/events", operation_id="openaiListFineTuningEvents", response_model=OpenAIList, responses=ERRORS
)
def list_events(
    job_id: JobId,
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[str | None, Query(max_length=64, description="An event id (ftevent-...)")] = None,
    limit: Limit = 20,
) -> OpenAIList:
    """The job's events, newest first (as OpenAI lists them)."""
    job = jobs.get_job(session, principal, job_id)
    events, has_more = progress.list_events(
        session,
        job.id,
        after=service.parse_event_cursor(after),
        limit=min(limit, MAX_LIMIT),
        descending=True,
        types=[],
        levels=[],
    )
    data = [service.present_event(e) for e in events]
    return _page(data, has_more)


@router.get(
    "/{job_id}/checkpoints",
    operation_id="openaiListFineTuningCheckpoints",
    response_model=OpenAIList,
    responses=ERRORS,
)
def list_checkpoints(
    job_id: JobId,
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = 10,
) -> OpenAIList:
    """The job's complete checkpoints, highest step first."""
    rows, has_more = checkpoints.list_checkpoints(
        session, principal, job_id, after=after, limit=min(limit, MAX_LIMIT)
    )
    data = [service.present_checkpoint(c) for c in rows]
    return _page(data, has_more)
