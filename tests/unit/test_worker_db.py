"""Worker logic against a real (SQLite) database: claims, ingestion, retention, reconciler, webhooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from jobcore.db.migrate import upgrade
from jobcore.db.models import (
    Checkpoint,
    Job,
    JobEvent,
    JobMetric,
    Project,
    WebhookDelivery,
    WorkerNode,
    utcnow,
)
from jobcore.db.session import session_scope
from jobcore.settings import Settings
from worker import reconciler, retention, webhooks
from worker.checkpoints import enforce_save_total_limit
from worker.claim import claim_next_job
from worker.ingest import ingest_events
from worker.recovery import finish
from worker.registry import process_started_at

SPEC: dict[str, Any] = {"model": {"config": {}}, "data": {"train_file": "/dev/null"}}


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    s = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.ensure_dirs()
    upgrade(s.resolved_database_url)
    return s


@pytest.fixture()
def project(settings: Settings) -> str:
    with session_scope(settings.resolved_database_url) as session:
        p = Project(name="p", webhook_secret="s3cret")
        session.add(p)
        session.flush()
        return p.id


def add_job(settings: Settings, project: str, **fields: Any) -> str:
    with session_scope(settings.resolved_database_url) as session:
        job = Job(project_id=project, spec=fields.pop("spec", SPEC), **fields)
        session.add(job)
        session.flush()
        return job.id


def get_job(settings: Settings, job_id: str) -> Job:
    with session_scope(settings.resolved_database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


def test_claim_takes_the_highest_priority_that_fits_once(settings: Settings, project: str) -> None:
    low = add_job(settings, project, priority=0)
    big = add_job(settings, project, priority=9, spec={**SPEC, "resources": {"nproc_per_node": 4}})
    high = add_job(settings, project, priority=5)
    url = settings.resolved_database_url
    claimed = []
    for _ in range(3):
        with session_scope(url) as session:
            job = claim_next_job(session, "w1", fits=lambda n: n <= 2)
            claimed.append(job.id if job else None)
    assert claimed == [high, low, None]  # the 4-GPU job does not fit; nothing left twice
    job = get_job(settings, high)
    assert (job.status, job.attempt, job.worker_id) == ("starting", 1, "w1")
    assert get_job(settings, big).status == "queued"


def test_claim_respects_the_project_running_limit(settings: Settings, project: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        session.get_one(Project, project).max_running_jobs = 1
    add_job(settings, project)
    add_job(settings, project)
    with session_scope(settings.resolved_database_url) as session:
        assert claim_next_job(session, "w1", fits=lambda n: True) is not None
    with session_scope(settings.resolved_database_url) as session:
        assert claim_next_job(session, "w1", fits=lambda n: True) is None


def test_ingest_writes_metrics_events_checkpoints_and_enforces_the_limit(
    settings: Settings, project: str, tmp_path: Path
) -> None:
    job_id = add_job(settings, project)
    events: list[dict[str, Any]] = [{"event": "started", "total_steps": 3, "world_size": 2}]
    for step in (1, 2, 3):
        events.append({"event": "step", "step": step, "total_steps": 3, "loss": 1.0 / step, "lr": 0.1})
        ckpt = tmp_path / f"step-{step}"
        ckpt.mkdir()
        (ckpt / "w.bin").write_bytes(b"x" * 100)
        events.append({"event": "checkpoint", "step": step, "path": str(ckpt), "is_best": step == 1})
    events.append({"event": "eval", "step": 3, "eval_loss": 0.7})
    with session_scope(settings.resolved_database_url) as session:
        seen, values = ingest_events(session, job_id, events, save_total_limit=1)
    assert seen.started and seen.last_checkpoint == str(tmp_path / "step-3")
    assert values["step"] == 3 and values["total_steps"] == 3 and values["loss"] == pytest.approx(1 / 3)
    # limit 1: the newest stays, the best (step 1) stays, step 2 goes
    assert seen.dirs_to_remove == [tmp_path / "step-2"]
    with session_scope(settings.resolved_database_url) as session:
        rows = {c.step: c for c in session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id))}
        assert {s: r.deleted for s, r in rows.items()} == {1: False, 2: True, 3: False}
        assert rows[3].size_bytes == 100
        names = session.scalars(select(JobMetric.name).where(JobMetric.job_id == job_id)).all()
        assert names.count("loss") == 3 and names.count("eval_loss") == 1
        kinds = session.scalars(select(JobEvent.type).where(JobEvent.job_id == job_id)).all()
        assert kinds.count("checkpoint") == 3 and kinds.count("metrics") == 4


def test_metric_points_carry_the_runners_time_so_a_batch_still_paces_the_eta(
    settings: Settings, project: str
) -> None:
    """Ingestion stores a batch of steps at once; the ETA (server.jobs.present) is paced from the
    points' stamps, which must be when the runner logged each step, not when the batch landed."""
    from server.jobs.present import _eta_seconds
    from server.jobs.repository import recent_metric_points

    job_id = add_job(settings, project)
    t0 = utcnow().timestamp() - 60
    events: list[dict[str, Any]] = [{"event": "started", "total_steps": 40, "world_size": 1, "time": t0}]
    for step in range(1, 11):  # 2 s a step, logged 60 s ago, ingested now in one batch
        events.append({"event": "step", "step": step, "total_steps": 40, "loss": 1.0, "time": t0 + 2 * step})
    events.append({"event": "eval", "step": 10, "eval_loss": 0.5})  # no time: stamped now
    with session_scope(settings.resolved_database_url) as session:
        ingest_events(session, job_id, events, save_total_limit=None)
    with session_scope(settings.resolved_database_url) as session:
        points = recent_metric_points(session, [job_id], "loss", 5)[job_id]
        assert [step for step, _ in points] == [10, 9, 8, 7, 6]
        stamps = [at.replace(tzinfo=at.tzinfo or UTC).timestamp() for _, at in points]
        assert stamps == pytest.approx([t0 + 2 * step for step in (10, 9, 8, 7, 6)], abs=1e-3)
        row = {"total_steps": 40, "step": 10}
        assert _eta_seconds(row, points) == pytest.approx(60.0)  # 30 steps left at 2 s a step
        eval_at = session.scalars(select(JobMetric.created_at).where(JobMetric.name == "eval_loss")).one()
        assert eval_at.replace(tzinfo=eval_at.tzinfo or UTC) > utcnow() - timedelta(seconds=30)


