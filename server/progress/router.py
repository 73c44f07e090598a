"""HTTP routes for watching a job: events (list and SSE stream), metrics, logs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import Connection

from jobcore.jobs.events import EventLevel, EventType
from jobcore.jobs.spec import resources_of
from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT
from server.common.reads import json_body, run_read
from server.deps import ReadPrincipal, SessionDep, SettingsDep
from server.errors import InvalidRequest, error_responses
from server.jobs import service as jobs
from server.jobs.schemas import JobEventList, JobLogs, JobMetrics
from server.progress import service
from server.progress.stream import StreamTiming, job_event_stream

router = APIRouter(prefix="/v1/jobs", tags=["progress"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
ERRORS = error_responses(401, 403, 404, 422, 429)
MAX_EVENT_ID = 2**63 - 1  # event ids are 64-bit integers


@router.get("/{job_id}/events", operation_id="listJobEvents", response_model=JobEventList, responses=ERRORS)
async def list_events(
    job_id: JobId,
    request: Request,
    principal: ReadPrincipal,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_EVENT_ID, description="The last event id already seen")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    order: Annotated[Literal["asc", "desc"], Query(description="asc: oldest first")] = "asc",
    type: Annotated[list[EventType], Query(description="Only events of these types")] = [],  # noqa: B006
    level: Annotated[list[EventLevel], Query(description="Only events of these levels")] = [],  # noqa: B006
) -> Response:
    """The job's history: status changes, messages, metrics and checkpoints."""

    def read(db: Connection) -> dict[str, Any]:
        return service.read_events(
            db,
            principal,
            job_id,
            after=after,
            limit=limit,
            descending=order == "desc",
            types=list(type),
            levels=list(level),
        )

    return json_body(await run_read(request, read))


@router.get(
    "/{job_id}/events/stream",
    operation_id="streamJobEvents",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events; each `id:` is an event id, each `data:` a job event object",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **ERRORS,
    },
)
def stream_events(
    request: Request,
    job_id: JobId,
    session: SessionDep,
    principal: ReadPrincipal,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=32, description="Resume after this event id")
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=0, le=MAX_EVENT_ID, description="Like Last-Event-ID, for clients without headers"),
    ] = None,
) -> StreamingResponse:
    """Events as they happen; the stream ends after the job reaches a final state."""
    job = jobs.get_job(session, principal, job_id)
    start = after or 0
    if last_event_id:
        if not last_event_id.isdigit() or int(last_event_id) > MAX_EVENT_ID:
            raise InvalidRequest("Last-Event-ID must be an event id (an integer)", param="Last-Event-ID")
        start = int(last_event_id)
    timing: StreamTiming = request.app.state.stream_timing
    return StreamingResponse(
        job_event_stream(request.app.state.session_factory, job.id, start, timing),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/{job_id}/metrics", operation_id="getJobMetrics", response_model=JobMetrics, responses=ERRORS)
async def get_metrics(
    job_id: JobId,
    request: Request,
    principal: ReadPrincipal,
    name: Annotated[
        list[str],
        Query(max_length=64, description="Series to return (loss, eval_loss, lr, ...); default all"),
    ] = [],  # noqa: B006
    max_points: Annotated[
        int | None, Query(ge=2, le=10_000, description="Downsample each series to at most this many points")
    ] = None,
) -> Response:
    """Scalar series per optimizer step, for charts."""
    names = list(name)
    return json_body(
        await run_read(request, lambda db: service.read_metrics(db, principal, job_id, names, max_points))
    )


@router.get("/{job_id}/logs", operation_id="getJobLogs", response_model=JobLogs, responses=ERRORS)
def get_logs(
    job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    principal: ReadPrincipal,
    attempt: Annotated[
        int | None, Query(ge=0, le=1_000_000, description="Which attempt; default the latest")
    ] = None,
    node: Annotated[
        int | None, Query(ge=0, le=100_000, description="Only the logs of this node (a node rank)")
    ] = None,
    rank: Annotated[
        int | None,
        Query(
            ge=0,
            le=100_000,
            description="Only this rank's own logs: a global rank (node rank x nproc_per_node + local rank)",
        ),
    ] = None,
    lines: Annotated[
        int, Query(ge=1, le=service.MAX_LOG_LINES, description="Lines from the end (from `offset` with one)")
    ] = 200,
    file: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=1024,
            description="Only this file, by the name a listing gave it (`attempt-2.log`), of any attempt",
        ),
    ] = None,
    offset: Annotated[
        int | None,
        Query(
            ge=0,
            le=2**62,
            description="With `file`: the lines written from this byte on (a previous answer's `end`) "
            "instead of the tail, for following a log as it grows",
        ),
    ] = None,
) -> JobLogs:
    """The tail of the attempt log and of each rank's log file, from every node of the job; or,
    with `file` and `offset`, what one file gained since a previous read."""
    if offset is not None and file is None:
        raise InvalidRequest("offset needs file: an offset is a position in one file", param="offset")
    job = jobs.get_job(session, principal, job_id)
    resources = resources_of(job.spec)
    selection = service.LogSelection(
        attempt=attempt,
        node=node,
        rank=rank,
        nnodes=resources.nnodes,
        nproc_per_node=resources.nproc_per_node,
        file=file,
    )
    try:
        files = service.read_logs(jobs.job_dir(settings, job), selection, lines, offset)
    except service.OffsetPastEnd as exc:
        raise InvalidRequest(str(exc), param="offset") from None
    return JobLogs(job_id=job.id, files=files)
