"""Bodies of the export API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from server.common.pagination import ListEnvelope

ExportKind = Literal["full", "merged", "adapter"]
ExportStatus = Literal["pending", "running", "succeeded", "failed"]


class ExportCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    merge: StrictBool | None = Field(
        default=None,
        description="LoRA jobs: true (the default) merges the adapter into its base model, false "
        "exports the adapter alone. Full fine-tunes export the full model; false is refused there",
    )


class ExportOut(BaseModel):
    id: str
    object: Literal["checkpoint.export"] = "checkpoint.export"
    job_id: str
    checkpoint_id: str
    step: int
    kind: ExportKind = Field(
        description="full: a full fine-tune's model; merged: LoRA merged into the base; adapter: LoRA alone"
    )
    merged: bool = Field(description="The adapter was merged into its base model (kind 'merged')")
    status: ExportStatus
    error: str | None = None
    size_bytes: int | None = Field(default=None, description="The exported folder's size, once succeeded")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ExportList(ListEnvelope[ExportOut]):
    pass
