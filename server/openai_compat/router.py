"""`/v1/fine_tuning/jobs`: the OpenAI fine-tuning API over our jobs, for the official `openai` client.

Files need no routes of their own: `/v1/files` already answers multipart uploads with
`purpose=fine-tune` and returns `object: "file"` objects.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query

from server.checkpoints import service as checkpoints
from server.common.pagination import MAX_LIMIT
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal
from server.errors import InvalidRequest, error_responses
from server.jobs import service as jobs
from server.jobs.router import DispatchDep
from server.jobs.schemas import JobResume
from server.openai_compat import service
from server.openai_compat.schemas import FineTuningJob, FineTuningJobCreate, OpenAIList
from server.progress import service as progress

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai-compatible"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
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
    try:
        job, _created = jobs.create_job(
            session, settings, principal, service.to_job_create(body), dispatch, idempotency_key
        )
    except InvalidRequest as exc:
        raise service.in_openai_terms(exc) from exc
    return _render(session, job)


@router.get("", operation_id="openaiListFineTuningJobs", response_model=OpenAIList, responses=ERRORS)
def list_jobs(
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = 20,
) -> OpenAIList:
    """The project's jobs, newest first."""
    rows, has_more = jobs.list_jobs(
        session, principal, statuses=[], name=None, metadata={}, after=after, limit=limit
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
        limit=limit,
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
    rows, has_more = checkpoints.list_checkpoints(session, principal, job_id, after=after, limit=limit)
    data = [service.present_checkpoint(c) for c in rows]
    return _page(data, has_more)
