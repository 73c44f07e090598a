"""The runner's events told as lines of its log, beside progress.jsonl."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from twinkle_core.progress import SAMPLE_CHARS, ProgressReader, ProgressWriter, describe


def test_each_event_kind_reads_as_a_line() -> None:
    assert describe({"event": "started", "total_steps": 200, "world_size": 2, "start_step": 0}) == [
        "training started: 200 steps, world size 2, from step 0"
    ]
    started = {"event": "started", "total_steps": 200, "world_size": 1, "start_step": 50}
    resumed = describe({**started, "resumed_from": "/j/step-50"})
    assert resumed == ["training started: 200 steps, world size 1, from step 50 (resuming from /j/step-50)"]
    step = {
        "event": "step", "step": 50, "total_steps": 200, "epoch": 0.25, "loss": 2.10344, "lr": 1e-5,
        "grad_norm": 0.41234, "tokens_per_second": 1834.4, "samples_per_second": 3.0,
    }  # fmt: skip
    assert describe(step) == ["step 50/200: loss=2.1034 lr=1.00e-05 grad_norm=0.412 epoch=0.25 tokens/s=1834"]
    assert describe({"event": "eval", "step": 50, "eval_loss": 1.5}) == ["step 50: eval_loss=1.5000"]
    assert describe({"event": "checkpoint", "step": 50, "path": "/j/step-50", "is_best": True}) == [
        "step 50: checkpoint saved in /j/step-50 (best so far)"
    ]
    assert describe({"event": "done", "step": 200, "final_checkpoint": "/j/step-200"}) == [
        "training finished at step 200: final checkpoint /j/step-200"
    ]
    assert describe({"event": "stopped", "step": 7, "reason": "pause", "checkpoint": "/j/step-7"}) == [
        "stopped at step 7 on a pause request: checkpoint /j/step-7"
    ]
    assert describe({"event": "error", "kind": "user", "message": "ValueError: bad"}) == [
        "error (user): ValueError: bad"
    ]
    assert describe({"event": "unknown-kind"}) == []


def test_a_missing_or_odd_figure_does_not_break_the_line() -> None:
    line = describe({"event": "step", "step": 1, "total_steps": 2, "loss": None, "grad_norm": "nan"})
    assert line == ["step 1/2: loss=n/a lr=n/a grad_norm=n/a epoch=n/a tokens/s=n/a"]


def test_samples_are_one_line_each_and_cut() -> None:
    long = "x" * (SAMPLE_CHARS + 50)
    lines = describe(
        {
            "event": "sample",
            "step": 100,
            "samples": [
                {"prompt": "Hi", "completion": "line one\nline two"},
                {"prompt": long, "completion": ""},
            ],
        }
    )
    assert lines[0] == 'step 100: sample 1/2: "Hi" -> "line one\\nline two"'
    assert lines[1] == f'step 100: sample 2/2: "{"x" * SAMPLE_CHARS}..." -> ""'
    assert all("\n" not in line for line in lines)


def test_the_writer_logs_the_lines_only_when_asked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="twinkle_core.progress")
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    quiet = ProgressWriter(tmp_path / "a")
    quiet.emit("eval", step=3, eval_loss=0.5)
    quiet.close()
    assert caplog.records == []

    told = ProgressWriter(tmp_path / "b", echo=True)
    told.emit("eval", step=3, eval_loss=0.5)
    told.close()
    assert [r.getMessage() for r in caplog.records] == ["step 3: eval_loss=0.5000"]
    # The file, which the supervisor reads, is the same either way.
    events = ProgressReader(tmp_path / "b" / "progress.jsonl").read_new()
    assert [(e["event"], e["eval_loss"]) for e in events] == [("eval", 0.5)]
    assert json.loads((tmp_path / "a" / "progress.jsonl").read_text())["eval_loss"] == 0.5

    other_rank = ProgressWriter(tmp_path / "c", enabled=False, echo=True)
    other_rank.emit("eval", step=3, eval_loss=0.5)
    assert len(caplog.records) == 1  # ranks other than 0 neither write nor tell
