"""What the chaos suite watches while faults are injected: the API as a user sees it, the process
trees of every job, and each job's progress.jsonl afterwards."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from faults import is_torchrun

# ------------------------------------------------------------------------------------- API prober


@dataclass(frozen=True)
class Failure:
    started: float
    ended: float
    call: str
    detail: str

    def during(self, windows: list[tuple[float, float]]) -> bool:
        return any(self.started <= end and self.ended >= begin for begin, end in windows)


@dataclass
class ApiProber:
    """A user of the API, twice a second: lists jobs, reads the latest one, and submits a new job
    whenever fewer than `queue_depth` wait, until the stream is closed (the "stream of short jobs"),
    at most `max_jobs` unless a fault injector is waiting for a run (`demand`).

    Every call that is not 2xx, or raises, is recorded with its start and end time; a call
    overlapping an API-restart window is excused by the test, nothing else is. Like a careful
    client, each submission carries an `Idempotency-Key` and a failed one is sent again with the
    same key before anything new: a server killed after its commit but before its answer must
    give back that job, not leave one nobody knows of.
    """

    url_of: Callable[[], str]
    token: str
    job_body: dict[str, Any]
    max_jobs: int
    queue_depth: int = 2
    submitted: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    calls: int = 0
    stream_open: threading.Event = field(default_factory=threading.Event)
    no_submit: threading.Event = field(default_factory=threading.Event)  # set around API restarts
    # Set while a fault injector waits for a run to strike: `max_jobs` is then lifted, so a round
    # that comes after the cap was reached still gets a fresh run (which worker claims a job is
    # not ours to choose, so the wait may need several).
    demand: threading.Event = field(default_factory=threading.Event)
    _pending_key: str | None = None  # a submission whose answer never came
    _submitting: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.stream_open.set()
        self._thread = threading.Thread(target=self._run, name="api-prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def close_stream(self, timeout: float = 30.0) -> None:
        """No new submissions; returns once none is in flight or waiting for its answer, so
        `submitted` is final (a POST past its check when the stream closes still lands)."""
        self.stream_open.clear()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._submitting:
                if self._pending_key is None:
                    return
            time.sleep(0.2)
        raise AssertionError(f"a submission still had no answer {timeout:.0f} s after the stream closed")

    def _call(self, client: httpx.Client, label: str, method: str, path: str, **kw: Any) -> Any:
        started = time.monotonic()
        self.calls += 1
        try:
            response = client.request(method, f"{self.url_of()}{path}", **kw)
        except httpx.HTTPError as exc:
            self.failures.append(Failure(started, time.monotonic(), label, repr(exc)))
            return None
        if not response.is_success:
            detail = f"{response.status_code} {response.text[:300]}"
            self.failures.append(Failure(started, time.monotonic(), label, detail))
            return None
        return response.json()

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(headers=headers, timeout=15) as client:
            while not self._stop.is_set():
                self._call(client, "GET /healthz", "GET", "/healthz")
                queued = self._call(
                    client, "GET /v1/jobs?status=queued", "GET", "/v1/jobs", params={"status": "queued"}
                )
                if self.submitted:
                    self._call(client, "GET /v1/jobs/{id}", "GET", f"/v1/jobs/{self.submitted[-1]}")
                if self._pending_key is not None and not self.no_submit.is_set():
                    self._submit(client, self._pending_key)
                elif queued is not None and self._should_submit(len(queued["data"])):
                    self._submit(client, uuid.uuid4().hex)
                self._stop.wait(0.5)

    def _submit(self, client: httpx.Client, key: str) -> None:
        with self._submitting:
            if key != self._pending_key and not self.stream_open.is_set():
                return  # closed between the check and here
            headers = {"Idempotency-Key": key}
            job = self._call(client, "POST /v1/jobs", "POST", "/v1/jobs", json=self.job_body, headers=headers)
            self._pending_key = key if job is None else None
            if job is not None and job["id"] not in self.submitted:
                self.submitted.append(job["id"])

    def _should_submit(self, waiting: int) -> bool:
        return (
            self.stream_open.is_set()
            and not self.no_submit.is_set()
            and waiting < self.queue_depth
            and (len(self.submitted) < self.max_jobs or self.demand.is_set())
        )


# ----------------------------------------------------------------------------- process sampler

_JOB_SPEC = re.compile(r"/jobs/([^/]+)/spec\.json$")


@dataclass
class Tree:
    """One attempt's process tree as seen by the sampler: keyed by its torchrun PID."""

    job_id: str
    torchrun_pid: int
    first_seen: float
    last_seen: float


