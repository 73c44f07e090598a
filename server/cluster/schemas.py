"""Bodies of the cluster endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class WorkerOut(BaseModel):
    id: str
    object: Literal["worker"] = "worker"
    host: str
    status: str
    gpus: list[str | int]
    busy_gpus: list[int] = Field(description="GPUs of this worker that its running jobs hold")
    serving_gpus: list[int] = Field(
        default_factory=list,
        description="GPUs of this worker's machine held by a serving host (`twinkle-jobs serve`): "
        "not given to training while it runs",
    )
    slots: int
    running_jobs: int
    running_job_ids: list[str]
    started_at: datetime
    last_heartbeat_at: datetime


class WorkerList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WorkerOut]
    first_id: str | None
    last_id: str | None
    has_more: bool = False


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str]
