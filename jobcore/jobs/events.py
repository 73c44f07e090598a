"""The kinds of a job's events, as the worker writes them and the API lists and filters them."""

from __future__ import annotations

from typing import Literal, get_args

# message: a line of the job's story; metrics: a training or eval step's numbers; status: a
# transition (data: from, to); checkpoint: a complete checkpoint; sample: what the model generated
# for training.sample_prompts at a step (data: step, samples [{prompt, completion}]).
EventType = Literal["message", "metrics", "status", "checkpoint", "sample"]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)
EventLevel = Literal["info", "warn", "error"]
