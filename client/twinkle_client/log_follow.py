"""Following a job's log as it is written, for `Jobs.follow_logs` (and `jobs logs --follow`).

The server reads logs, it does not stream them: a follower asks for one file's lines from the
byte offset its previous answer ended at (`GET /v1/jobs/{id}/logs?file=...&offset=...`), once a
second while the job runs. The file is the attempt's own log, `attempt-<k>.log`, which carries
every rank's output; a retry or resume starts attempt k+1, whose log is followed from its first
line once the previous one has been read to its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

Json = Any
# read(name, offset, lines) answers as the logs endpoint does (offset None: the file's tail).
Reader = Callable[[str, int | None, int], Json]
PAGE_LINES = 5000  # the server's most lines per answer


def attempt_log(attempt: int) -> str:
    return f"attempt-{attempt}.log"


def follow_job_log(
    get_job: Callable[[], Json],
    read: Reader,
    *,
    tail: int,
    poll: float,
    deadline: float | None,
    on_timeout: Callable[[], Exception],
) -> Iterator[tuple[str, str]]:
    """(file name, line) pairs: the last `tail` lines of the current attempt's log, then every
    line written after them, until the job has ended and its last attempt's log is read out."""
    current: str | None = None
    offset = 0
    while True:
        job = get_job()  # read before the log: once the job has ended, one more read gets it all
        newest = attempt_log(job["attempt"]) if job["attempt"] else None
        if current is None and newest is not None:
            current = newest
            files = read(current, None, tail)["files"] if tail else []
            if files:
                offset = files[0]["end"]
                yield from ((current, line) for line in files[0]["lines"])
        if current is not None:
            offset = yield from _read_out(read, current, offset)
            if newest is not None and newest != current:
                current, offset = newest, 0  # a new attempt: its log from the start
                continue
        if job["terminal"]:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise on_timeout()
        time.sleep(poll)


def _read_out(read: Reader, name: str, offset: int) -> Generator[tuple[str, str], None, int]:
    """Every line of `name` from `offset` to its current end; returns the offset after them."""
    while True:
        files = read(name, offset, PAGE_LINES)["files"]
        if not files:  # not written yet
            return offset
        yield from ((name, line) for line in files[0]["lines"])
        if files[0]["end"] == offset:
            return offset
        offset = files[0]["end"]
