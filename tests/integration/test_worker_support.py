"""Helpers for the worker tests (no tests here): a database, a broker, jobs, worker processes.

Worker processes are real (`python -m worker.main`), configured through TWINKLE_* variables, so
the tests exercise exactly what runs in production, kill -9 included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from jobcore.db.migrate import upgrade
from jobcore.db.models import Job, JobEvent, Project
from jobcore.db.session import session_scope

REPO_ROOT = Path(__file__).resolve().parents[2]

# A stand-in for `twinkle_core.train` used where the subject is the worker, not training: it speaks
# the progress contract (started / step / checkpoint / stopped / done / error), honours SIGUSR1
# (checkpoint, "stopped" with reason "pause", exit 0) and takes its behaviour from
# `model.kwargs.fake` in the spec. Clearly a test fixture: it trains nothing.
FAKE_RUNNER = r"""
import json, os, signal, sys, time
from pathlib import Path

spec_path = Path(sys.argv[1])
resume = sys.argv[sys.argv.index("--resume-from") + 1] if "--resume-from" in sys.argv else None
spec = json.loads(spec_path.read_text())
job_dir = spec_path.parent
rank = int(os.environ.get("RANK", "0"))
fake = spec["model"].get("kwargs", {}).get("fake", {})
training = spec.get("training", {})
total = training.get("max_steps") or 4
save_every = training.get("save_every")
step_seconds = float(fake.get("step_seconds", 0.2))
pause_requested = False

def on_usr1(signum, frame):
    global pause_requested
    pause_requested = True

# ignore_pause: a run that ends before it sees the pause. SIG_IGN, not a handler that does
# nothing: a signal that meets the interpreter's exit would find the default action (death) again.
signal.signal(signal.SIGUSR1, signal.SIG_IGN if fake.get("ignore_pause") else on_usr1)

def emit(event, **fields):
    if rank != 0:
        return
    with open(job_dir / "progress.jsonl", "a") as fh:
        fh.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

def save(step):
    if rank != 0:
        return str(job_dir / "checkpoints" / f"step-{step}")
    final = job_dir / "checkpoints" / f"step-{step}"
    tmp = job_dir / "checkpoints" / f".tmp-step-{step}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    (tmp / "COMPLETE").write_text("ok\n")
    if final.exists():
        import shutil; shutil.rmtree(final)
    os.replace(tmp, final)
    emit("checkpoint", step=step, path=str(final), metrics={}, is_best=False)
    return str(final)

start = json.loads((Path(resume) / "state.json").read_text())["step"] if resume else 0
if fake.get("fail") == "user":
    emit("error", kind="user", message="data.train_file: line 3 is not valid JSON")
    print("ValueError: data.train_file: line 3 is not valid JSON", file=sys.stderr)
    sys.exit(2)
