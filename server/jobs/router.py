"""HTTP routes of jobs: submit, list, read, cancel, pause, resume, clone, delete."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from jobcore.db.models import Job
from jobcore.jobs.states import JobStatus
from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT, list_envelope
from server.common.reads import json_body, run_read
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal
from server.errors import InvalidRequest, error_responses
from server.jobs import service
from server.jobs.schemas import METADATA_KEY, Deleted, JobClone, JobCreate, JobList, JobOut, JobResume

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
AUTH_ERRORS = (401, 403, 429)


def get_dispatch(request: Request) -> service.Dispatch:
    dispatch: service.Dispatch = request.app.state.dispatch
    return dispatch


DispatchDep = Annotated[service.Dispatch, Depends(get_dispatch)]


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="Same key and body: the same job; same key, other body: 409",
    ),
]
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"model": JobOut, "description": "Replay: the job created earlier with this Idempotency-Key"}
}


def _one(session: Session, job: Job) -> JobOut:
    return service.present_jobs(session, [job])[0]


def _mark_replay(response: Response, created: bool) -> None:
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"


@router.post(
    "",
    operation_id="createJob",
    status_code=201,
    response_model=JobOut,
    responses={**REPLAYED, **error_responses(*AUTH_ERRORS, 409, 422)},
)
def create_job(
    body: JobCreate,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
    dispatch: DispatchDep,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    """Submit a training job. It is queued at once and a worker is woken after the commit."""
    job, created = service.create_job(session, settings, principal, body, dispatch, idempotency_key)
    _mark_replay(response, created)
    return _one(session, job)


def _metadata_filters(values: list[str]) -> dict[str, str]:
    filters: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition(":")
        if not sep or not METADATA_KEY.match(key):
            raise InvalidRequest(
                "metadata filters look like key:value (key: letters, digits, _.-)", param="metadata"
            )
        filters[key] = value
    return filters


Expand = Annotated[
    list[Literal["spec"]],
    Query(
        description="`spec`: include each job's spec (left out of lists by default: it is the largest field)"
    ),
]


@router.get("", operation_id="listJobs", response_model=JobList, responses=error_responses(*AUTH_ERRORS, 422))
async def list_jobs(
    request: Request,
    principal: ReadPrincipal,
    status: Annotated[list[JobStatus], Query(description="Only jobs in these statuses")] = [],  # noqa: B006
    name: Annotated[str | None, Query(max_length=256, description="Only jobs with this exact name")] = None,
    metadata: Annotated[list[str], Query(description="key:value pairs the job's metadata must hold")] = [],  # noqa: B006
    after: Annotated[
        str | None, Query(max_length=64, description="The last job id of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    expand: Expand = [],  # noqa: B006
) -> Response:
    """The project's jobs, newest first; each job's `spec` only with `expand=spec`."""
    filters = _metadata_filters(metadata)

    def read(db: Connection) -> tuple[list[dict[str, Any]], bool]:
        return service.read_jobs(
            db,
            principal,
            statuses=[s.value for s in status],
            name=name,
            metadata=filters,
            after=after,
            limit=limit,
            expand_spec="spec" in expand,
        )

    # The hot read paths: Core rows presented as they are, on the event loop (server/common/reads.py).
    data, has_more = await run_read(request, read)
    return json_body(list_envelope(data, has_more))


@router.get(
    "/{job_id}", operation_id="getJob", response_model=JobOut, responses=error_responses(*AUTH_ERRORS, 404)
)
async def get_job(job_id: JobId, request: Request, principal: ReadPrincipal) -> Response:
    return json_body(await run_read(request, lambda db: service.read_job(db, principal, job_id)))


ACTION_ERRORS = error_responses(*AUTH_ERRORS, 404, 409)


@router.post("/{job_id}/cancel", operation_id="cancelJob", response_model=JobOut, responses=ACTION_ERRORS)
def cancel_job(job_id: JobId, session: SessionDep, principal: WritePrincipal) -> JobOut:
    """Queued, paused or retrying jobs are cancelled at once; running ones go to `cancelling`."""
    return _one(session, service.cancel_job(session, principal, job_id))


@router.post("/{job_id}/pause", operation_id="pauseJob", response_model=JobOut, responses=ACTION_ERRORS)
def pause_job(job_id: JobId, session: SessionDep, principal: WritePrincipal) -> JobOut:
    """A queued job is paused at once; a running one checkpoints and stops (`pausing` -> `paused`)."""
    return _one(session, service.pause_job(session, principal, job_id))


@router.post(
    "/{job_id}/resume",
    operation_id="resumeJob",
    response_model=JobOut,
    responses=error_responses(*AUTH_ERRORS, 404, 409, 422),
)
def resume_job(
    job_id: JobId,
    session: SessionDep,
    principal: WritePrincipal,
    dispatch: DispatchDep,
    body: JobResume | None = None,
) -> JobOut:
    """Requeue a paused, failed or cancelled job from its latest (or the named) checkpoint."""
    checkpoint = body.checkpoint if body else None
    return _one(session, service.resume_job(session, principal, job_id, checkpoint, dispatch))


@router.post(
    "/{job_id}/clone",
    operation_id="cloneJob",
    status_code=201,
    response_model=JobOut,
    responses={**REPLAYED, **error_responses(*AUTH_ERRORS, 404, 409, 422)},
)
def clone_job(
    job_id: JobId,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
    dispatch: DispatchDep,
    body: JobClone | None = None,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    """A new queued job with the source's spec, `spec` overrides deep-merged in."""
    job, created = service.clone_job(
        session, settings, principal, job_id, body or JobClone(), dispatch, idempotency_key
    )
    _mark_replay(response, created)
    return _one(session, job)


@router.delete("/{job_id}", operation_id="deleteJob", response_model=Deleted, responses=ACTION_ERRORS)
def delete_job(
    job_id: JobId, session: SessionDep, settings: SettingsDep, principal: WritePrincipal
) -> Deleted:
    """Delete a finished job with its events, metrics, checkpoints and files."""
    service.delete_job(session, settings, principal, job_id)
    return Deleted(id=job_id, object="job")
