"""Bodies of the file API.

`/v1/files` serves our own clients and the official `openai` client alike, so a file is shaped as
OpenAI's `FileObject` (`created_at` in Unix seconds, `status`) with our extra fields beside it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from server.common.pagination import ListEnvelope


class FileOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: str
    format: str = Field(description="jsonl, json, csv or parquet")
    bytes: int
    rows: int = Field(description="Records found by validation")
    sha256: str
    created_at: int = Field(description="Unix time in seconds, as OpenAI's FileObject has it")
    status: Literal["processed"] = Field(
        default="processed", description="Always processed: a file is validated before it is stored"
    )
    status_details: None = None
    expires_at: None = Field(default=None, description="Files do not expire")


class FileList(ListEnvelope[FileOut]):
    pass
