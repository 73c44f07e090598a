"""Typed reads of a job's stored spec (the resolved JobSpec JSON in `jobs.spec`).

The stored spec was validated and resolved at submit. Reading a section through its own pydantic
model gives typed values, and the current default for a field that an older row predates, in
this one place instead of `.get(key, default)` copies in every reader. A section is read on its
own, so a cross-section rule added later never makes an old row unreadable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle_core.spec import JobSpec, ResourcesSection, TrainingSection

StoredSpec = Mapping[str, Any] | None


def resources_of(spec: StoredSpec) -> ResourcesSection:
    """`resources`: nnodes, nproc_per_node, launcher (torchrun for rows from before the field)."""
    return ResourcesSection.model_validate((spec or {}).get("resources") or {})


def training_of(spec: StoredSpec) -> TrainingSection:
    """`training`: steps, batch sizes, checkpoint cadence and retention (`save_total_limit`)."""
    return TrainingSection.model_validate((spec or {}).get("training") or {})


def job_spec(spec: StoredSpec) -> JobSpec:
    """The whole JobSpec (every rule checked again; for a reader that needs several sections)."""
    return JobSpec.model_validate(dict(spec or {}))
