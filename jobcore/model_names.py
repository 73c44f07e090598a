"""The public names of what can be served, in one place: the inference endpoints parse them and the
OpenAI compatibility layer hands them out as `fine_tuned_model` / `fine_tuned_model_checkpoint`.

- A succeeded job's model: `ft:<base>[:<suffix>]:<job id>`, shaped like OpenAI's
  `ft:gpt-4o-mini:org:suffix:id`. `<base>` is the last component of the job's `model_id` (a hub
  id's name or a local directory's name, never the server's path), `<suffix>` the job's name.
  The job id is the last component, so the name parses without a lookup; the whole string must
  still equal the job's own name, so a stale or edited name is refused rather than guessed.
- Any complete checkpoint of a job: `<job id>:ckpt-<step>`.

Colons separate the parts, so any other character outside `[A-Za-z0-9._-]` in a base or suffix
becomes `-`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

FINE_TUNED_PREFIX = "ft:"
CHECKPOINT_INFIX = ":ckpt-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STEP = re.compile(r"^[0-9]{1,9}$")
_JOB_ID = re.compile(r"^job-[A-Za-z0-9_-]{1,60}$")
MAX_PART = 64


def _part(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-")[:MAX_PART] or "model"


def base_name(model_id: str) -> str:
    """`/data/models/Qwen3-0.6B` -> `Qwen3-0.6B`, `org/tiny-llama` -> `tiny-llama`; a fine-tuned
    model trained on further keeps its base's name (`ft:tiny-llama:demo:job-1` -> `tiny-llama`)."""
    if model_id.startswith(FINE_TUNED_PREFIX) and model_id.count(":") >= 2:
        return _part(model_id.split(":")[1])
    return _part(PurePosixPath(model_id.rstrip("/")).name or model_id)


def fine_tuned_model_name(job_id: str, model_id: str, suffix: str | None) -> str:
    parts = [FINE_TUNED_PREFIX.rstrip(":"), base_name(model_id)]
    if suffix and _part(suffix) != "model":
        parts.append(_part(suffix))
    parts.append(job_id)
    return ":".join(parts)


def job_model_name(job_id: str, spec: Mapping[str, Any] | None, suffix: str | None) -> str:
    """`fine_tuned_model_name` of a job from its stored spec (its `model.model_id`)."""
    model_id = ((spec or {}).get("model") or {}).get("model_id")
    return fine_tuned_model_name(job_id, model_id if isinstance(model_id, str) else "", suffix)


def checkpoint_model_name(job_id: str, step: int) -> str:
    return f"{job_id}{CHECKPOINT_INFIX}{step}"


@dataclass(frozen=True)
class FineTunedName:
    """`ft:...:<job id>`: the final model of a succeeded job."""

    job_id: str


@dataclass(frozen=True)
class CheckpointName:
    """`<job id>:ckpt-<step>`: one checkpoint of a job."""

    job_id: str
    step: int


def parse(model: str) -> FineTunedName | CheckpointName | None:
    """What a `model` string names, from its spelling alone (None: neither shape)."""
    if model.startswith(FINE_TUNED_PREFIX):
        job_id = model.rsplit(":", 1)[-1]
        return FineTunedName(job_id) if _JOB_ID.match(job_id) else None
    job_id, infix, step = model.rpartition(CHECKPOINT_INFIX)
    if infix and _JOB_ID.match(job_id) and _STEP.match(step):
        return CheckpointName(job_id, int(step))
    return None
