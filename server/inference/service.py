"""Which checkpoint a `model` names, and what a project can call (`GET /v1/models`).

A name resolves to a complete checkpoint of a job of the caller's project, or to a 404 naming
`model`: another project's job reads as unknown, a job that has not succeeded has no
`fine_tuned_model` yet (its checkpoints are still callable as `JOB_ID:ckpt-STEP`), and a step
without a live checkpoint row (never completed, or dropped by retention) is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from jobcore import model_names as names
from jobcore import storage
from jobcore.jobs.checkpoints import live_checkpoint
from jobcore.jobs.states import JobStatus
from server.auth.principal import Principal
from server.errors import NotFound
from server.inference import repository
from server.inference.schemas import ModelList, ModelObject
from twinkle_core.spec import ModelSection

BASE_MODEL_OWNER = "twinkle"


@dataclass(frozen=True)
class ServedModel:
    """A resolved `model`: the checkpoint a serving host loads, and what it needs beside it."""

    name: str  # as the client spelled it: OpenAI answers echo the requested model
    job_id: str
    step: int
    # The checkpoint directory, absolute; or its s3:// location when it is kept in object storage
    # (the host then fetches it into its jobs root first).
    checkpoint: str
    base_model: str | None  # a LoRA job's base (`model_id`, a path under an allowed root or a hub id)
    # How the job built that base (its spec's model section), for the host to build it the same.
    base_model_cls: str | None = None
    base_config: dict[str, Any] | None = None
    base_kwargs: dict[str, Any] | None = None

    def host_target(self) -> dict[str, Any]:
        """The `twinkle` key of a request to a serving host (the host contract)."""
        target: dict[str, Any] = {
            "checkpoint": self.checkpoint,
            "base_model": self.base_model,
            "model": self.name,
        }
        if storage.is_remote(self.checkpoint):
            target["job_id"] = self.job_id  # where the host puts its copy: the job's directory
        if self.base_model is not None:
            target.update(
                base_model_cls=self.base_model_cls, base_config=self.base_config, base_kwargs=self.base_kwargs
            )
        return target


def _unknown(model: str, why: str) -> NotFound:
    return NotFound(f"model '{model}': {why}", param="model", code="model_not_found")


class JobFields(Protocol):
    """What naming and serving a job's model read of it: a `Job` row, or the fields of one."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def spec(self) -> dict[str, Any] | None: ...


def fine_tuned_model(job: JobFields) -> str:
    """The `fine_tuned_model` of a job (meaningful once it succeeded)."""
    return names.job_model_name(job.id, job.spec, job.name)


def _base_of(job: JobFields) -> dict[str, Any]:
    """A LoRA job's checkpoint holds the adapter alone: the host merges it into this base, built as
    the job built it (model class, config overrides, kwargs). Nothing for a full fine-tune."""
    spec = job.spec or {}
    if spec.get("adapter") is None:
        return {"base_model": None}
    section = ModelSection.model_validate(spec.get("model") or {})
    return {
        "base_model": section.model_id,
        "base_model_cls": section.model_cls,
        "base_config": section.config,
        "base_kwargs": section.kwargs or None,
    }


def _served(model: str, job: JobFields, step: int, path: str) -> ServedModel:
    return ServedModel(name=model, job_id=job.id, step=step, checkpoint=path, **_base_of(job))


def resolve(session: Session, principal: Principal, model: str) -> ServedModel:
    parsed = names.parse(model)
    if isinstance(parsed, names.FineTunedName):
        found = repository.job_with_checkpoint(session, principal.project_id, parsed.job_id, None)
        if found is None or fine_tuned_model(found) != model:
            raise _unknown(model, "no such fine-tuned model in this project")
        if found.status != JobStatus.SUCCEEDED:
            raise _unknown(
                model,
                f"job '{found.id}' is {found.status}; its model exists once it succeeded "
                f"(call one of its checkpoints as '{found.id}{names.CHECKPOINT_INFIX}STEP')",
            )
        if found.step is None or found.path is None:
            raise _unknown(model, f"job '{found.id}' has no checkpoint left to serve")
        return _served(model, found, found.step, found.path)
    if isinstance(parsed, names.CheckpointName):
        found = repository.job_with_checkpoint(session, principal.project_id, parsed.job_id, parsed.step)
        if found is None:
            raise _unknown(model, f"no job '{parsed.job_id}' in this project")
        if found.step is None or found.path is None:
            raise _unknown(model, f"job '{found.id}' has no complete checkpoint at step {parsed.step}")
        return _served(model, found, found.step, found.path)
    # Before `ft:` names, `fine_tuned_model` was the final checkpoint's directory: clients that
    # stored it keep working.
    at_path = (
        repository.checkpoint_at_path(session, principal.project_id, model) if model.startswith("/") else None
    )
    if at_path is not None:
        job, checkpoint = at_path
        return _served(model, job, checkpoint.step, checkpoint.path)
    if repository.model_in_use(session, principal.project_id, model):
        raise _unknown(model, "a base model is listed, not served: call a fine-tuned model or a checkpoint")
    raise _unknown(model, "expected a fine_tuned_model ('ft:...') or 'JOB_ID:ckpt-STEP'")


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())


def get_model(session: Session, principal: Principal, model: str) -> ModelObject:
    """One model by its name (`client.models.retrieve`): anything `resolve` serves, or a base model
    the project trains on; everything else is the same 404 as a call would get."""
    try:
        served = resolve(session, principal, model)
    except NotFound:
        first_used = dict(repository.base_models(session, principal.project_id)).get(model)
        if first_used is None:
            raise
        return ModelObject(id=model, created=_unix(first_used), owned_by=BASE_MODEL_OWNER, servable=False)
    job = repository.job_in_project(session, principal.project_id, served.job_id)
    checkpoint = live_checkpoint(session, served.job_id, served.step)
    assert job is not None and checkpoint is not None  # resolve() has just read both
    final = isinstance(names.parse(model), names.FineTunedName)
    return ModelObject(
        id=model,
        created=_unix(job.finished_at if final and job.finished_at else checkpoint.created_at),
        owned_by=principal.project_id,
        parent=ModelSection.model_validate((job.spec or {}).get("model") or {}).model_id,
        job_id=job.id,
        servable=True,
    )


def list_models(session: Session, principal: Principal) -> ModelList:
    """Fine-tuned models (newest first), then the base models they were trained from."""
    tuned = [
        ModelObject(
            id=names.fine_tuned_model_name(row.job_id, row.model_id or "", row.name),
            created=_unix(row.finished_at or row.created_at),
            owned_by=principal.project_id,
            parent=row.model_id,
            job_id=row.job_id,
            servable=True,
        )
        for row in repository.fine_tuned_models(session, principal.project_id)
    ]
    bases = [
        ModelObject(id=model_id, created=_unix(first_used), owned_by=BASE_MODEL_OWNER, servable=False)
        for model_id, first_used in repository.base_models(session, principal.project_id)
    ]
    return ModelList(data=tuned + bases)
