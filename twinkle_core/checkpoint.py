"""Checkpoint directories: atomic completion, discovery, retention, and their HF view.

A checkpoint is written into a temporary sibling directory (`.tmp-<name>`), its files are
fsynced, the completion marker `COMPLETE` is written last, and the directory is renamed to its
final name. A directory without the marker is never used: `latest_complete_checkpoint` skips it,
and `TransformersModel.resume_from_checkpoint` refuses it. Pure Python (no torch), so the worker
can import it cheaply; only `hf_model_dir` imports torch, and only to consolidate.

Two layouts hold the weights: plain Hugging Face files at the top level (the full model or a
LoRA adapter), or, for FSDP2 checkpoints, each rank's shard in the DCP directory `dcp/` (with the
optimizer). `hf_model_dir` gives readers the first kind for both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

COMPLETE_MARKER = "COMPLETE"
TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINTS_DIR = "checkpoints"
BEST_FILE = "best.json"
SHARDED_STATE_DIR = "dcp"  # DCP checkpoint of the model ("model") and optimizer ("optimizer")
CONSOLIDATED_DIR = "hf"  # the HF files consolidated from SHARDED_STATE_DIR, on first use
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
# What a consolidated directory does not copy from the checkpoint: the training state.
_TRAINING_STATE_FILES = frozenset({COMPLETE_MARKER, TRAINER_STATE_FILE, BEST_FILE})
TRAINER_STATE_FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
T = TypeVar("T")


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


def hf_model_dir(checkpoint_dir: str | Path) -> Path:
    """A directory of plain Hugging Face files for the complete checkpoint `checkpoint_dir`:
    what `AutoModelForCausalLM.from_pretrained` (full weights) or `PeftModel.from_pretrained`
    (a LoRA adapter) loads, with the checkpoint's config and tokenizer.

    The one way for readers outside the training loop (inference, export, `model_id=<checkpoint>`)
    to get at a checkpoint's weights, so that they need not know its layout. A checkpoint with
    HF weights at its top level is its own answer. A sharded one (`dcp/`) is consolidated on first
    use into `<checkpoint>/hf`: built under a unique temporary name and renamed into place, so a
    reader never sees a partial directory, and two processes consolidating at once both succeed
    (the second rename fails on the first one's directory, and its own copy is dropped).
    """
    path = Path(checkpoint_dir)
    if not is_complete(path):
        raise ValueError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    if has_hf_weights(path):
        return path
    consolidated = path / CONSOLIDATED_DIR
    if consolidated.is_dir():
        return consolidated
    if not (path / SHARDED_STATE_DIR).is_dir():
        raise ValueError(f"{path} holds no model weights (neither HF files nor {SHARDED_STATE_DIR}/)")
    temp = path / f".tmp-{CONSOLIDATED_DIR}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        temp.mkdir()
        # torch only here: the worker and the server import this module without it.
        from twinkle_core.consolidate import write_consolidated_weights

        write_consolidated_weights(path / SHARDED_STATE_DIR, temp, config_dir=path)
        for item in path.iterdir():
            if (
                item.is_file()
                and item.name not in _TRAINING_STATE_FILES
                and item.suffix not in (".pt", ".pth")
            ):
                shutil.copy2(item, temp / item.name)
        fsync_tree(temp)
        try:
            os.rename(temp, consolidated)
        except OSError:
            if not consolidated.is_dir():
                raise
            # Another process consolidated it first: its directory is as good as ours.
        else:
            _fsync_dir(path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return consolidated


def has_hf_weights(path: str | Path) -> bool:
    """The checkpoint (or model directory) holds plain HF weights at its top level."""
    return any((Path(path) / name).is_file() for name in HF_WEIGHT_FILES)


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    state_file = Path(path) / TRAINER_STATE_FILE
    if not state_file.is_file():
        raise ValueError(f"{path} is not a training checkpoint: {TRAINER_STATE_FILE} is missing")
    state: dict[str, Any] = json.loads(state_file.read_text())
    return state


def step_dir(checkpoint_root: str | Path, step: int) -> Path:
    """Where the checkpoint of optimizer step `step` lives: `<checkpoint_root>/step-<step>`."""
    return Path(checkpoint_root) / f"step-{step}"


def step_of(path: str | Path | None) -> int | None:
    """N of a `step-N` checkpoint directory (None for another name, or no path)."""
    if path is None:
        return None
    match = _STEP_DIR.match(Path(path).name)
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


def retained(oldest_first: Sequence[T], best: T | None, keep: int) -> set[T]:
    """The retention rule of `save_total_limit`, shared by the runner (directories) and the
    worker (SQL rows), so the two never disagree on what survives.

    The best checkpoint counts towards `keep` and the newest fill the other places; the newest
    is always kept (a resume needs it), so keep=1 with an older best keeps two, and a best that
    is the newest takes that one place alone.
    """
    if not oldest_first:
        return set()
    has_best = best is not None and best in oldest_first
    others = [item for item in oldest_first if not (has_best and item == best)]
    slots = keep - (1 if has_best else 0)
    kept = set(others[-slots:]) if slots > 0 else set()
    if has_best:
        assert best is not None
        kept.add(best)
    kept.add(oldest_first[-1])
    return kept


def prune_checkpoints(checkpoint_root: str | Path, keep: int | None) -> list[Path]:
    """Delete the complete checkpoints `retained` does not keep; returns the deleted."""
    if keep is None:
        return []
    root = Path(checkpoint_root)
    best = read_best(root)
    names = [p.name for p in complete_step_checkpoints(root)]
    kept = retained(names, Path(best.path).name if best else None, keep)
    doomed = [root / name for name in names if name not in kept]
    for path in doomed:
        # Remove the marker first so a half-deleted directory is never taken for a checkpoint.
        (path / COMPLETE_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    return doomed