emit("message", message="devices", cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
emit("started", total_steps=total, world_size=int(os.environ.get("WORLD_SIZE", "1")),
     resumed_from=resume, start_step=start)
for step in range(start + 1, total + 1):
    time.sleep(step_seconds)
    dies = resume is None or not fake.get("once")  # once: only an attempt from scratch dies
    if fake.get("fail") == "infra" and step == int(fake.get("fail_at", 1)) and dies:
        os.kill(os.getpid(), signal.SIGKILL)
    emit("step", step=step, total_steps=total, epoch=step / total, loss=1.0 / step, lr=1e-3,
         grad_norm=0.5, tokens_per_second=100.0, samples_per_second=10.0)
    if save_every and step % save_every == 0:
        save(step)
    if pause_requested:
        path = save(step)
        emit("stopped", reason="pause", step=step, checkpoint=path)
        sys.exit(0)
emit("done", step=total, final_checkpoint=None)
"""


# The real runner (`twinkle_core.train`) with one test-only addition: a job whose directory holds
# `hold.json` ({"step": N}) stops after step N (its step event and checkpoint written) and waits
# there until a pause or terminate request arrives, or the process is killed. A tiny job's six
# steps take a fraction of a second, so "wait for step N, then act" would race the job's end; the
# hold makes the moment of the pause or the kill exact. Waiting changes no numerics, so the
# weights stay bit-for-bit those of an uninterrupted run.
HOLDING_RUNNER = r"""
import json, sys, time
from pathlib import Path

from twinkle_core import train

original_check_stop = train.JobRunner.check_stop

def check_stop(self):
    hold = self.job_dir / "hold.json"
    if hold.exists() and self.model.cur_step == json.loads(hold.read_text())["step"]:
        deadline = time.monotonic() + 600
        while not (self.stop.pause or self.stop.terminate) and time.monotonic() < deadline:
            time.sleep(0.05)
    return original_check_stop(self)

train.JobRunner.check_stop = check_stop
train.run()
"""


@dataclass
class WorkerEnv:
    """One isolated deployment: data dir, database, broker, and the worker processes started."""

    root: Path
    database_url: str
    broker_url: str
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    project_id: str = ""

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def env(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TWINKLE_DATA_DIR": str(self.data_dir),
                "TWINKLE_DATABASE_URL": self.database_url,
                "TWINKLE_BROKER_URL": self.broker_url,
                "TWINKLE_HEARTBEAT_SECONDS": "0.5",
                "TWINKLE_STALE_AFTER_SECONDS": "10",
                "TWINKLE_CANCEL_GRACE_SECONDS": "5",
                "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": str(REPO_ROOT),
            }
        )
        env.update(self.extra_env)
        env.update(overrides)
        return env

    def settings(self) -> Any:
        from jobcore.settings import Settings

        return Settings(data_dir=self.data_dir, database_url=self.database_url, broker_url=self.broker_url)

    def start_worker(self, concurrency: int = 1, beat: bool = False, **env: str) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        log = open(self.root / f"worker-{n}.log", "ab")  # noqa: SIM115 - owned by the process
        argv = [sys.executable, "-m", "worker.main", "--concurrency", str(concurrency)]
        if beat:
            argv.append("--beat")
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def stop_workers(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def worker_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-6000:] for p in sorted(self.root.glob("worker-*.log"))
        )

    def submit(self, spec: dict[str, Any], wake: bool = True, **fields: Any) -> str:
        """Insert a queued job the way the API does (row, commit, then the wake-up)."""
        with session_scope(self.database_url) as session:
            job = Job(project_id=self.project_id, spec=spec, **fields)
            session.add(job)
            session.flush()
            job_id = job.id
        if wake:
            self.wake(job_id)
        return job_id

    def wake(self, job_id: str) -> None:
        from jobcore.broker import send_wakeup

        send_wakeup(job_id, self.settings())

    def job_dir(self, job_id: str) -> Path:
        return self.data_dir / "jobs" / job_id

    def progress(self, job_id: str) -> list[dict[str, Any]]:
        """Every event the job's runner wrote to progress.jsonl, over all attempts."""
        path = self.job_dir(job_id) / "progress.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def job(self, job_id: str) -> Job:
        with session_scope(self.database_url) as session:
            job = session.get(Job, job_id)
            assert job is not None
            session.expunge(job)
            return job

    def events(self, job_id: str) -> list[JobEvent]:
        with session_scope(self.database_url) as session:
            rows = session.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            ).all()
            for row in rows:
                session.expunge(row)
            return list(rows)

    def set_status(self, job_id: str, target: str) -> None:
        """What the API's cancel / pause / resume do: a transition on the row."""
        from jobcore.jobs.lifecycle import transition

        with session_scope(self.database_url) as session:
            job = session.get(Job, job_id)
            assert job is not None
            transition(session, job, target)

    def wait_for(
        self, job_id: str, predicate: Callable[[Job], bool], timeout: float = 120.0, what: str = ""
    ) -> Job:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what or 'condition'} on {job_id}: status {job.status}, "
                    f"step {job.step}, error {job.error}\n{self.worker_logs()}"
                )
            time.sleep(0.2)

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 120.0) -> Job:
        return self.wait_for(job_id, lambda j: j.status in statuses, timeout, f"status in {statuses}")


