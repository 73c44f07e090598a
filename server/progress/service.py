"""Reading a job's progress: events, metric series, log tails."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from jobcore.db.models import JobEvent, JobMetric
from server.jobs import repository
from server.jobs.schemas import JobEventOut, LogFile, MetricPoint

MAX_LOG_LINES = 5000
# Reading backwards in blocks keeps a tail of a multi-GB log cheap.
TAIL_BLOCK = 64 * 1024


def present_event(event: JobEvent) -> JobEventOut:
    return JobEventOut(
        id=event.id,
        created_at=event.created_at,
        level=event.level,
        type=event.type,
        message=event.message,
        data=event.data,
    )


def list_events(
    session: Session,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    descending: bool,
    types: list[str],
    levels: list[str],
) -> tuple[list[JobEventOut], bool]:
    rows = repository.list_events(
        session, job_id, after=after, limit=limit, descending=descending, types=types, levels=levels
    )
    return [present_event(e) for e in rows[:limit]], len(rows) > limit


def downsample(points: list[JobMetric], max_points: int | None) -> list[MetricPoint]:
    """At most `max_points` points: consecutive buckets of steps averaged, each at its last step.

    Averaging (rather than picking every k-th point) keeps the level of a noisy loss curve.
    """
    if max_points is None or len(points) <= max_points:
        return [MetricPoint(step=p.step, value=p.value) for p in points]
    out: list[MetricPoint] = []
    for bucket in range(max_points):
        start = bucket * len(points) // max_points
        end = (bucket + 1) * len(points) // max_points
        chunk = points[start:end]
        if chunk:
            out.append(MetricPoint(step=chunk[-1].step, value=sum(p.value for p in chunk) / len(chunk)))
    return out


def metric_series(
    session: Session, job_id: str, names: list[str], max_points: int | None
) -> dict[str, list[MetricPoint]]:
    grouped: dict[str, list[JobMetric]] = {}
    for point in repository.metric_points(session, job_id, names):
        grouped.setdefault(point.name, []).append(point)
    return {name: downsample(points, max_points) for name, points in grouped.items()}


def tail_lines(path: Path, count: int) -> tuple[list[str], bool]:
    """The last `count` lines of a file and whether older lines exist."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        position = fh.tell()
        data = b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(TAIL_BLOCK, position)
            position -= step
            fh.seek(position)
            data = fh.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    truncated = position > 0 or len(lines) > count
    return lines[-count:] if count else [], truncated


@dataclass(frozen=True)
class LogSelection:
    """Which log files of an attempt to return. `node` is a node rank; `rank` a *global* rank
    (node rank x nproc_per_node + local rank), so neither is ambiguous on a multi-node job."""

    attempt: int | None = None
    node: int | None = None
    rank: int | None = None
    nnodes: int = 1
    nproc_per_node: int = 1


def read_logs(job_dir: Path, selection: LogSelection, lines: int) -> list[LogFile]:
    """Tails of `<job_dir>/logs/attempt-<k>.log` (all ranks, teed) and of torchrun's per-rank logs
    (`logs/attempt-<k>-ranks/[node-<i>/]<run>/attempt_<r>/<local_rank>/stdout.log`), for one
    attempt: the latest unless `selection.attempt` is given. Nodes other than 0 of a multi-node job
    log under `node-<i>/` (their torchrun output in `node-<i>/torchrun.log`)."""
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
    wanted = selection.attempt if selection.attempt is not None else max(a for a, _, _ in found)
    selected = sorted((rel, path) for a, rel, path in found if a == wanted and _selected(rel, selection))
    out = []
    for relative, path in selected:
        tail, truncated = tail_lines(path, lines)
        out.append(LogFile(name=relative, lines=tail, truncated=truncated))
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