def test_the_eta_is_paced_by_the_steps_not_by_a_pause_among_them() -> None:
    from server.jobs.present import _eta_seconds

    t0 = utcnow()
    # Steps 11..20 at 2 s a step, with a 10-minute pause (and a resume) between 15 and 16.
    stamps = {step: t0 + timedelta(seconds=2 * step + (600 if step > 15 else 0)) for step in range(11, 21)}
    points = [(step, stamps[step]) for step in range(20, 10, -1)]  # newest first
    assert _eta_seconds({"total_steps": 50, "step": 20}, points) == pytest.approx(60.0)
    assert _eta_seconds({"total_steps": 50, "step": 20}, points[:1]) is None


def test_a_retry_from_the_start_replaces_the_failed_attempts_points(settings: Settings, project: str) -> None:
    job_id = add_job(settings, project)
    first = [{"event": "started", "total_steps": 5, "start_step": 0}]
    first += [{"event": "step", "step": step, "loss": 9.0} for step in (1, 2, 3)]  # then it died
    retry = [{"event": "started", "total_steps": 5, "start_step": 0}]  # no checkpoint: from 0
    retry += [{"event": "step", "step": step, "loss": 1.0} for step in (1, 2)]
    with session_scope(settings.resolved_database_url) as session:
        ingest_events(session, job_id, first, save_total_limit=None)
    with session_scope(settings.resolved_database_url) as session:
        ingest_events(session, job_id, retry, save_total_limit=None)
    with session_scope(settings.resolved_database_url) as session:
        points = session.execute(
            select(JobMetric.step, JobMetric.value).where(
                JobMetric.job_id == job_id, JobMetric.name == "loss"
            )
        ).all()
    assert sorted(points) == [(1, 1.0), (2, 1.0)]  # each step once, the retry's


