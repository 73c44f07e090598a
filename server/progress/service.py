"""Reading a job's progress: events, metric series, log tails.

The event and metric pages are what the dashboard polls most: they are read as Core rows on the
event loop (`server.common.reads`) and presented as plain data in their documented shapes
(`JobEventList`, `JobMetrics`), with no ORM entities or response models built per point.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.auth.principal import Principal
from server.errors import NotFound
from server.jobs import repository
from server.jobs.repository import Db
from server.jobs.schemas import JobEventOut, LogFile

MAX_LOG_LINES = 5000
# Reading backwards in blocks keeps a tail of a multi-GB log cheap.
TAIL_BLOCK = 64 * 1024
# What one read from an offset takes at most: a follower catches up over several reads.
APPEND_BLOCK = 1024 * 1024


class OffsetPastEnd(ValueError):
    """An `offset` beyond the end of the file: not one this API returned for it."""

    def __init__(self, name: str, offset: int, size: int) -> None:
        super().__init__(f"offset {offset} is past the end of {name} ({size} bytes)")


def present_event(event: Mapping[Any, Any]) -> dict[str, Any]:
    """A job event row as `JobEventOut` serializes it."""
    return {
        "id": event["id"],
        "object": "job.event",
        "created_at": event["created_at"],
        "level": event["level"],
        "type": event["type"],
        "message": event["message"],
        "data": event["data"],
    }


def list_events(
    db: Db,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    descending: bool,
    types: list[str],
    levels: list[str],
) -> tuple[list[JobEventOut], bool]:
    """A page of the job's events as models, for callers that present them their own way."""
    rows = repository.list_events(
        db, job_id, after=after, limit=limit, descending=descending, types=types, levels=levels
    )
    return [JobEventOut.model_validate(present_event(e)) for e in rows[:limit]], len(rows) > limit


def _job_of_project(db: Db, principal: Principal, job_id: str) -> None:
    if not repository.job_exists(db, principal.project_id, job_id):
        raise NotFound(f"no job '{job_id}' in this project", param="job_id")


