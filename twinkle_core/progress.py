"""The progress contract between a training run and whoever supervises it.

Rank 0 appends one JSON object per line to `<job_dir>/progress.jsonl`. Every object has `event`
and `time`; the kinds are:

- `started`:    total_steps, world_size, resumed_from (checkpoint path or null), start_step
- `step`:       step, total_steps, epoch, loss, lr, grad_norm, tokens_per_second, samples_per_second
- `eval`:       step, eval_loss
- `sample`:     step, samples: [{prompt, completion}] (greedy generations every `training.sample_every`)
- `checkpoint`: step, path, metrics, is_best
- `done`:       step, final_checkpoint
- `stopped`:    step, reason ("pause" | "terminate"), checkpoint: the run stopped on request
- `error`:      kind ("user" | "infra"), message

The supervisor reads it with `ProgressReader`, which only ever returns whole lines, so a line
being written while it reads is picked up next time. Pure Python: the worker imports this
without torch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PROGRESS_FILE = "progress.jsonl"
EventKind = Literal["started", "step", "eval", "sample", "checkpoint", "done", "stopped", "error", "message"]


class ProgressWriter:
    """Appends events; a no-op on ranks other than 0 so callers need no rank checks."""

    def __init__(self, job_dir: str | Path, enabled: bool = True) -> None:
        self.path = Path(job_dir) / PROGRESS_FILE
        self.enabled = enabled
        self._fh = open(self.path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115

    def emit(self, event: EventKind, **fields: Any) -> None:
        if self._fh is None:
            return
        record = {"event": event, "time": time.time(), **fields}
        self._fh.write(json.dumps(record, default=_jsonable) + "\n")
        # flush, not fsync: the supervisor reads through the page cache; a crashed runner still
        # leaves every flushed line in the file.
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


@dataclass
class ProgressReader:
    """Reads complete lines appended since the last call, remembering a byte offset."""

    path: Path
    offset: int = 0
    _partial_warned: bool = field(default=False, repr=False)

    def read_new(self, max_events: int | None = None) -> list[dict[str, Any]]:
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return []
        if size <= self.offset:
            return []
        events: list[dict[str, Any]] = []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while max_events is None or len(events) < max_events:
                line = fh.readline()
                if not line.endswith(b"\n"):
                    break  # incomplete: the writer is mid-line; read it next time
                self.offset += len(line)
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn line from a killed writer is skipped, never fatal
                if isinstance(record, dict) and "event" in record:
                    events.append(record)
        return events