def test_a_sample_record_becomes_one_event_and_is_ingested_once(
    settings: Settings, project: str, tmp_path: Path
) -> None:
    from twinkle_core.progress import ProgressReader

    job_id = add_job(settings, project)
    samples = [{"prompt": "Say hi", "completion": " hi"}, {"prompt": "2+2=", "completion": "4"}]
    progress = tmp_path / "progress.jsonl"
    _write_progress(
        tmp_path,
        {"event": "step", "step": 2, "total_steps": 4, "loss": 1.0},
        {"event": "sample", "time": 1.0, "step": 2, "samples": samples},
    )
    reader = ProgressReader(progress)
    url = settings.resolved_database_url
    with session_scope(url) as session:  # the batch and its cursor commit together, as the supervisor does
        seen, _ = ingest_events(session, job_id, reader.read_new(), save_total_limit=None)
        session.get_one(Job, job_id).progress_cursor = reader.offset
    assert seen.count == 2
    # A new reader from the committed cursor (a restarted worker) sees only what came after it.
    _write_progress(tmp_path, {"event": "sample", "step": 4, "samples": "not a list"})
    reader = ProgressReader(progress, offset=get_job(settings, job_id).progress_cursor or 0)
    with session_scope(url) as session:
        ingest_events(session, job_id, reader.read_new(), save_total_limit=None)
    with session_scope(url) as session:
        rows = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "sample").order_by(JobEvent.id)
        ).all()
        assert [(r.message, r.data) for r in rows] == [
            ("samples at step 2", {"step": 2, "samples": samples}),
            ("samples at step 4", {"step": 4, "samples": []}),
        ]
        assert session.scalars(select(JobMetric).where(JobMetric.job_id == job_id)).all()  # the step's


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("best_step", [None, 1, 3, 5])
def test_sql_retention_keeps_exactly_what_the_runner_keeps_on_disk(
    settings: Settings, project: str, tmp_path: Path, limit: int, best_step: int | None
) -> None:
    from twinkle_core import checkpoint as ckpt

    job_id = add_job(settings, project)
    root = tmp_path / "checkpoints"
    with session_scope(settings.resolved_database_url) as session:
        for step in range(1, 6):
            path = root / f"step-{step}"
            path.mkdir(parents=True)
            (path / ckpt.COMPLETE_MARKER).write_text("ok")
            session.add(Checkpoint(job_id=job_id, step=step, path=str(path), is_best=step == best_step))
    if best_step is not None:
        ckpt.write_best(root, ckpt.BestCheckpoint(str(root / f"step-{best_step}"), best_step, 0.5))
    on_disk_pruned = {p.name for p in ckpt.prune_checkpoints(root, limit)}
    with session_scope(settings.resolved_database_url) as session:
        in_sql_pruned = {Path(p).name for p in enforce_save_total_limit(session, job_id, limit)}
    assert in_sql_pruned == on_disk_pruned
    with session_scope(settings.resolved_database_url) as session:
        listed = session.scalars(
            select(Checkpoint.path).where(Checkpoint.job_id == job_id, Checkpoint.deleted.is_(False))
        ).all()
    assert all(Path(p).is_dir() for p in listed)  # nothing listed whose files are gone
    assert str(root / "step-5") in listed  # the newest, where a resume starts


