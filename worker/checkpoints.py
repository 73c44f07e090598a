"""Checkpoints on disk: find the latest complete one, measure and prune them (save_total_limit).

A checkpoint directory `<job_dir>/checkpoints/step-N` counts only once its `COMPLETE` marker
exists (the runner writes it last), so a run killed while saving never resumes from half a
checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint
from jobcore.storage import S3Store, is_remote
from twinkle_core.checkpoint import retained

COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def save_total_limit_of(spec: dict[str, Any] | None) -> int | None:
    """The job's `training.save_total_limit` (the runner's default, 3, when unset)."""
    training = (spec or {}).get("training") or {}
    limit = training.get("save_total_limit", 3)
    return None if limit is None else int(limit)


def checkpoints_dir(job_dir: Path) -> Path:
    return job_dir / "checkpoints"


def complete_checkpoints(job_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    root = checkpoints_dir(job_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE_MARKER).exists():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_complete_checkpoint(job_dir: Path) -> Path | None:
    done = complete_checkpoints(job_dir)
    return done[-1][1] if done else None


def step_of(path: str | Path | None) -> int | None:
    if path is None:
        return None
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue  # removed while we walked
    return total


def enforce_save_total_limit(session: Session, job_id: str, limit: int | None) -> list[Path]:
    """`prune_checkpoints` for checkpoints on the file system: the directories to remove."""
    return [Path(loc) for loc in prune_checkpoints(session, job_id, limit) if not is_remote(loc)]


def prune_checkpoints(session: Session, job_id: str, limit: int | None) -> list[str]:
    """Mark deleted in SQL the checkpoints that `save_total_limit` (`limit`) drops.

    Returns the locations to remove (directories, or `s3://` checkpoints); the caller removes them
    after committing, so a failed transaction never leaves rows pointing at deleted files.
    The rule is the runner's (`twinkle_core.checkpoint.retained`), which prunes the same
    directories on disk: another rule here would list checkpoints whose files are gone.
    """
    if limit is None:
        return []
    rows = session.scalars(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id, Checkpoint.deleted.is_(False))
        .order_by(Checkpoint.step)
    ).all()
    best = next((row.id for row in reversed(rows) if row.is_best), None)
    keep = retained([row.id for row in rows], best, limit)
    doomed = []
    for row in rows:
        if row.id not in keep:
            row.deleted = True
            doomed.append(row.path)
    return doomed


def remove_dirs(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def remove_stored_checkpoints(locations: list[str], job_dir: Path, store: S3Store | None) -> None:
    """Remove pruned checkpoints of object storage: the objects and the job dir's local copy."""
    for location in locations:
        if store is not None:
            store.delete(location)
        local_copy = checkpoints_dir(job_dir) / location.rstrip("/").rsplit("/", 1)[-1]
        shutil.rmtree(local_copy, ignore_errors=True)
