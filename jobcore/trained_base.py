"""Training on from a fine-tuned model: `spec.model.model_id` may name a job's model as the
service calls it (`ft:<base>[:<suffix>]:<job id>`, or `<job id>:ckpt-<step>` for any checkpoint;
`jobcore.model_names`), the way OpenAI's fine-tuning takes a fine-tuned model as its base.

The spec keeps the name, so a user reads what the job trained on, and clone and resume keep it.
The server checks the name when the job is created (`server.jobs.references`); the worker turns
it into the checkpoint's directory when it launches the job (`worker.spec_resolution`), as it
turns an uploaded file's id into its path. Both ask `find_trained_base`, so they agree.

A name is the only way to a checkpoint as a base: paths inside the service's storage are refused
(another project's weights must not be one path away), and a name resolves in its project only.

A LoRA job's model is its adapter on its base: the worker merges the two into the new job's
directory before it launches (`worker.base_merge`), and the job trains those whole weights. The
new job trains in full: a LoRA on a trained model would need that model beside it for as long
as it is served, so it is refused (`server.jobs.references.check_trained_base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore import model_names, storage
from jobcore.db.models import Job
from jobcore.jobs.checkpoints import live_checkpoint
from jobcore.jobs.states import LIVE, JobStatus


@dataclass(frozen=True)
class AdapterBase:
    """What a LoRA job trained on, to merge its adapter into: the base as its spec names it."""

    model_id: str | None
    model_cls: str
    config: dict[str, Any] | None
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class TrainedBase:
    job_id: str
    step: int
    # The checkpoint's directory: whole weights, which TransformersModel loads as model_id, or a
    # LoRA adapter (`adapter_of` says on what), merged into its base before the job launches.
    checkpoint: str
    adapter_of: AdapterBase | None = None


class NotATrainedBase(ValueError):
    """The name does not lead to weights this project can train on; the message says why."""


def is_trained_base_name(model_id: str | None) -> bool:
    return model_id is not None and model_names.parse(model_id) is not None


def jobs_training_from(session: Session, project_id: str, job_id: str) -> list[Job]:
    """The project's jobs that will still load `job_id`'s weights as their base: queued, running
    or paused (a launch or a resume reads the base again)."""
    waiting = [*LIVE, JobStatus.PAUSED]
    candidates = session.scalars(select(Job).where(Job.project_id == project_id, Job.status.in_(waiting)))
    users = []
    for job in candidates:
        model_id = ((job.spec or {}).get("model") or {}).get("model_id")
        parsed = model_names.parse(model_id) if isinstance(model_id, str) else None
        if parsed is not None and parsed.job_id == job_id:
            users.append(job)
    return users


def find_trained_base(session: Session, project_id: str, model_id: str) -> TrainedBase:
    """The complete checkpoint `model_id` names in `project_id`, or NotATrainedBase."""
    parsed = model_names.parse(model_id)
    if parsed is None:
        raise NotATrainedBase(f"'{model_id}' is not a fine-tuned model's name")
    job = session.get(Job, parsed.job_id)
    if job is None or job.project_id != project_id:
        raise NotATrainedBase(f"no job '{parsed.job_id}' in this project")
    step: int | None = None
    if isinstance(parsed, model_names.FineTunedName):
        own = model_names.job_model_name(job.id, job.spec, job.name)
        if own != model_id:
            raise NotATrainedBase(f"'{model_id}' is not the name of job '{job.id}''s model ('{own}')")
        if job.status != JobStatus.SUCCEEDED:
            raise NotATrainedBase(
                f"job '{job.id}' is {job.status}: its model exists once it succeeded "
                f"(name one of its checkpoints as '{job.id}{model_names.CHECKPOINT_INFIX}STEP')"
            )
    else:
        step = parsed.step
    checkpoint = live_checkpoint(session, job.id, step)
    if checkpoint is None:
        at = f"at step {step}" if step is not None else "left"
        raise NotATrainedBase(f"job '{job.id}' has no complete checkpoint {at}")
    if storage.is_remote(checkpoint.path):
        raise NotATrainedBase(
            f"the checkpoint of job '{job.id}' at step {checkpoint.step} is kept in object storage, "
            "which a job cannot train on from yet"
        )
    return TrainedBase(job.id, checkpoint.step, checkpoint.path, _adapter_of(job))


def _adapter_of(job: Job) -> AdapterBase | None:
    """The base a LoRA job's adapter goes on, None for a full fine-tune. (Such a base is never a
    trained model itself: a LoRA on a fine-tuned model is refused at submit.)"""
    spec = job.spec or {}
    if spec.get("adapter") is None:
        return None
    model = spec.get("model") or {}
    if not model.get("model_id"):
        raise NotATrainedBase(
            f"job '{job.id}''s LoRA adapter sits on a base built from model.config alone: there "
            "are no base weights to merge it into"
        )
    return AdapterBase(
        model_id=model.get("model_id"),
        model_cls=model.get("model_cls") or "AutoModelForCausalLM",
        config=model.get("config"),
        kwargs=model.get("kwargs") or {},
    )