def test_enforce_limit_none_keeps_everything(settings: Settings, project: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        assert enforce_save_total_limit(session, "job-x", None) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lost_job(
    settings: Settings, project: str, attempt: int, max_retries: int, failed_attempts: int = 0
) -> str:
    with session_scope(settings.resolved_database_url) as session:
        session.add(
            WorkerNode(
                id="w-dead",
                host=settings.worker_host,
                pid=_dead_pid(),
                started_at=process_started_at(),
                heartbeat_at=utcnow(),
            )
        )
    job_id = add_job(
        settings,
        project,
        status="running",
        worker_id="w-dead",
        attempt=attempt,
        max_retries=max_retries,
        failed_attempts=failed_attempts,
        heartbeat_at=utcnow(),
    )
    ckpt = settings.jobs_dir / job_id / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("ok")
    (ckpt.parent / "step-6").mkdir()  # incomplete: never resumed from
    return job_id


def test_reconciler_requeues_a_dead_workers_job_from_its_latest_checkpoint(
    settings: Settings, project: str
) -> None:
    job_id = _lost_job(settings, project, attempt=1, max_retries=2)
    assert reconciler.reconcile(settings, me="w-me") == [job_id]
    job = get_job(settings, job_id)
    assert job.status == "queued" and job.resume_from.endswith("step-4")
    assert reconciler.reconcile(settings, me="w-me") == []  # idempotent
    with session_scope(settings.resolved_database_url) as session:
        assert session.get_one(WorkerNode, "w-dead").status == "dead"
        messages = session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id)).all()
    assert any("resumes from checkpoint" in m and "step-4" in m for m in messages)


def test_reconciler_fails_a_job_out_of_retries(settings: Settings, project: str) -> None:
    job_id = _lost_job(settings, project, attempt=3, max_retries=2, failed_attempts=2)
    reconciler.reconcile(settings, me="w-me")
    job = get_job(settings, job_id)
    assert job.status == "failed" and job.error["kind"] == "infra"
    assert (job.failed_attempts, job.error["failed_attempts"]) == (3, 3)


def test_attempts_that_were_not_failures_do_not_spend_the_retry_budget(
    settings: Settings, project: str
) -> None:
    # Attempt 5 of a job paused and resumed four times: its first failure is retry 1 of 1.
    job_id = _lost_job(settings, project, attempt=5, max_retries=1)
    assert reconciler.reconcile(settings, me="w-me") == [job_id]
    job = get_job(settings, job_id)
    assert (job.status, job.failed_attempts) == ("queued", 1)
    with session_scope(settings.resolved_database_url) as session:
        messages = session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id)).all()
    assert any(m.startswith("retry 1/1: attempt 6 resumes from checkpoint") for m in messages), messages


def _write_progress(job_dir: Path, *events: dict[str, Any]) -> int:
    lines = "".join(json.dumps(event) + "\n" for event in events).encode()
    with open(job_dir / "progress.jsonl", "ab") as fh:
        fh.write(lines)
    return len(lines)


