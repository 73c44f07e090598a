"""The CLI's text views of jobs: `jobs list` as a table; `jobs get` as a few labelled lines, the
fields a person looks for first (what it trains, how far it got, where its weights are, what to
call them, why it failed, what can be done with it next); and what the model said in a `sample`
event, under the event's line in `jobs events` and `--follow`. `-o json` prints the whole objects
instead."""

from __future__ import annotations

from datetime import datetime
from typing import Any

_LABEL_WIDTH = 12
_SAMPLE_CHARS = 200  # of a prompt or a completion on one line; -o json has them whole


def _line(label: str, value: str) -> str:
    return f"{label:<{_LABEL_WIDTH}}{value}"


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _clock(value: str | None) -> str:
    moment = _when(value)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else "-"


def _model(spec: dict[str, Any]) -> str:
    model = spec.get("model") or {}
    adapter = spec.get("adapter")
    kind = f"LoRA r={adapter.get('r')}" if isinstance(adapter, dict) else "full fine-tune"
    return f"{model.get('model_id') or '(from config)'}  ({kind})"


def progress_text(p: dict[str, Any]) -> str:
    """A job's `progress` on one line: a bar once the total is known, step/total, loss, ETA (also
    the line `--wait` and `--follow` print, after the status)."""
    step, total = p.get("step") or 0, p.get("total_steps")
    pct = p.get("percent")
    bar = ""
    if pct is not None:
        filled = int(pct / 5)
        bar = "[" + "#" * filled + "." * (20 - filled) + f"] {pct:5.1f}% "
    loss = f" loss {p['loss']:.4f}" if p.get("loss") is not None else ""
    eta = f" eta {int(p['eta_seconds'])}s" if p.get("eta_seconds") is not None else ""
    return f"{bar}step {step}/{total or '?'}{loss}{eta}"


def _times(job: dict[str, Any]) -> str:
    text = f"created {_clock(job.get('created_at'))}"
    if job.get("started_at"):
        text += f", started {_clock(job['started_at'])}"
    started, finished = _when(job.get("started_at")), _when(job.get("finished_at"))
    if finished:
        text += f", finished {_clock(job['finished_at'])}"
        if started:
            text += f" ({(finished - started).total_seconds():.0f} s)"
    return text


def describe_job(job: dict[str, Any]) -> list[str]:
    """The lines of the view; a field the job does not have yet is left out, not shown empty."""
    lines = [f"{job['id']}  {job['status']}  {job.get('name') or ''}".rstrip()]
    if job.get("spec"):
        lines.append(_line("base model", _model(job["spec"])))
    lines.append(_line("progress", progress_text(job.get("progress") or {})))
    if job.get("queue_position"):
        lines.append(_line("queue", f"position {job['queue_position']}"))
    engine = job.get("engine")
    if engine:
        where = f"{engine['name']} {engine.get('job_id') or '-'} ({engine.get('state') or '-'})"
        lines.append(_line("engine", where))
    checkpoint = job.get("latest_checkpoint")
    if checkpoint:
        lines.append(_line("checkpoint", f"step {checkpoint['step']}  {checkpoint['path']}"))
    best = job.get("best_checkpoint")
    if best and (not checkpoint or best["step"] != checkpoint["step"]):
        lines.append(_line("best", f"step {best['step']}  {best['path']}"))
    if job.get("fine_tuned_model"):
        lines.append(_line("model", f"{job['fine_tuned_model']}  (twinkle-jobs chat {job['id']})"))
    error = job.get("error")
    if error:
        lines.append(_line("error", f"{error.get('kind', 'infra')}: {error.get('message', '')}"))
    lines.append(_line("times", _times(job)))
    lines.append(_line("actions", ", ".join(job.get("actions") or []) or "none"))
    return lines


def job_table(jobs: list[dict[str, Any]]) -> list[str]:
    """`jobs list`: a header and a row per job (id, status, step/total, last loss, created, name),
    the columns as wide as their widest cell."""
    rows = [("ID", "STATUS", "STEP", "LOSS", "CREATED", "NAME")]
    for job in jobs:
        p = job.get("progress") or {}
        step, total = p.get("step") or 0, p.get("total_steps")
        loss = p.get("loss")
        rows.append(
            (
                job["id"],
                job["status"],
                f"{step}/{total}" if total else str(step),
                "-" if loss is None else f"{loss:.4f}",
                _clock(job.get("created_at")),
                job.get("name") or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _one_line(text: str) -> str:
    flat = text.replace("\r", "").replace("\n", "\\n")
    return flat if len(flat) <= _SAMPLE_CHARS else flat[: _SAMPLE_CHARS - 1] + "…"


def sample_lines(event: dict[str, Any]) -> list[str]:
    """What the model answered each prompt in a `sample` event (`data.samples`), one indented line
    per prompt: `"prompt" -> completion`; nothing for any other event."""
    if event.get("type") != "sample":
        return []
    samples = (event.get("data") or {}).get("samples") or []
    return [
        f"    {_one_line(str(s.get('prompt', '')))!r} -> {_one_line(str(s.get('completion', '')))}"
        for s in samples
        if isinstance(s, dict)
    ]
