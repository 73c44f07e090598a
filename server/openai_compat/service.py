"""Translate between the OpenAI fine-tuning API and our jobs, which stay the one store.

An OpenAI create becomes a `JobCreate` (hyperparameters resolved into the JobSpec) and goes through
the same service as `POST /v1/jobs`; every OpenAI object is rendered from our rows, so both APIs
always agree on a job's state.
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from pydantic import ValidationError

from jobcore import model_names as names
from jobcore.db.models import Checkpoint, Job
from server.errors import InvalidRequest, param_from_loc, validation_error_of
from server.jobs.schemas import JobCreate, JobEventOut, JobOut
from server.openai_compat.schemas import (
    CheckpointMetrics,
    FineTuningCheckpoint,
    FineTuningError,
    FineTuningEvent,
    FineTuningJob,
    FineTuningJobCreate,
    Hyperparameters,
    ResolvedHyperparameters,
)
from twinkle_core.spec import OptimizerSection, ResourcesSection, TrainingSection
from twinkle_core.spec_hints import meant_instead

# "auto" means JobSpec's own default, so the two APIs cannot drift apart: the learning rate that
# learning_rate_multiplier=1 stands for, and the global batch size.
BASE_LEARNING_RATE: float = OptimizerSection.model_fields["lr"].default
AUTO_BATCH_SIZE: int = TrainingSection.model_fields["batch_size"].default
# Except for epochs: OpenAI's "auto" trains several epochs (it picks by data size; 3 is its usual
# choice), where a JobSpec that says nothing trains one. Documented in docs/openai-compat.md.
AUTO_EPOCHS = 3
EVENT_ID_PREFIX = "ftevent-"

# Our statuses have more detail than OpenAI's; each maps to the state a client would act on.
STATUS_MAP = {
    "queued": "queued",
    "retrying": "queued",
    "starting": "running",
    "running": "running",
    "pausing": "running",
    "cancelling": "running",
    "paused": "paused",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}

# The sections of twinkle_spec that the OpenAI fields are merged into.
MERGED_SECTIONS = ("model", "data", "training", "optimizer", "resources")

# Where an OpenAI field lands in the JobSpec, to name the OpenAI field in errors.
FIELD_FOR_SPEC_PATH = {
    "spec.model.model_id": "model",
    "spec.data.train_file": "training_file",
    "spec.data.validation_file": "validation_file",
    "spec.training.num_epochs": "hyperparameters.n_epochs",
    "spec.training.batch_size": "hyperparameters.batch_size",
    "spec.optimizer.lr": "hyperparameters.learning_rate_multiplier",
    "spec.training.seed": "seed",
    "name": "suffix",
}


def _hyperparameters(body: FineTuningJobCreate) -> Hyperparameters:
    """The request's hyperparameters: `method.supervised.hyperparameters`, or the top-level
    `hyperparameters` that OpenAI deprecated for it. Given in both places, they must agree."""
    method = body.method
    chosen = method.supervised.hyperparameters if method and method.supervised else None
    legacy = body.hyperparameters
    if chosen is None:
        return legacy or Hyperparameters()
    if legacy is not None:
        for name in sorted(chosen.model_fields_set & legacy.model_fields_set):
            if getattr(chosen, name) != getattr(legacy, name):
                raise InvalidRequest(
                    f"hyperparameters.{name} ({getattr(legacy, name)!r}) differs from "
                    f"method.supervised.hyperparameters.{name} ({getattr(chosen, name)!r}): give it once",
                    param=f"hyperparameters.{name}",
                )
        merged = {**legacy.model_dump(exclude_unset=True), **chosen.model_dump(exclude_unset=True)}
        return Hyperparameters.model_validate(merged)
    return chosen


def _hyperparameters_param(body: FineTuningJobCreate, name: str) -> str:
    """Where the request gave hyperparameter `name`, for an error's `param`."""
    method = body.method
    chosen = method.supervised.hyperparameters if method and method.supervised else None
    if chosen is not None and name in chosen.model_fields_set:
        return f"method.supervised.hyperparameters.{name}"
    return f"hyperparameters.{name}"