def read_events(
    db: Db,
    principal: Principal,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    descending: bool,
    types: list[str],
    levels: list[str],
) -> dict[str, Any]:
    """A page of the job's events as `JobEventList` serializes it: two statements."""
    _job_of_project(db, principal, job_id)
    rows = repository.list_events(
        db, job_id, after=after, limit=limit, descending=descending, types=types, levels=levels
    )
    data = [present_event(e) for e in rows[:limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


def downsample(points: Sequence[tuple[int, float]], max_points: int | None) -> list[dict[str, Any]]:
    """At most `max_points` (step, value) points: consecutive buckets of steps averaged, each at
    its last step. Averaging (rather than picking every k-th point) keeps the level of a noisy
    loss curve. The metrics page does this in the database
    (`server.jobs.repository.downsampled_metric_points`); this is its definition, held to it by
    the tests."""
    if max_points is None or len(points) <= max_points:
        return [{"step": step, "value": value} for step, value in points]
    out: list[dict[str, Any]] = []
    for bucket in range(max_points):
        start = bucket * len(points) // max_points
        end = (bucket + 1) * len(points) // max_points
        chunk = points[start:end]
        if chunk:
            out.append({"step": chunk[-1][0], "value": sum(value for _, value in chunk) / len(chunk)})
    return out


def read_metrics(
    db: Db, principal: Principal, job_id: str, names: list[str], max_points: int | None
) -> dict[str, Any]:
    """The job's metric series as `JobMetrics` serializes it: two statements."""
    _job_of_project(db, principal, job_id)
    if max_points is None:
        points = repository.metric_points(db, job_id, names)
    else:  # downsampled in the database: a long series costs the points returned, not all of them
        points = repository.downsampled_metric_points(db, job_id, names, max_points)
    series: dict[str, list[dict[str, Any]]] = {}
    for name, step, value in points:
        series.setdefault(name, []).append({"step": step, "value": value})
    return {"object": "job.metrics", "job_id": job_id, "series": series}


def tail_lines(path: Path, count: int) -> tuple[list[str], bool, int]:
    """The last `count` lines of a file, whether older lines exist, and the file's size as read
    (where the next read from an offset starts)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        position = size = fh.tell()
        data = b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(TAIL_BLOCK, position)
            position -= step
            fh.seek(position)
            data = fh.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    truncated = position > 0 or len(lines) > count
    return lines[-count:] if count else [], truncated, size


def lines_from(path: Path, name: str, offset: int, count: int) -> tuple[list[str], int]:
    """Up to `count` lines written at or after byte `offset`, and the offset just past them. A
    last line still being written comes as it is (its rest comes as a line of its own later)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if offset > size:
            raise OffsetPastEnd(name, offset, size)
        fh.seek(offset)
        data = fh.read(APPEND_BLOCK)
    if len(data) == APPEND_BLOCK and b"\n" in data:
        data = data[: data.rfind(b"\n") + 1]  # more follows: never cut a line (or a character) short
    pieces = data.split(b"\n")
    lines: list[str] = []
    consumed = 0
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        if (last and not piece) or len(lines) == count:
            break
        lines.append(piece.decode("utf-8", errors="replace").removesuffix("\r"))
        consumed += len(piece) + (0 if last else 1)
    return lines, offset + consumed


@dataclass(frozen=True)
class LogSelection:
    """Which log files of an attempt to return. `node` is a node rank; `rank` a *global* rank
    (node rank x nproc_per_node + local rank), so neither is ambiguous on a multi-node job."""

    attempt: int | None = None
    node: int | None = None
    rank: int | None = None
    nnodes: int = 1
    nproc_per_node: int = 1
    file: str | None = None  # one file by the name a listing gave it (of any attempt)


def read_logs(job_dir: Path, selection: LogSelection, lines: int, offset: int | None = None) -> list[LogFile]:
    """Tails of `<job_dir>/logs/attempt-<k>.log` (all ranks, teed) and of torchrun's per-rank logs
    (`logs/attempt-<k>-ranks/[node-<i>/]<run>/attempt_<r>/<local_rank>/stdout.log`), for one
    attempt: the latest unless `selection.attempt` is given. Nodes other than 0 of a multi-node job
    log under `node-<i>/` (their torchrun output in `node-<i>/torchrun.log`). With an `offset`
    (and `selection.file`), the lines written from that byte on instead of the tail."""
    logs_dir = job_dir / "logs"
    if not logs_dir.is_dir():
        return []
    found: list[tuple[int, str, Path]] = []
    for path in logs_dir.rglob("*.log"):
        if not path.is_file() or path.is_symlink():
            continue
        relative = path.relative_to(logs_dir).as_posix()
        found.append((_attempt_of(relative), relative, path))
    if not found:
        return []
    if selection.file is not None:  # matched against the names found: never joined into a path
        selected = [(rel, path) for _, rel, path in found if rel == selection.file]
    else:
        wanted = selection.attempt if selection.attempt is not None else max(a for a, _, _ in found)
        selected = sorted((rel, path) for a, rel, path in found if a == wanted and _selected(rel, selection))
    out = []
    for relative, path in selected:
        if offset is None:
            tail, truncated, end = tail_lines(path, lines)
            out.append(LogFile(name=relative, lines=tail, truncated=truncated, end=end))
        else:
            appended, end = lines_from(path, relative, offset, lines)
            out.append(LogFile(name=relative, lines=appended, truncated=False, end=end))
    return out


def _selected(relative: str, selection: LogSelection) -> bool:
    node, local_rank = _owner_of(relative, selection.nnodes)
    if selection.node is not None and node != selection.node:
        return False
    if selection.rank is None:
        return True
    return local_rank is not None and node * selection.nproc_per_node + local_rank == selection.rank


def _owner_of(relative: str, nnodes: int) -> tuple[int, int | None]:
    """(node rank, local rank or None for a log of all ranks) of a file under logs/."""
    parts = relative.split("/")
    node = 0
    if nnodes > 1 and len(parts) > 2 and parts[1].startswith("node-") and parts[1][5:].isdigit():
        node = int(parts[1][5:])
    local_rank = int(parts[-2]) if len(parts) > 2 and parts[-2].isdigit() else None
    return node, local_rank


def _attempt_of(relative: str) -> int:
    """`attempt-3.log` or `attempt-3-ranks/...` -> 3; other names count as attempt 0."""
    head = relative.split("/")[0].removeprefix("attempt-").removesuffix(".log").removesuffix("-ranks")
    return int(head) if head.isdigit() else 0
