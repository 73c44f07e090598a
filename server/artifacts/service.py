"""A job's tracker outputs: find them in the job directory, pack one into a tar.gz for download.

The names are fixed (`twinkle_core.trackers.JOB_DIR_OUTPUTS`), never a path from the request, and
the packing skips symbolic links and anything whose real path leaves the job directory, so a job
cannot make the server read another job's or the host's files. A live job's TensorBoard files
grow while it trains: each download packs what is there now, into a temporary file removed after
the response (the archives are small: event files and an SQLite database compress well).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from jobcore.settings import Settings
from server.errors import NotFound
from twinkle_core.trackers import JOB_DIR_OUTPUTS, TRACKERS, TrackerName


@dataclass(frozen=True)
class Artifact:
    name: TrackerName
    path: str
    files: int
    size_bytes: int
    modified_at: datetime


def _inside(root: Path, path: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(root)


def _files(root: Path, output: Path) -> Iterator[Path]:
    """The regular files of `output` (itself, or those under it), never through a link."""
    if output.is_symlink() or not _inside(root, output):
        return
    if output.is_file():
        yield output
        return
    for path in sorted(output.rglob("*")):
        if path.is_file() and not path.is_symlink() and _inside(root, path):
            yield path


def list_artifacts(job_dir: Path) -> list[Artifact]:
    root = Path(os.path.realpath(job_dir))
    found = []
    for name in TRACKERS:
        output = job_dir / JOB_DIR_OUTPUTS[name]
        files = list(_files(root, output))
        if not files:
            continue
        stats = [f.stat() for f in files]
        found.append(
            Artifact(
                name=cast(TrackerName, name),
                path=JOB_DIR_OUTPUTS[name],
                files=len(files),
                size_bytes=sum(s.st_size for s in stats),
                modified_at=datetime.fromtimestamp(max(s.st_mtime for s in stats), UTC),
            )
        )
    return found


def archive_name(job_id: str, name: str) -> str:
    return f"{job_id}-{name}.tar.gz"


def pack_artifact(settings: Settings, job_dir: Path, job_id: str, name: str) -> Path:
    """A temporary tar.gz of tracker `name`'s output; the caller deletes it once sent."""
    root = Path(os.path.realpath(job_dir))
    output = job_dir / JOB_DIR_OUTPUTS[name]
    files = list(_files(root, output))
    if not files:
        raise NotFound(f"job '{job_id}' has no {name} output (yet)", param="name")
    scratch = settings.archives_dir
    scratch.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{job_id}-{name}.", suffix=".tar.gz", dir=scratch)
    os.close(fd)
    top = archive_name(job_id, name).removesuffix(".tar.gz")
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for path in files:
                tar.add(path, arcname=f"{top}/{path.relative_to(job_dir).as_posix()}", recursive=False)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)