def to_job_create(body: FineTuningJobCreate, training_rows: int | None = None) -> JobCreate:
    """Resolve "auto" hyperparameters into a full job body; explicit values in twinkle_spec win over
    auto. `training_rows`: the rows of the uploaded training file, which an "auto" batch fits."""
    if body.method and body.method.type != "supervised":
        raise InvalidRequest(
            f"method.type {body.method.type!r} is not supported: only 'supervised' fine-tuning is",
            param="method.type",
        )
    hp = _hyperparameters(body)
    spec: dict[str, Any] = copy.deepcopy(body.twinkle_spec or {})
    for section in MERGED_SECTIONS:  # the OpenAI fields are merged into these
        if section in spec and not isinstance(spec[section], dict):
            param = f"twinkle_spec.{section}"
            raise InvalidRequest(f"{param}: must be an object, got {spec[section]!r}", param=param)
    spec.setdefault("model", {})["model_id"] = body.model
    data = spec.setdefault("data", {})
    data["train_file"] = body.training_file
    if body.validation_file:
        data["validation_file"] = body.validation_file
    training = spec.setdefault("training", {})
    world = _world_size(spec.get("resources") or {})
    if hp.n_epochs != "auto":
        if training.get("max_steps") is not None:
            # max_steps would win over the epochs (it does in a native spec): say so, not drop one.
            param = _hyperparameters_param(body, "n_epochs")
            raise InvalidRequest(
                f"{param} and twinkle_spec.training.max_steps both set the run's length: give one of them",
                param=param,
            )
        training["num_epochs"] = hp.n_epochs
    elif "num_epochs" not in training and "max_steps" not in training:
        training["num_epochs"] = AUTO_EPOCHS
    if hp.batch_size != "auto":
        training["batch_size"] = hp.batch_size
    elif "batch_size" not in training:
        packing = isinstance(spec.get("data"), dict) and spec["data"].get("packing") is True
        rows = None if packing else training_rows  # packed, a row may make several samples
        training["batch_size"] = auto_batch_size(world, rows, training.get("gradient_accumulation_steps"))
    if hp.learning_rate_multiplier != "auto":
        spec.setdefault("optimizer", {})["lr"] = BASE_LEARNING_RATE * hp.learning_rate_multiplier
    if body.seed is not None:
        training["seed"] = body.seed
    try:
        return JobCreate.model_validate({"name": body.suffix, "spec": spec, "metadata": body.metadata or {}})
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] != "extra_forbidden":
            native, message = validation_error_of(first)
            raise in_openai_terms(InvalidRequest(message, param=native)) from exc
        param = openai_param(param_from_loc(first["loc"]) or "")
        message = "unknown field"
        in_spec = first["loc"][:1] == ("spec",)  # named where the user wrote it: twinkle_spec
        meant = meant_instead(first["loc"][1:], root="twinkle_spec") if in_spec else None
        if meant is not None:
            message += f" (did you mean '{meant}'?)"
        raise InvalidRequest(f"{param}: {message}", param=param) from exc


