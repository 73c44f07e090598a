"""HTTP routes of files: upload, list, read, download, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Header, Path, Query, Request, Response, UploadFile
from fastapi.responses import FileResponse

from server.common.pagination import DEFAULT_LIMIT, MAX_LIMIT
from server.deps import ReadPrincipal, SessionDep, SettingsDep, WritePrincipal
from server.errors import NotFound, PayloadTooLarge, error_responses
from server.files import service
from server.files.schemas import FileList, FileOut
from server.jobs.schemas import Deleted

router = APIRouter(prefix="/v1/files", tags=["files"])

FileId = Annotated[str, Path(max_length=64, description="A file id (file-...)")]
AUTH_ERRORS = (401, 403, 429)
# Multipart framing around the file itself; a body bigger than limit + this is refused unread.
MULTIPART_OVERHEAD = 64 * 1024


@router.post(
    "",
    operation_id="uploadFile",
    status_code=201,
    response_model=FileOut,
    responses={
        200: {"model": FileOut, "description": "Replay: the file uploaded earlier with this Idempotency-Key"},
        **error_responses(*AUTH_ERRORS, 409, 413, 422),
    },
)
def upload_file(
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: WritePrincipal,
    file: Annotated[UploadFile, File(description="A JSONL, JSON, CSV or Parquet dataset")],
    purpose: Annotated[str, Form(max_length=32)] = "fine-tune",
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=256,
            description="Same key and content: the same file; same key, other content: 409",
        ),
    ] = None,
) -> FileOut:
    """Upload a dataset. Every record is validated; the first bad line is named in the error."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > settings.max_upload_bytes + MULTIPART_OVERHEAD:
        raise PayloadTooLarge(f"the upload is larger than the limit of {settings.max_upload_bytes} bytes")
    stored, created = service.upload(
        session, settings, principal, file.file, file.filename, purpose, idempotency_key
    )
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return service.present(stored)


@router.get(
    "", operation_id="listFiles", response_model=FileList, responses=error_responses(*AUTH_ERRORS, 422)
)
def list_files(
    session: SessionDep,
    principal: ReadPrincipal,
    purpose: Annotated[str | None, Query(max_length=32)] = None,
    after: Annotated[
        str | None, Query(max_length=64, description="The last file id of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> FileList:
    """The project's files, newest first."""
    files, has_more = service.list_files(session, principal, purpose=purpose, after=after, limit=limit)
    data = [service.present(f) for f in files]
    return FileList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get(
    "/{file_id}", operation_id="getFile", response_model=FileOut, responses=error_responses(*AUTH_ERRORS, 404)
)
def get_file(file_id: FileId, session: SessionDep, principal: ReadPrincipal) -> FileOut:
    return service.present(service.get_file(session, principal, file_id))


@router.get(
    "/{file_id}/content",
    operation_id="downloadFile",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        **error_responses(*AUTH_ERRORS, 404),
    },
)
def download_file(file_id: FileId, session: SessionDep, principal: ReadPrincipal) -> FileResponse:
    """The file's bytes as uploaded."""
    file = service.get_file(session, principal, file_id)
    path = service.stored_path(file)
    if path is None:
        raise NotFound(f"the content of file '{file_id}' is missing from storage")
    return FileResponse(path, filename=file.filename, media_type="application/octet-stream")


@router.delete(
    "/{file_id}",
    operation_id="deleteFile",
    response_model=Deleted,
    responses=error_responses(*AUTH_ERRORS, 404, 409),
)
def delete_file(file_id: FileId, session: SessionDep, principal: WritePrincipal) -> Deleted:
    """Delete a file; refused while a queued, running or paused job uses it."""
    service.delete_file(session, principal, file_id)
    return Deleted(id=file_id, object="file")
