"""HTTP routes of exports: request a checkpoint's export, read and list exports, download one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import FileResponse

from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal
from server.errors import error_responses
from server.exports import service
from server.exports.schemas import ExportCreate, ExportList, ExportOut
from twinkle_core.spec import MAX_COUNT

router = APIRouter(tags=["exports"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
ExportId = Annotated[str, Path(max_length=64, description="An export id (export-...)")]
Step = Annotated[
    int, Path(ge=0, le=MAX_COUNT, description="The optimizer step of a complete checkpoint of the job")
]


def get_export_dispatch(request: Request) -> service.ExportDispatch:
    dispatch: service.ExportDispatch = request.app.state.export_dispatch
    return dispatch


ExportDispatchDep = Annotated[service.ExportDispatch, Depends(get_export_dispatch)]


@router.post(
    "/v1/jobs/{job_id}/checkpoints/{step}/export",
    operation_id="createExport",
    status_code=202,
    response_model=ExportOut,
    responses={
        200: {"model": ExportOut, "description": "The export of this checkpoint and kind that exists"},
        **error_responses(401, 403, 404, 409, 422, 429),
    },
)
def create_export(
    job_id: JobId,
    step: Step,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
    dispatch: ExportDispatchDep,
    body: Annotated[ExportCreate | None, Body()] = None,
) -> ExportOut:
    """Export a complete checkpoint as a standalone Hugging Face model folder, made by a worker.

    LoRA jobs: merged into the base model by default, the adapter alone with `merge: false`.
    Full fine-tunes: the full model. 202 when the export was queued (again, for a failed one);
    200 with the existing export of this checkpoint and kind otherwise. Follow it with
    `GET /v1/exports/{export_id}` and download it from `.../content` once `succeeded`.
    """
    merge = body.merge if body is not None else None
    export, queued = service.request_export(session, settings, principal, job_id, step, merge, dispatch)
    if not queued:
        response.status_code = 200
    return service.present(export)


@router.get(
    "/v1/jobs/{job_id}/exports",
    operation_id="listExports",
    response_model=ExportList,
    responses=error_responses(401, 403, 404, 422, 429),
)
def list_exports(
    job_id: JobId,
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[str | None, Query(max_length=64, description="The last export id already seen")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> ExportList:
    """The job's exports, newest first."""
    rows, has_more = service.list_exports(session, principal, job_id, after=after, limit=limit)
    data = [service.present(e) for e in rows]
    return ExportList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get(
    "/v1/exports/{export_id}",
    operation_id="getExport",
    response_model=ExportOut,
    responses=error_responses(401, 403, 404, 429),
)
def get_export(export_id: ExportId, session: SessionDep, principal: ReadPrincipal) -> ExportOut:
    """An export and its status (pending, running, succeeded, failed with `error`)."""
    return service.present(service.get_export(session, principal, export_id))


@router.get(
    "/v1/exports/{export_id}/content",
    operation_id="downloadExport",
    response_class=FileResponse,
    responses={
        200: {
            "description": "A tar archive of the exported Hugging Face model folder; supports HTTP "
            "Range requests",
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
        },
        206: {"description": "Partial content for a Range request"},
        **error_responses(401, 403, 404, 409, 429),
    },
)
def download_export(
    export_id: ExportId, session: SessionDep, settings: SettingsDep, principal: ReadPrincipal
) -> FileResponse:
    """Download a succeeded export (409 before); resume an interrupted download with `Range: bytes=N-`."""
    export = service.get_export(session, principal, export_id)
    archive = service.export_archive(settings, export)
    return FileResponse(archive, media_type="application/x-tar", filename=service.archive_name(export))
