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

The runner also has each event told as a line of its log (`ProgressWriter(echo=True)`,
`describe`): the events are the service's record, but a user following a job's log (`jobs logs
--follow`, a Slurm output file, `torchrun` by hand) expects to see it train there too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PROGRESS_FILE = "progress.jsonl"
EventKind = Literal["started", "step", "eval", "sample", "checkpoint", "done", "stopped", "error", "message"]
# A sample's prompt and completion are cut to this many characters in the log's line (the event
# keeps them whole).
SAMPLE_CHARS = 200

log = logging.getLogger("twinkle_core.progress")


class ProgressWriter:
    """Appends events; a no-op on ranks other than 0 so callers need no rank checks. With `echo`,
    each event is also logged as a line a person reads (`describe`)."""

    def __init__(self, job_dir: str | Path, enabled: bool = True, echo: bool = False) -> None:
        self.path = Path(job_dir) / PROGRESS_FILE
        self.enabled = enabled
        self.echo = echo
        self._fh = open(self.path, "a", encoding="utf-8") if enabled else None  # noqa: SIM115

    def emit(self, event: EventKind, **fields: Any) -> None:
        if self._fh is None:
            return
        record = {"event": event, "time": time.time(), **fields}
        self._fh.write(json.dumps(record, default=_jsonable) + "\n")
        # flush, not fsync: the supervisor reads through the page cache; a crashed runner still
        # leaves every flushed line in the file.
        self._fh.flush()
        if self.echo:
            for line in describe(record):
                log.info("%s", line)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def describe(record: dict[str, Any]) -> list[str]:
    """An event as the lines a person reads in the run's log, e.g. `step 50/200: loss=2.1034
    lr=1.00e-05 grad_norm=0.412 epoch=0.25 tokens/s=1834`; none for a kind it does not know."""
    event = record.get("event")
    step = record.get("step")
    if event == "started":
        start = f"from step {record.get('start_step')}"
        if record.get("resumed_from"):
            start += f" (resuming from {record['resumed_from']})"
        steps, world = record.get("total_steps"), record.get("world_size")
        return [f"training started: {steps} steps, world size {world}, {start}"]
    if event == "step":
        figures = [
            f"loss={_figure(record.get('loss'), '.4f')}",
            f"lr={_figure(record.get('lr'), '.2e')}",
            f"grad_norm={_figure(record.get('grad_norm'), '.3f')}",
            f"epoch={_figure(record.get('epoch'), '.2f')}",
            f"tokens/s={_figure(record.get('tokens_per_second'), '.0f')}",
        ]
        return [f"step {step}/{record.get('total_steps')}: {' '.join(figures)}"]
    if event == "eval":
        return [f"step {step}: eval_loss={_figure(record.get('eval_loss'), '.4f')}"]
    if event == "sample":
        samples = record.get("samples") or []
        told = [f"{_quoted(one.get('prompt'))} -> {_quoted(one.get('completion'))}" for one in samples]
        return [f"step {step}: sample {i}/{len(told)}: {line}" for i, line in enumerate(told, start=1)]
    if event == "checkpoint":
        best = " (best so far)" if record.get("is_best") else ""
        return [f"step {step}: checkpoint saved in {record.get('path')}{best}"]
    if event == "done":
        return [f"training finished at step {step}: final checkpoint {record.get('final_checkpoint')}"]
    if event == "stopped":
        reason, checkpoint = record.get("reason"), record.get("checkpoint")
        return [f"stopped at step {step} on a {reason} request: checkpoint {checkpoint}"]
    if event == "error":
        return [f"error ({record.get('kind')}): {record.get('message')}"]
    if event == "message":
        return [str(record.get("message", ""))]
    return []


def _figure(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _quoted(text: Any) -> str:
    """On one line (json's escapes), cut to SAMPLE_CHARS."""
    text = str(text if text is not None else "")
    cut = text[:SAMPLE_CHARS] + ("..." if len(text) > SAMPLE_CHARS else "")
    return json.dumps(cut, ensure_ascii=False)


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
