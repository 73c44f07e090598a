"""Turn a stored job spec into the file the runner reads: uploaded file ids become local paths."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from jobcore.db.models import File, Job
from twinkle_core.spec import JobSpec


def resolve_spec(session: Session, job: Job) -> JobSpec:
    """Validate the stored spec and replace `file-...` ids by the uploaded files' storage paths.

    Raises ValueError naming the field when the spec is invalid or a file id is unknown: a user
    error, never retried.
    """
    try:
        spec = JobSpec.model_validate(job.spec)
    except Exception as exc:  # pydantic.ValidationError is a ValueError subclass; be explicit anyway
        raise ValueError(f"spec: {exc}") from exc
    data = spec.data
    data.train_file = _resolve_file(session, job.project_id, data.train_file, "data.train_file")
    if data.validation_file is not None:
        data.validation_file = _resolve_file(
            session, job.project_id, data.validation_file, "data.validation_file"
        )
    return spec


def _resolve_file(session: Session, project_id: str, ref: str, field: str) -> str:
    if not ref.startswith("file-"):
        return ref
    row = session.get(File, ref)
    if row is None or row.project_id != project_id:
        raise ValueError(f"{field}: no uploaded file '{ref}' in this project")
    if not Path(row.storage_path).is_file():
        raise ValueError(f"{field}: the stored data of '{ref}' is missing on this worker")
    return row.storage_path


def write_spec(spec: JobSpec, job_dir: Path) -> Path:
    path = job_dir / "spec.json"
    tmp = path.with_suffix(".json.tmp")
    spec.dump(tmp)
    tmp.replace(path)
    return path
