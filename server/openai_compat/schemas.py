"""Request and response bodies shaped as the OpenAI fine-tuning API shapes them.

Timestamps are Unix seconds and ids are our own (`job-…`, `file-…`), as the OpenAI client treats
ids as opaque strings. Our full JobSpec may ride along as `twinkle_spec`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from twinkle_core.spec import MAX_SEED

Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_epochs: Auto | int = Field(default="auto", description="'auto' resolves to 3")
    batch_size: Auto | int = Field(default="auto", description="'auto' resolves to 8 (global)")
    learning_rate_multiplier: Auto | float = Field(
        default="auto", description="Multiplies the base learning rate 1e-5; 'auto' resolves to 1.0"
    )


class SupervisedMethod(BaseModel):
    model_config = ConfigDict(extra="allow")

    hyperparameters: Hyperparameters | None = None


class Method(BaseModel):
    model_config = ConfigDict(extra="allow")

    # Any string, so that "dpo" or "reinforcement" is refused by name (server/openai_compat/service.py).
    type: str = Field(default="supervised", max_length=64, description="Only 'supervised' is supported")
    supervised: SupervisedMethod | None = None


class FineTuningJobCreate(BaseModel):
    """`POST /v1/fine_tuning/jobs`, as the official client sends it."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="A model id: a local directory under an allowed root, or a hub id")
    training_file: str = Field(description="An uploaded file id (file-...)")
    validation_file: str | None = None
    hyperparameters: Hyperparameters | None = None
    method: Method | None = None
    suffix: str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    metadata: dict[str, str] | None = None
    integrations: list[dict[str, Any]] | None = Field(default=None, description="Accepted and ignored")
    twinkle_spec: dict[str, Any] | None = Field(
        default=None, description="Our full JobSpec (or parts of it); the OpenAI fields above override it"
    )


class ResolvedHyperparameters(BaseModel):
    n_epochs: int | float | Auto = Field(
        description="'auto' when twinkle_spec.training.max_steps sets the length instead of epochs"
    )
    batch_size: int
    learning_rate_multiplier: float


class FineTuningError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningJob(BaseModel):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str
    created_at: int
    finished_at: int | None
    error: FineTuningError | None
    fine_tuned_model: str | None = Field(
        description="Once succeeded: the model name to call (`ft:<base>[:<suffix>]:<job id>`) in "
        "/v1/chat/completions and /v1/completions; the directory is `twinkle_job.latest_checkpoint.path`"
    )
    hyperparameters: ResolvedHyperparameters
    model: str
    organization_id: str
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: str = Field(description="validating_files|queued|running|paused|succeeded|failed|cancelled")
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None
    estimated_finish: int | None
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None
    method: dict[str, Any]
    user_provided_suffix: str | None = None
    twinkle_job: dict[str, Any] = Field(description="The native job object (/v1/jobs/{id})")


class FineTuningEvent(BaseModel):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None
    type: Literal["message", "metrics"]


class CheckpointMetrics(BaseModel):
    model_config = ConfigDict(extra="allow")

    step: float | None = None
    train_loss: float | None = None
    valid_loss: float | None = None


class FineTuningCheckpoint(BaseModel):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str = Field(
        description="The checkpoint's model name (`<job id>:ckpt-<step>`) for the inference endpoints"
    )
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


class OpenAIList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Any]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
