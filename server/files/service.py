"""File use cases: upload (size-limited, validated), read, delete (refused while in use)."""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobcore.db.models import File, new_id
from jobcore.jobs.states import LIVE, JobStatus
from jobcore.settings import Settings
from server.auth.principal import Principal
from server.common.pagination import split_page
from server.deps import after_commit, after_rollback
from server.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge
from server.files import repository
from server.files.schemas import FileOut
from server.jobs.repository import jobs_using_file
from twinkle_core.dataset.formats import DatasetFormatError, file_format_of, validate_file

PURPOSES = ("fine-tune",)
CHUNK = 1024 * 1024
MAX_FILENAME = 255


def present(file: File) -> FileOut:
    return FileOut(
        id=file.id,
        filename=file.filename,
        purpose=file.purpose,
        format=file.format,
        bytes=file.bytes,
        rows=file.rows,
        sha256=file.sha256,
        created_at=int(file.created_at.timestamp()),
    )


def clean_filename(raw: str | None) -> str:
    # Browsers send a bare name, curl may send a path: only the last component is kept.
    name = (raw or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name or name in (".", "..") or any(ord(ch) < 32 for ch in name):
        raise InvalidRequest("the uploaded file needs a filename with its extension", param="file")
    return name[-MAX_FILENAME:]


def _copy_limited(source: BinaryIO, target: Path, limit: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(target, "wb") as out:
        while chunk := source.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"the file is larger than the upload limit of {limit} bytes", param="file"
                )
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def upload(
    session: Session,
    settings: Settings,
    principal: Principal,
    source: BinaryIO,
    filename: str | None,
    purpose: str,
    idempotency_key: str | None = None,
) -> tuple[File, bool]:
    """Returns (file, created). A key seen before with the same bytes gives the earlier file."""
    if purpose not in PURPOSES:
        raise InvalidRequest(f"purpose must be one of {', '.join(PURPOSES)}", param="purpose")
    name = clean_filename(filename)
    try:
        file_format_of(name)
    except DatasetFormatError as exc:
        raise InvalidRequest(f"{name}: {exc.problem}", param="file", code="invalid_file") from exc
    suffix = Path(name).suffix.lower()
    settings.files_dir.mkdir(parents=True, exist_ok=True)
    incoming = settings.files_dir / f".incoming-{uuid.uuid4().hex}{suffix}"
    try:
        size, sha256 = _copy_limited(source, incoming, settings.max_upload_bytes)
        digest = _request_hash(name, purpose, sha256)
        earlier = _earlier(session, principal, idempotency_key, digest)
        if earlier is not None:
            return earlier, False
        try:
            report = validate_file(incoming)
        except DatasetFormatError as exc:
            unit = "row" if suffix in (".parquet", ".pq") else "line"
            where = f", {unit} {exc.line}" if exc.line is not None else ""
            raise InvalidRequest(f"{name}{where}: {exc.problem}", param="file", code="invalid_file") from exc
        file_id = new_id("file")
        stored = settings.files_dir / f"{file_id}{suffix}"
        os.replace(incoming, stored)
    finally:
        incoming.unlink(missing_ok=True)
    file = File(
        id=file_id,
        project_id=principal.project_id,
        filename=name,
        purpose=purpose,
        format=report.file_format,
        bytes=size,
        rows=report.rows,
        sha256=sha256,
        storage_path=str(stored),
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    # The stored bytes must not outlive a transaction that fails after this point.
    after_rollback(session, lambda: stored.unlink(missing_ok=True))
    session.add(file)
    try:
        session.flush()
    except IntegrityError:
        if idempotency_key is None:
            raise
        # A concurrent upload with the same key won; ours is dropped and theirs is the answer.
        session.rollback()
        session.info.pop("after_rollback", None)
        stored.unlink(missing_ok=True)
        earlier = _earlier(session, principal, idempotency_key, digest)
        if earlier is None:
            raise
        return earlier, False
    return file, True


def _request_hash(filename: str, purpose: str, content_sha256: str) -> str:
    return hashlib.sha256(f"{purpose}\n{filename}\n{content_sha256}".encode()).hexdigest()


def _earlier(session: Session, principal: Principal, key: str | None, digest: str) -> File | None:
    if key is None:
        return None
    earlier = repository.file_by_idempotency_key(session, principal.project_id, key)
    if earlier is not None and earlier.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was already used to upload different content",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    return earlier


def get_file(session: Session, principal: Principal, file_id: str) -> File:
    file = repository.get_file(session, principal.project_id, file_id)
    if file is None:
        raise NotFound(f"no file '{file_id}' in this project", param="file_id")
    return file


def list_files(
    session: Session, principal: Principal, *, purpose: str | None, after: str | None, limit: int
) -> tuple[list[File], bool]:
    cursor: tuple[datetime, str] | None = None
    if after is not None:
        anchor = repository.get_file(session, principal.project_id, after)
        if anchor is None:
            raise InvalidRequest(f"after: no file '{after}' in this project", param="after")
        cursor = (anchor.created_at, anchor.id)
    rows = repository.list_files(session, principal.project_id, purpose=purpose, after=cursor, limit=limit)
    return split_page(rows, limit)


def delete_file(session: Session, principal: Principal, file_id: str) -> None:
    file = get_file(session, principal, file_id)
    # A paused job reads its data again when it resumes: deleting the file would fail it then.
    statuses = [s.value for s in (*LIVE, JobStatus.PAUSED)]
    users = jobs_using_file(session, principal.project_id, file.id, statuses)
    if users:
        names = ", ".join(f"{j.id} ({j.status})" for j in users[:5])
        raise Conflict(f"the file is used by jobs that will still read it: {names}", code="file_in_use")
    stored = Path(file.storage_path)
    session.delete(file)
    session.flush()
    after_commit(session, lambda: stored.unlink(missing_ok=True))


def stored_path(file: File) -> Path | None:
    path = Path(file.storage_path)
    return path if path.is_file() else None