def make_env(root: Path, database_url: str, broker_url: str, **extra_env: str) -> WorkerEnv:
    env = WorkerEnv(root=root, database_url=database_url, broker_url=broker_url, extra_env=extra_env)
    env.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(database_url)
    with session_scope(database_url) as session:
        project = Project(name=f"proj-{root.name}")
        session.add(project)
        session.flush()
        env.project_id = project.id
    return env


def fake_runner(root: Path) -> Path:
    path = root / "fake_runner.py"
    path.write_text(FAKE_RUNNER)
    return path


def holding_runner(root: Path) -> Path:
    path = root / "holding_runner.py"
    path.write_text(HOLDING_RUNNER)
    return path


def submit_held(env: WorkerEnv, spec: dict[str, Any], step: int, **fields: Any) -> str:
    """Submit a job for `holding_runner` that waits after `step` until paused, terminated or killed."""
    job_id = env.submit(spec, wake=False, **fields)
    env.job_dir(job_id).mkdir(parents=True, exist_ok=True)
    (env.job_dir(job_id) / "hold.json").write_text(json.dumps({"step": step}))
    env.wake(job_id)
    return job_id


def steps_per_attempt(progress: list[dict[str, Any]]) -> list[list[int]]:
    """The step numbers each attempt of the runner reported (a `started` line opens an attempt)."""
    attempts: list[list[int]] = []
    for record in progress:
        if record["event"] == "started":
            attempts.append([])
        elif record["event"] == "step" and attempts:
            attempts[-1].append(int(record["step"]))
    return attempts


def fake_spec(max_steps: int = 4, nproc: int = 1, save_every: int | None = 2, **fake: Any) -> dict[str, Any]:
    return {
        "model": {"config": {"vocab_size": 8}, "mixed_precision": "no", "kwargs": {"fake": fake}},
        "data": {"train_file": "/dev/null"},
        "training": {"max_steps": max_steps, "save_every": save_every, "batch_size": nproc},
        "resources": {"nproc_per_node": nproc},
    }


def real_spec(
    model_dir: Path, train_file: Path, max_steps: int = 4, nproc: int = 2, save_every: int | None = 1
) -> dict[str, Any]:
    """A tiny-model job for the real runner (gloo, no mixed precision)."""
    return {
        "model": {"model_id": str(model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(train_file), "max_length": 64},
        "training": {
            "max_steps": max_steps,
            "batch_size": 2 * nproc,
            "save_every": save_every,
            "save_total_limit": None,
            "seed": 7,
        },
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": nproc},
    }


def job_processes(env: WorkerEnv, job_id: str = "") -> list[psutil.Process]:
    """Every process on this machine running this deployment's jobs (or the one job given)."""
    from worker.process_tree import processes_referencing

    return [
        p
        for p in processes_referencing(str(env.data_dir / "jobs" / job_id), "spec.json")
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def kill_tree(pid: int) -> None:
    """kill -9 a process and all of its descendants at once (the whole worker, runner included)."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def sqlite_env(tmp_path: Path, **extra_env: str) -> Iterator[WorkerEnv]:
    env = make_env(
        tmp_path,
        f"sqlite:///{tmp_path / 'twinkle.db'}",
        f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        **extra_env,
    )
    try:
        yield env
    finally:
        env.stop_workers()


STACKS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres+redis", id="postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


def stack_env(request: pytest.FixtureRequest, tmp_path: Path, **extra_env: str) -> Iterator[WorkerEnv]:
    """A fixture body parametrised over `STACKS`: the embedded stack (SQLite + SQLite broker), or
    real PostgreSQL + Redis (skipped, with the reason, when their TWINKLE_TEST_* URLs are unset)."""
    if request.param == "sqlite":
        yield from sqlite_env(tmp_path, **extra_env)
        return
    env = make_env(
        tmp_path, request.getfixturevalue("postgres_url"), request.getfixturevalue("redis_url"), **extra_env
    )
    try:
        yield env
    finally:
        env.stop_workers()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
