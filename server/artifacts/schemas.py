"""Bodies of the artifacts API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from twinkle_core.trackers import TrackerName


class ArtifactOut(BaseModel):
    name: TrackerName = Field(description="The tracker that wrote it: tensorboard, mlflow or wandb")
    object: Literal["job.artifact"] = "job.artifact"
    path: str = Field(description="Where it lies in the job directory (a directory or one file)")
    files: int = Field(description="Regular files it holds")
    size_bytes: int
    modified_at: datetime = Field(description="The newest file's modification time")
    download_url: str = Field(description="GET it for a gzip-compressed tar archive of it")


class ArtifactList(BaseModel):
    object: Literal["list"] = "list"
    job_id: str
    data: list[ArtifactOut]
