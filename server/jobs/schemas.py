"""Request and response bodies of the job API."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobcore.jobs.engine import Engine
from jobcore.jobs.events import EVENT_TYPES
from jobcore.jobs.states import JobAction, JobStatus
from server.common.pagination import ListEnvelope
from twinkle_core.spec import JobSpec

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
# Keys are labels (letters, digits, `_.-`), so a filter can name them safely in a JSON path.
METADATA_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

JOB_EXAMPLE: dict[str, Any] = {
    "name": "llama-sft-demo",
    "spec": {
        "model": {"model_id": "Qwen/Qwen2.5-0.5B", "mixed_precision": "bf16"},
        "data": {"train_file": "file-abcdef0123456789abcdef01"},
        "training": {"max_steps": 100, "batch_size": 8, "save_every": 20},
    },
    "priority": 0,
    "max_retries": 3,
    "metadata": {"team": "nlp"},
}


def check_metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA_PAIRS:
        raise ValueError(f"at most {MAX_METADATA_PAIRS} metadata pairs are allowed, got {len(value)}")
    for key, item in value.items():
        if not METADATA_KEY.match(key):
            raise ValueError(f"metadata keys are 1 to {MAX_METADATA_KEY} letters, digits, '_', '.' or '-'")
        if len(item) > MAX_METADATA_VALUE:
            raise ValueError(f"metadata value of '{key}' is longer than {MAX_METADATA_VALUE} characters")
    return value


def check_webhook_url(value: str | None) -> str | None:
    if value is None:
        return value
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("webhook_url must be an http(s) URL with a host")
    return value


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobCreate(_Body):
    """A new training job. Only `spec.model.model_id` and `spec.data.train_file` are required."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [JOB_EXAMPLE]})

    name: str | None = Field(default=None, max_length=256)
    spec: JobSpec
    priority: int = Field(default=0, ge=-100, le=100, description="Higher priorities are claimed first")
    max_retries: int = Field(default=3, ge=0, le=20, description="Relaunches after infrastructure failures")
    timeout_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    metadata: dict[str, str] = Field(default_factory=dict, description="Up to 16 string pairs")
    webhook_url: str | None = Field(default=None, max_length=2048, description="http(s) URL told of changes")

    _metadata = field_validator("metadata")(check_metadata)
    _webhook = field_validator("webhook_url")(check_webhook_url)


class JobClone(_Body):
    """A copy of a job; `spec` holds overrides deep-merged into the source's resolved spec."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "retry-lr", "spec": {"optimizer": {"lr": 2e-5}}}]},
    )

    name: str | None = Field(default=None, max_length=256)
    spec: dict[str, Any] = Field(default_factory=dict, description="Overrides merged into the source spec")
    priority: int | None = Field(default=None, ge=-100, le=100)
    max_retries: int | None = Field(default=None, ge=0, le=20)
    timeout_seconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    metadata: dict[str, str] | None = None
    webhook_url: str | None = Field(default=None, max_length=2048)

    _metadata = field_validator("metadata")(lambda v: None if v is None else check_metadata(v))
    _webhook = field_validator("webhook_url")(check_webhook_url)


class JobResume(_Body):
    checkpoint: str | None = Field(
        default=None, max_length=64, description="A checkpoint id of this job; default: the latest one"
    )


class Progress(BaseModel):
    step: int
    total_steps: int | None
    epoch: float | None
    percent: float | None
    loss: float | None
    lr: float | None
    tokens_per_second: float | None
    eta_seconds: float | None


class CheckpointRef(BaseModel):
    id: str
    step: int
    metrics: dict[str, Any]
    path: str = Field(description="The checkpoint directory on the service's storage")
    created_at: datetime


class JobError(BaseModel):
    kind: Literal["user", "infra"] | str
    message: str


class EngineRef(BaseModel):
    """The cluster engine running the job, when a worker handed it to one."""

    name: Engine
    job_id: str | None = Field(description="The job's id in the engine (Slurm job id, Ray placement group)")
    state: str | None = Field(description="The engine's last reported state, as the engine spells it")


class JobOut(BaseModel):
    id: str
    object: Literal["job"] = "job"
    name: str | None
    status: JobStatus
    actions: list[JobAction] = Field(
        description="The actions the job's status allows now, in the order a user interface shows "
        "them; any other is answered 409 (cancel while cancelling and pause while pausing or "
        "paused are accepted as no-ops but not listed)"
    )
    terminal: bool = Field(
        description="The run has ended (succeeded, failed or cancelled): no worker owns the job and "
        "it changes no more on its own. A resume (when `actions` has it) starts a new attempt"
    )
    spec: dict[str, Any] | None = Field(
        description="The resolved JobSpec: every default filled in. Always set on a job; in a list "
        "of jobs only with `expand=spec` (else null)"
    )
    priority: int
    max_retries: int
    timeout_seconds: int | None
    metadata: dict[str, Any]
    webhook_url: str | None
    attempt: int = Field(description="Runs started so far; pauses and handbacks start one too")
    failed_attempts: int = Field(description="Infrastructure failures charged against max_retries")
    progress: Progress
    queue_position: int | None = Field(description="1 = next to be claimed; null unless queued")
    latest_checkpoint: CheckpointRef | None
    best_checkpoint: CheckpointRef | None
    fine_tuned_model: str | None = Field(
        description="Once the job succeeded (and a checkpoint of it is left): the `model` name "
        "that `POST /v1/chat/completions` and `/v1/completions` answer with its final weights "
        "(`ft:<base>[:<name>]:<job id>`, as `GET /v1/models` lists it). Any complete checkpoint "
        "is callable as `<job id>:ckpt-<step>`, whatever the status"
    )
    resume_from: str | None = Field(description="Checkpoint directory the next run resumes from")
    engine: EngineRef | None = Field(
        default=None, description="Set while and after a cluster engine (Ray, Slurm) runs the job"
    )
    error: JobError | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobList(ListEnvelope[JobOut]):
    pass


class JobEventOut(BaseModel):
    id: int
    object: Literal["job.event"] = "job.event"
    created_at: datetime
    level: str = Field(description="info, warn or error")
    type: str = Field(description=f"One of: {', '.join(EVENT_TYPES)}")
    message: str
    data: dict[str, Any] | None


class JobEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobEventOut]
    first_id: int | None
    last_id: int | None
    has_more: bool


class MetricPoint(BaseModel):
    step: int
    value: float


class JobMetrics(BaseModel):
    object: Literal["job.metrics"] = "job.metrics"
    job_id: str
    series: dict[str, list[MetricPoint]]


class LogFile(BaseModel):
    name: str
    lines: list[str]
    truncated: bool = Field(description="True when older lines were left out")
    end: int = Field(
        description="Byte offset just past the lines returned: pass it back as `offset` (with "
        "`file`) to read only what is written after them"
    )


class JobLogs(BaseModel):
    object: Literal["job.logs"] = "job.logs"
    job_id: str
    files: list[LogFile]


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
