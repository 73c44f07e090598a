"""Checkpoints as the worker keeps them: measure and prune them (save_total_limit) in SQL and on
disk or object storage.

The layout itself (`<job_dir>/checkpoints/step-N`, the `COMPLETE` marker written last, the latest
complete one) is twinkle_core.checkpoint's, the runner's own code: the worker never reads it
another way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import Checkpoint
from jobcore.storage import S3Store, is_remote
from jobcore.storage import local_copy as local_copy  # where the supervisor and exports take it
from twinkle_core.checkpoint import CHECKPOINTS_DIR, retained


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
        copy = job_dir / CHECKPOINTS_DIR / location.rstrip("/").rsplit("/", 1)[-1]
        shutil.rmtree(copy, ignore_errors=True)