def auto_batch_size(world: int, rows: int | None, accumulation: Any) -> int:
    """The batch size "auto" means: JobSpec's default rounded up to a multiple of the ranks (the
    global batch splits over them); for a smaller file, the largest multiple of the ranks with
    which its rows still make one optimizer step (with the default it could not train at all;
    OpenAI's "auto" adapts to small files too). Where not even one sample per rank fits, the
    default, which the job's checks then refuse with the numbers."""
    batch = -(-AUTO_BATCH_SIZE // world) * world
    if rows is None:
        return batch
    steps = accumulation if isinstance(accumulation, int) and accumulation >= 1 else 1
    fits = rows // steps // world * world
    return min(batch, fits) if fits >= world else batch


def _world_size(resources: dict[str, Any]) -> int:
    """The ranks the job asks for; 1 when its resources are invalid (the job body's validation
    then names the bad field)."""
    try:
        asked = ResourcesSection.model_validate(resources)
    except ValidationError:
        return 1
    return asked.nnodes * asked.nproc_per_node


def openai_param(native: str) -> str:
    """The field a user of the OpenAI API wrote, for a path in our job body."""
    if native in FIELD_FOR_SPEC_PATH:
        return FIELD_FOR_SPEC_PATH[native]
    return "twinkle_spec." + native.removeprefix("spec.") if native.startswith("spec.") else native


# A field of our job body as a message spells it: `spec.` and a dotted path of lower-case names.
_SPEC_PATH_IN_TEXT = re.compile(r"\bspec(?:\.[a-z_]+)+")


def in_openai_terms(exc: InvalidRequest) -> InvalidRequest:
    """The same error, naming the OpenAI fields instead of our spec paths (in `param` and in every
    path its message mentions)."""
    message = _SPEC_PATH_IN_TEXT.sub(lambda found: openai_param(found.group(0)), exc.message)
    if exc.param is None:
        return InvalidRequest(message, param=None, code=exc.code)
    param = openai_param(exc.param)
    return InvalidRequest(message.replace(exc.param, param), param=param, code=exc.code)


def _unix(value: Any) -> int | None:
    return None if value is None else int(value.timestamp())


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def present_job(job: Job, native: JobOut) -> FineTuningJob:
    spec = job.spec
    training, optimizer = spec["training"], spec["optimizer"]
    hyper = ResolvedHyperparameters(
        # With max_steps the epochs follow from the data's size; num_epochs would say nothing real.
        n_epochs="auto" if training.get("max_steps") else _number(training["num_epochs"]),
        batch_size=training["batch_size"],
        learning_rate_multiplier=round(optimizer["lr"] / BASE_LEARNING_RATE, 6),
    )
    error = None
    if job.error:
        error = FineTuningError(
            code=str(job.error.get("kind", "infra")), message=str(job.error.get("message", ""))
        )
    eta = native.progress.eta_seconds
    return FineTuningJob(
        id=job.id,
        created_at=int(job.created_at.timestamp()),
        finished_at=_unix(job.finished_at),
        error=error,
        fine_tuned_model=native.fine_tuned_model,  # the native job's, one rule for both
        hyperparameters=hyper,
        model=str(spec["model"].get("model_id") or ""),
        organization_id=job.project_id,
        seed=int(training["seed"]),
        status=STATUS_MAP[job.status],
        training_file=str(spec["data"]["train_file"]),
        validation_file=spec["data"].get("validation_file"),
        estimated_finish=int(time.time() + eta) if eta is not None else None,
        metadata=job.metadata_ or None,
        method={"type": "supervised", "supervised": {"hyperparameters": hyper.model_dump()}},
        user_provided_suffix=job.name,
        twinkle_job=native.model_dump(mode="json"),
    )


def present_event(event: JobEventOut) -> FineTuningEvent:
    data = dict(event.data or {})
    is_metrics = event.type == "metrics"
    # OpenAI's names for a step's loss and an evaluation's, as its checkpoints' metrics use them.
    if is_metrics and "loss" in data:
        data.setdefault("train_loss", data["loss"])
    if is_metrics and "eval_loss" in data:
        data.setdefault("valid_loss", data["eval_loss"])
    level = event.level if event.level in ("info", "warn", "error") else "info"
    return FineTuningEvent(
        id=f"{EVENT_ID_PREFIX}{event.id}",
        created_at=int(event.created_at.timestamp()),
        level=level,
        message=event.message,
        data=data or None,
        type="metrics" if is_metrics else "message",
    )


def parse_event_cursor(after: str | None) -> int | None:
    if after is None:
        return None
    raw = after.removeprefix(EVENT_ID_PREFIX)
    if not raw.isdigit():
        raise InvalidRequest(f"after: '{after}' is not an event id", param="after")
    return int(raw)


def present_checkpoint(checkpoint: Checkpoint) -> FineTuningCheckpoint:
    metrics = checkpoint.metrics or {}
    return FineTuningCheckpoint(
        id=checkpoint.id,
        created_at=int(checkpoint.created_at.timestamp()),
        fine_tuned_model_checkpoint=names.checkpoint_model_name(checkpoint.job_id, checkpoint.step),
        fine_tuning_job_id=checkpoint.job_id,
        metrics=CheckpointMetrics(
            step=checkpoint.step, train_loss=metrics.get("loss"), valid_loss=metrics.get("eval_loss")
        ),
        step_number=checkpoint.step,
    )
