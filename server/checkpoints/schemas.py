"""Bodies of the checkpoint API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from server.common.pagination import ListEnvelope


class CheckpointOut(BaseModel):
    id: str
    object: Literal["checkpoint"] = "checkpoint"
    job_id: str
    step: int
    metrics: dict[str, Any]
    size_bytes: int
    is_best: bool
    created_at: datetime


class CheckpointList(ListEnvelope[CheckpointOut]):
    pass