@pytest.mark.parametrize("final_complete", [True, False])
def test_a_lost_attempt_that_had_finished_succeeds_instead_of_retrying(
    settings: Settings, project: str, final_complete: bool
) -> None:
    # The worker died after its runner wrote `done` but before it recorded the end: the lines past
    # the cursor finish the run. Only a complete final checkpoint makes that a success.
    job_id = _lost_job(settings, project, attempt=1, max_retries=0)
    job_dir = settings.jobs_dir / job_id
    committed = _write_progress(job_dir, {"event": "started", "world_size": 2, "total_steps": 8})
    with session_scope(settings.resolved_database_url) as session:
        session.get_one(Job, job_id).progress_cursor = committed
    final = job_dir / "checkpoints" / "step-8"
    final.mkdir()
    if final_complete:
        (final / "COMPLETE").write_text("ok")
    _write_progress(
        job_dir,
        {"event": "step", "step": 8, "total_steps": 8, "loss": 1.25},
        {"event": "checkpoint", "step": 8, "path": str(final)},
        {"event": "done", "step": 8, "final_checkpoint": str(final)},
    )
    assert reconciler.reconcile(settings, me="w-me") == [job_id]
    job = get_job(settings, job_id)
    with session_scope(settings.resolved_database_url) as session:
        messages = session.scalars(
            select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()
        steps = session.scalars(select(Checkpoint.step).where(Checkpoint.job_id == job_id)).all()
    if not final_complete:  # max_retries=0: an ordinary lost attempt, out of retries
        assert (job.status, job.failed_attempts) == ("failed", 1)
        return
    assert (job.status, job.attempt, job.failed_attempts, job.error) == ("succeeded", 1, 0, None)
    assert (job.step, job.loss, job.progress_cursor) == (8, 1.25, (job_dir / "progress.jsonl").stat().st_size)
    assert steps == [8]
    assert messages.index("training finished at step 8") < len(messages) - 1
    assert messages[-1].startswith("succeeded: attempt 1 had finished (final checkpoint")
    assert reconciler.reconcile(settings, me="w-me") == []


def test_running_time_is_banked_when_an_attempt_ends(settings: Settings, project: str) -> None:
    from jobcore.jobs.lifecycle import transition

    job_id = add_job(settings, project, status="starting", attempt=1, run_seconds=100.0)
    with session_scope(settings.resolved_database_url) as session:
        job = session.get_one(Job, job_id)
        transition(session, job, "running")
        assert job.running_since is not None
        job.running_since -= timedelta(seconds=30)  # as if it had run half a minute
        session.flush()
        transition(session, job, "pausing")  # the runner is still alive: nothing banked yet
        assert job.run_seconds == 100.0
        transition(session, job, "paused")
        assert 130.0 <= job.run_seconds < 140.0 and job.running_since is None


def test_reconciler_leaves_a_live_local_worker_alone(settings: Settings, project: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        session.add(
            WorkerNode(
                id="w-live",
                host=settings.worker_host,
                pid=__import__("os").getpid(),
                started_at=process_started_at(),
                heartbeat_at=utcnow() - timedelta(hours=1),  # slow heartbeat, live process
            )
        )
    job_id = add_job(settings, project, status="running", worker_id="w-live", attempt=1)
    assert reconciler.reconcile(settings) == []
    assert get_job(settings, job_id).status == "running"


def test_sweep_removes_directories_of_deleted_jobs(settings: Settings, project: str) -> None:
    kept = add_job(settings, project)
    for job_id in (kept, "job-deleted"):
        (settings.jobs_dir / job_id / "checkpoints").mkdir(parents=True)
    assert retention.sweep_deleted_jobs(settings, min_age_seconds=0) == ["job-deleted"]
    assert (settings.jobs_dir / kept).exists() and not (settings.jobs_dir / "job-deleted").exists()


class _Receiver(BaseHTTPRequestHandler):
    replies: list[int] = []
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        self.send_response(self.replies.pop(0) if self.replies else 200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def receiver() -> Iterator[str]:
    _Receiver.replies, _Receiver.received = [500], []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def test_a_webhook_pass_builds_an_http_client_only_when_something_is_due(
    settings: Settings, project: str, receiver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[httpx.Client] = []
    real_client = httpx.Client

    def counted_client(*args: Any, **kwargs: Any) -> httpx.Client:
        built.append(real_client(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(webhooks.httpx, "Client", counted_client)
    url = settings.resolved_database_url
    assert webhooks.deliver_due(url) == 0 and built == []  # idle: no CA bundle loaded
    job_id = add_job(settings, project, status="running", worker_id="w", attempt=1, webhook_url=receiver)
    with session_scope(url) as session:
        finish(session, session.get_one(Job, job_id), settings.jobs_dir / job_id, "succeeded", message="")  # type: ignore[arg-type]
    assert webhooks.deliver_due(url) == 1 and len(built) == 1


def test_terminal_job_webhook_is_signed_retried_and_recorded(
    settings: Settings, project: str, receiver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhooks, "BACKOFF_BASE_SECONDS", 0.0)  # retry at once in the test
    job_id = add_job(settings, project, status="running", worker_id="w", attempt=1, webhook_url=receiver)
    url = settings.resolved_database_url
    with session_scope(url) as session:
        job = session.get_one(Job, job_id)
        finish(session, job, settings.jobs_dir / job_id, "succeeded", message="done")  # type: ignore[arg-type]
    assert webhooks.deliver_due(url) == 1  # HTTP 500: scheduled again
    assert webhooks.deliver_due(url) == 1  # HTTP 200
    assert webhooks.deliver_due(url) == 0
    with session_scope(url) as session:
        delivery = session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)).one()
        assert (delivery.status, delivery.attempts, delivery.response_status) == ("succeeded", 2, 200)
        assert delivery.event == "job.succeeded"
    headers, body = _Receiver.received[-1]
    assert webhooks.verify("s3cret", headers[webhooks.SIGNATURE_HEADER], body)
    assert not webhooks.verify("wrong", headers[webhooks.SIGNATURE_HEADER], body)
    assert json.loads(body)["data"]["id"] == job_id and json.loads(body)["data"]["status"] == "succeeded"


def test_sweep_creates_deliveries_for_jobs_finished_elsewhere(settings: Settings, project: str) -> None:
    job_id = add_job(
        settings, project, status="cancelled", webhook_url="http://127.0.0.1:9/x", finished_at=utcnow()
    )
    with session_scope(settings.resolved_database_url) as session:
        assert webhooks.sweep_missing_deliveries(session) == 1
    with session_scope(settings.resolved_database_url) as session:
        assert webhooks.sweep_missing_deliveries(session) == 0
        events = session.scalars(select(WebhookDelivery.event).where(WebhookDelivery.job_id == job_id)).all()
    assert events == ["job.cancelled"]


def _heartbeating(settings: Settings, worker_id: str, stop: threading.Event) -> threading.Thread:
    """A worker row kept alive as another machine's worker would keep it: its heartbeat moves on."""

    def beat() -> None:
        while not stop.wait(0.05):
            with session_scope(settings.resolved_database_url) as session:
                session.get_one(WorkerNode, worker_id).heartbeat_at = utcnow()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return thread


def _worker_row(settings: Settings, worker_id: str, pid: int, host: str | None = None) -> None:
    with session_scope(settings.resolved_database_url) as session:
        session.add(
            WorkerNode(
                id=worker_id,
                host=host or settings.worker_host,
                pid=pid,
                started_at=process_started_at(pid),
                heartbeat_at=utcnow(),
            )
        )


def test_a_worker_refuses_a_machine_name_that_a_live_worker_elsewhere_uses(settings: Settings) -> None:
    from worker.agent import WorkerAgent, WorkerNameInUse

    _worker_row(settings, "w-elsewhere", os.getpid())
    with session_scope(settings.resolved_database_url) as session:  # its PID is no process here
        session.get_one(WorkerNode, "w-elsewhere").pid = _dead_pid()
    stop = threading.Event()
    beating = _heartbeating(settings, "w-elsewhere", stop)
    agent = WorkerAgent(settings.model_copy(update={"heartbeat_seconds": 0.2}))
    try:
        with pytest.raises(WorkerNameInUse, match=r"w-elsewhere.*TWINKLE_WORKER_HOST"):
            agent.start()
    finally:
        stop.set()
        beating.join()
    with session_scope(settings.resolved_database_url) as session:
        assert session.get(WorkerNode, agent.worker_id) is None  # it never registered
        assert session.get_one(WorkerNode, "w-elsewhere").status == "online"  # nor took it for dead


def test_a_dead_predecessor_a_live_local_worker_or_another_name_do_not_stop_a_start(
    settings: Settings,
) -> None:
    from worker.registry import worker_of_this_name_elsewhere

    _worker_row(settings, "w-dead", os.getpid())
    with session_scope(settings.resolved_database_url) as session:
        session.get_one(WorkerNode, "w-dead").pid = _dead_pid()  # its heartbeat stands still
    _worker_row(settings, "w-here", os.getpid())  # a live process of this machine
    _worker_row(settings, "w-long-gone", os.getpid())
    with session_scope(settings.resolved_database_url) as session:  # stale: not even waited for
        row = session.get_one(WorkerNode, "w-long-gone")
        row.pid, row.heartbeat_at = _dead_pid(), utcnow() - timedelta(hours=1)
    _worker_row(settings, "w-other-name", os.getpid(), host="another-machine")
    with session_scope(settings.resolved_database_url) as session:
        session.get_one(WorkerNode, "w-other-name").pid = _dead_pid()
    stop = threading.Event()
    beating = _heartbeating(settings, "w-other-name", stop)
    try:
        db = settings.resolved_database_url
        assert worker_of_this_name_elsewhere(db, settings.worker_host, 0.2, stale_after_seconds=30) is None
    finally:
        stop.set()
        beating.join()
