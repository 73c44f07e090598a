"""HTTP routes of checkpoints: list a job's checkpoints, download one as a tar archive."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse

from server.checkpoints import service
from server.checkpoints.schemas import CheckpointList
from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT
from server.deps import ReadPrincipal, SessionDep, SettingsDep
from server.errors import error_responses

router = APIRouter(prefix="/v1/jobs/{job_id}/checkpoints", tags=["checkpoints"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]
CheckpointId = Annotated[str, Path(max_length=64, description="A checkpoint id (ckpt-...)")]


@router.get(
    "",
    operation_id="listCheckpoints",
    response_model=CheckpointList,
    responses=error_responses(401, 403, 404, 422, 429),
)
def list_checkpoints(
    job_id: JobId,
    session: SessionDep,
    principal: ReadPrincipal,
    after: Annotated[
        str | None, Query(max_length=64, description="The last checkpoint id already seen")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> CheckpointList:
    """The job's complete checkpoints, highest step first."""
    rows, has_more = service.list_checkpoints(session, principal, job_id, after=after, limit=limit)
    data = [service.present(c) for c in rows]
    return CheckpointList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get(
    "/{checkpoint_id}/download",
    operation_id="downloadCheckpoint",
    response_class=FileResponse,
    responses={
        200: {
            "description": "A tar archive of the checkpoint directory; supports HTTP Range requests",
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
        },
        206: {"description": "Partial content for a Range request"},
        **error_responses(401, 403, 404, 429),
    },
)
def download_checkpoint(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    session: SessionDep,
    settings: SettingsDep,
    principal: ReadPrincipal,
) -> FileResponse:
    """Download a checkpoint; resume an interrupted download with `Range: bytes=N-`."""
    checkpoint = service.get_checkpoint(session, principal, job_id, checkpoint_id)
    archive = service.checkpoint_archive(settings, checkpoint)
    return FileResponse(archive, media_type="application/x-tar", filename=service.archive_name(checkpoint))
