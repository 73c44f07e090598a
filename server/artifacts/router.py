"""HTTP routes of a job's tracker outputs: list them, download one as a tar.gz."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from server.artifacts import service
from server.artifacts.schemas import ArtifactList, ArtifactOut
from server.deps import ReadPrincipal, SessionDep, SettingsDep
from server.errors import error_responses
from server.jobs import service as jobs
from twinkle_core.trackers import TrackerName

router = APIRouter(prefix="/v1/jobs/{job_id}/artifacts", tags=["artifacts"])

JobId = Annotated[str, Path(max_length=64, description="A job id (job-...)")]


@router.get(
    "",
    operation_id="listJobArtifacts",
    response_model=ArtifactList,
    responses=error_responses(401, 403, 404, 429),
)
def list_artifacts(
    job_id: JobId, session: SessionDep, settings: SettingsDep, principal: ReadPrincipal
) -> ArtifactList:
    """What the job's experiment trackers (`training.report_to`) wrote to its directory so far."""
    job = jobs.get_job(session, principal, job_id)
    data = [
        ArtifactOut(
            name=a.name,
            path=a.path,
            files=a.files,
            size_bytes=a.size_bytes,
            modified_at=a.modified_at,
            download_url=f"/v1/jobs/{job.id}/artifacts/{a.name}",
        )
        for a in service.list_artifacts(jobs.job_dir(settings, job))
    ]
    return ArtifactList(job_id=job.id, data=data)


@router.get(
    "/{name}",
    operation_id="downloadJobArtifact",
    response_class=FileResponse,
    responses={
        200: {
            "description": "A gzip-compressed tar archive of the tracker's output",
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(401, 403, 404, 429),
    },
)
def download_artifact(
    job_id: JobId, name: TrackerName, session: SessionDep, settings: SettingsDep, principal: ReadPrincipal
) -> FileResponse:
    """Download one tracker's output as it is now, e.g. `tensorboard` for `tensorboard --logdir`."""
    job = jobs.get_job(session, principal, job_id)
    archive = service.pack_artifact(settings, jobs.job_dir(settings, job), job.id, name)
    return FileResponse(
        archive,
        media_type="application/gzip",
        filename=service.archive_name(job.id, name),
        background=BackgroundTask(os.unlink, archive),
    )
