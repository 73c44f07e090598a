"""Checkpoint directories: atomic completion, discovery and retention.

A checkpoint is written into a temporary sibling directory (`.tmp-<name>`), its files are
fsynced, the completion marker `COMPLETE` is written last, and the directory is renamed to its
final name. A directory without the marker is never used: `latest_complete_checkpoint` skips it,
and `TransformersModel.resume_from_checkpoint` refuses it. Pure Python (no torch), so the worker
can import it cheaply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINTS_DIR = "checkpoints"
BEST_FILE = "best.json"
TRAINER_STATE_FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    if path.name.startswith((".tmp-", ".old-")):
        return False
    return path.is_dir() and (path / COMPLETE_MARKER).is_file()


def temp_dir_for(final_dir: Path) -> Path:
    return final_dir.parent / f".tmp-{final_dir.name}"


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root` (a checkpoint must survive a power loss)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finalize(temp_dir: Path, final_dir: Path) -> Path:
    """Write the marker last, then rename the temporary directory into place (one process only)."""
    fsync_tree(temp_dir)
    marker = temp_dir / COMPLETE_MARKER
    marker.write_text("ok\n")
    with open(marker, "rb") as fh:
        os.fsync(fh.fileno())
    previous = final_dir.parent / f".old-{final_dir.name}"
    if final_dir.exists():
        # A checkpoint of the same name (e.g. "last-checkpoint") is replaced whole: move it aside
        # first so that the complete old one exists until the complete new one is in place.
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(final_dir, previous)
    os.replace(temp_dir, final_dir)
    _fsync_dir(final_dir.parent)
    shutil.rmtree(previous, ignore_errors=True)
    return final_dir


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    state_file = Path(path) / TRAINER_STATE_FILE
    if not state_file.is_file():
        raise ValueError(f"{path} is not a training checkpoint: {TRAINER_STATE_FILE} is missing")
    state: dict[str, Any] = json.loads(state_file.read_text())
    return state


def step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def complete_step_checkpoints(checkpoint_root: str | Path) -> list[Path]:
    """The complete `step-N` checkpoints under `checkpoint_root`, oldest first."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and is_complete(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_complete_checkpoint(job_dir: str | Path) -> Path | None:
    """The newest complete `<job_dir>/checkpoints/step-N`, or None (what the worker resumes from)."""
    found = complete_step_checkpoints(Path(job_dir) / CHECKPOINTS_DIR)
    return found[-1] if found else None


@dataclass
class BestCheckpoint:
    path: str
    step: int
    eval_loss: float


def read_best(checkpoint_root: str | Path) -> BestCheckpoint | None:
    best_file = Path(checkpoint_root) / BEST_FILE
    if not best_file.is_file():
        return None
    data = json.loads(best_file.read_text())
    return BestCheckpoint(path=data["path"], step=int(data["step"]), eval_loss=float(data["eval_loss"]))


def write_best(checkpoint_root: str | Path, best: BestCheckpoint) -> None:
    """Record the best checkpoint (lowest eval loss) atomically: a reader sees the old or the new."""
    root = Path(checkpoint_root)
    tmp = root / f".{BEST_FILE}.tmp"
    tmp.write_text(json.dumps({"path": best.path, "step": best.step, "eval_loss": best.eval_loss}))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, root / BEST_FILE)


def prune_checkpoints(checkpoint_root: str | Path, keep: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `keep`, never the best one; returns the deleted."""
    if keep is None:
        return []
    root = Path(checkpoint_root)
    best = read_best(root)
    best_name = Path(best.path).name if best else None
    found = complete_step_checkpoints(root)
    deletable = [p for p in found if p.name != best_name]
    # The best checkpoint counts towards `keep`, so the newest ones fill the remaining places.
    slots = keep - (1 if best_name and any(p.name == best_name for p in found) else 0)
    doomed = deletable[: max(len(deletable) - max(slots, 0), 0)]
    if slots <= 0:
        # keep=1 with a best that is not the newest: keep the best and the newest (resume needs it).
        doomed = deletable[:-1]
    for path in doomed:
        # Remove the marker first so a half-deleted directory is never taken for a checkpoint.
        (path / COMPLETE_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    return doomed