@dataclass
class TreeSampler:
    """Samples every job's processes five times a second and records any moment at which one job
    had two live process trees (two torchruns, or ranks outliving theirs beside a new one)."""

    jobs_dir: Path
    trees: dict[int, Tree] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    samples: int = 0
    _owner: dict[tuple[int, float], int] = field(default_factory=dict)  # (pid, ctime) -> torchrun pid
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        per_job: dict[str, set[int]] = {}
        prefix = str(self.jobs_dir) + "/"
        for proc in psutil.process_iter(["cmdline", "status", "create_time"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = proc.info["cmdline"] or []
                job_id = _job_of(cmdline, prefix)
                if job_id is None:
                    continue
                owner = self._tree_of(proc, cmdline, proc.info["create_time"])
            except psutil.Error:
                continue
            per_job.setdefault(job_id, set()).add(owner)
            tree = self.trees.setdefault(owner, Tree(job_id, owner, now, now))
            tree.last_seen = now
        self.samples += 1
        for job_id, owners in per_job.items():
            if len(owners) > 1:
                self.overlaps.append(f"{job_id}: trees {sorted(owners)} alive at once")

    def _tree_of(self, proc: psutil.Process, cmdline: list[str], created: float) -> int:
        """The torchrun PID a process belongs to, fixed at first sight (a rank whose torchrun died
        keeps its tree, so an orphan rank beside a new attempt shows as a second tree)."""
        key = (proc.pid, created)
        if key not in self._owner:
            # The nearest torchrun above it, even when it looks like a torchrun itself: a rank
            # caught between torchrun's fork and its exec still carries torchrun's command line,
            # and fixing it as a tree of its own would count a phantom second tree all attempt.
            owner = proc.pid
            for parent in proc.parents():
                if is_torchrun(parent.cmdline()):
                    owner = parent.pid
                    break
            self._owner[key] = owner
        return self._owner[key]

    def trees_of(self, job_id: str) -> list[Tree]:
        return sorted((t for t in self.trees.values() if t.job_id == job_id), key=lambda t: t.first_seen)


def _job_of(cmdline: list[str], prefix: str) -> str | None:
    for part in cmdline:
        if part.startswith(prefix):
            match = _JOB_SPEC.search(part)
            if match:
                return match.group(1)
    return None


# --------------------------------------------------------------------------- progress.jsonl audit


@dataclass
class Segment:
    """The events of one attempt, from its `started` on."""

    start_step: int
    resumed_from: str | None
    steps: list[int] = field(default_factory=list)
    end: str | None = None  # done | error | stopped, or None if the attempt was killed


def attempt_segments(progress: Path) -> list[Segment]:
    """Split progress.jsonl into attempts and assert each one's events are contiguous.

    Two attempts writing at once would interleave their lines: a step out of sequence, a step
    after the attempt's end, or a resume point that is not the latest announced checkpoint.
    """
    segments: list[Segment] = []
    last_checkpoint = 0
    for number, line in enumerate(progress.read_text().splitlines(), start=1):
        event = json.loads(line)
        kind = event["event"]
        where = f"{progress}:{number}"
        if kind == "started":
            assert event["start_step"] == last_checkpoint, (
                f"{where}: attempt starts at step {event['start_step']}, "
                f"the latest checkpoint announced was step {last_checkpoint}"
            )
            segments.append(Segment(event["start_step"], event["resumed_from"]))
            continue
        assert segments, f"{where}: {kind} before any started"
        current = segments[-1]
        assert current.end is None, f"{where}: {kind} after the attempt ended with {current.end}"
        if kind == "step":
            expected = (current.steps[-1] if current.steps else current.start_step) + 1
            assert event["step"] == expected, f"{where}: step {event['step']}, expected {expected}"
            current.steps.append(event["step"])
        elif kind == "checkpoint":
            assert current.steps and event["step"] == current.steps[-1], f"{where}: checkpoint off-step"
            last_checkpoint = event["step"]
        elif kind in ("done", "error", "stopped"):
            current.end = kind
    return segments
