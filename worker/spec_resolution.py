"""Turn a stored job spec into the file the runner reads: local paths are checked again and
resolved, uploaded file ids become local paths, and a fine-tuned model named as the base
(`jobcore.trained_base`) its checkpoint's directory, or for a LoRA job's model the folder its
adapter is merged into (`worker.base_merge`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from jobcore.db.models import File, Job
from jobcore.local_paths import PathRefused, pin_local_path
from jobcore.settings import Settings
from jobcore.trained_base import NotATrainedBase, find_trained_base, is_trained_base_name
from twinkle_core.export import ExportRequest
from twinkle_core.spec import JobSpec
from worker.base_merge import merge_request


@dataclass(frozen=True)
class ResolvedSpec:
    spec: JobSpec
    # A LoRA job's model as the base: the merge to run before launching (`worker.base_merge`),
    # into the folder spec.model.model_id names.
    base_merge: ExportRequest | None = None


def resolve_spec(session: Session, job: Job, settings: Settings) -> ResolvedSpec:
    """Validate the stored spec, replace `file-...` ids by the uploaded files' storage paths, a
    fine-tuned model's name by its weights (a checkpoint, or a LoRA job's merged into its base),
    and local paths by their checked real paths (`jobcore.local_paths.pin_local_path`).

    Raises ValueError naming the field when the spec is invalid or a file id is unknown: a user
    error, never retried.
    """
    try:
        spec = JobSpec.model_validate(job.spec)
    except Exception as exc:  # pydantic.ValidationError is a ValueError subclass; be explicit anyway
        raise ValueError(f"spec: {exc}") from exc
    model = spec.model
    # Checked at submit; checked again here, and resolved, in case a link changed since. (A file
    # id or a model's name is no path, and stays as it is for the steps below.)
    for field in ("train_file", "validation_file"):
        setattr(spec.data, field, _pinned(getattr(spec.data, field), f"data.{field}", settings))
    model.model_id = _pinned(model.model_id, "model.model_id", settings)
    model.tokenizer_id = _pinned(model.tokenizer_id, "model.tokenizer_id", settings)
    base_merge = None
    if is_trained_base_name(spec.model.model_id):
        assert spec.model.model_id is not None
        try:
            base = find_trained_base(session, job.project_id, spec.model.model_id)
        except NotATrainedBase as exc:  # e.g. the job it names was deleted since
            raise ValueError(f"model.model_id: {exc}") from None
        if base.adapter_of is None:
            spec.model.model_id = base.checkpoint
        else:  # a LoRA job's model: its adapter merged into its base, in this job's directory
            base_merge = merge_request(base, settings.jobs_dir / job.id, settings)
            spec.model.model_id = base_merge.output_dir
    data = spec.data
    data.train_file = _resolve_file(session, job.project_id, data.train_file, "data.train_file")
    if data.validation_file is not None:
        data.validation_file = _resolve_file(
            session, job.project_id, data.validation_file, "data.validation_file"
        )
    return ResolvedSpec(spec, base_merge)


def _pinned(value: str | None, field: str, settings: Settings) -> str | None:
    try:
        return pin_local_path(value, settings)
    except PathRefused as exc:
        raise ValueError(f"{field}: {exc}") from None


def _resolve_file(session: Session, project_id: str, ref: str, field: str) -> str:
    if not ref.startswith("file-"):
        return ref
    row = session.get(File, ref)
    if row is None or row.project_id != project_id:
        raise ValueError(f"{field}: no uploaded file '{ref}' in this project")
    if not Path(row.storage_path).is_file():
        raise ValueError(f"{field}: the stored data of '{ref}' is missing on this worker")
    return row.storage_path


# Beside spec.json: the attempt it was resolved for. A gang node that finds its attempt there
# shares node 0's job directory; one that finds an earlier attempt (or none) resolves its own.
SPEC_ATTEMPT_FILE = "spec.attempt"


def write_spec(spec: JobSpec, job_dir: Path, attempt: int) -> Path:
    path = job_dir / "spec.json"
    tmp = path.with_suffix(".json.tmp")
    spec.dump(tmp)
    tmp.replace(path)
    marker = job_dir / SPEC_ATTEMPT_FILE
    marker_tmp = marker.with_suffix(".tmp")
    marker_tmp.write_text(str(attempt))
    marker_tmp.replace(marker)
    return path


def spec_written_for(job_dir: Path, attempt: int) -> bool:
    """Whether job_dir's spec.json was resolved for `attempt` (by this host or, on a shared file
    system, by node 0)."""
    try:
        return (job_dir / SPEC_ATTEMPT_FILE).read_text().strip() == str(attempt)
    except OSError:
        return False
