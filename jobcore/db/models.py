"""SQLAlchemy 2 models: the record of every project, token, file, job and what happened to it.

Relationships raise instead of loading lazily (`lazy="raise"`): a query that needs related rows
says so, and N+1 patterns fail in tests instead of slowing production.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_webhook_secret() -> str:
    """A project's webhook signing secret: shown once (creation, rotation), then only used to sign."""
    return "whsec_" + secrets.token_urlsafe(32)


def new_id(prefix: str) -> str:
    """Public ids carry their type (`job-…`, `file-…`) so a wrong id is obvious in logs."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware datetimes on every backend (SQLite drops tzinfo; we put UTC back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime stored; use utcnow()")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("proj"))
    name: Mapped[str] = mapped_column(String(128), unique=True)
    webhook_secret: Mapped[str] = mapped_column(String(128), default=new_webhook_secret)
    # Where a job submitted without its own `webhook_url` reports (copied onto the job at submit).
    webhook_url: Mapped[str | None] = mapped_column(Text, default=None)
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    # The Slurm account (sbatch --account) its launcher='slurm' jobs are charged to; None: the
    # worker's TWINKLE_SLURM_ACCOUNT, else the user's default account in Slurm.
    slurm_account: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token, stored as its SHA-256; the plain token is shown once at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("tok"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    scopes: Mapped[list[Any]] = mapped_column(default=lambda: ["read", "write"])
    rate_limit_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)

    project: Mapped[Project] = relationship(lazy="raise")


class File(Base):
    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("file"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32), default="fine-tune")
    format: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(Integer, default=0)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_path: Mapped[str] = mapped_column(Text)
    # A retried upload with the same Idempotency-Key answers with this row instead of a second file.
    idempotency_key: Mapped[str | None] = mapped_column(String(256), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_files_project_created", "project_id", "created_at", "id"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_files_idempotency"),
    )


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("job"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(256), default=None)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column()
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=3)
    timeout_seconds: Mapped[int | None] = mapped_column(Integer, default=None)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    webhook_url: Mapped[str | None] = mapped_column(Text, default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(256), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)

    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Infra failures charged against `max_retries`. Not `attempt`: a pause, a handback by a
    # stopping worker or a lost gang member also start a new attempt, and must not spend it.
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Seconds spent running, summed over finished attempts: `timeout_seconds` bounds the job,
    # not each attempt (a retried job would otherwise run up to max_retries+1 times as long).
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    worker_id: Mapped[str | None] = mapped_column(String(64), default=None)
    gpu_ids: Mapped[list[Any] | None] = mapped_column(default=None)
    pids: Mapped[list[Any] | None] = mapped_column(default=None)
    resume_from: Mapped[str | None] = mapped_column(Text, default=None)
    job_dir: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[dict[str, Any] | None] = mapped_column(default=None)

    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    epoch: Mapped[float | None] = mapped_column(Float, default=None)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    lr: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_per_second: Mapped[float | None] = mapped_column(Float, default=None)
    progress_cursor: Mapped[int] = mapped_column(BigInteger, default=0)
    # Bytes the job's directory (checkpoints, logs) takes on disk; refreshed by the worker.
    disk_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # The cluster engine the attempt was handed to ("ray", "slurm"; null when our own workers
    # run it), the job's id there and its last state there, as that engine spells them.
    engine: Mapped[str | None] = mapped_column(String(16), default=None)
    engine_job_id: Mapped[str | None] = mapped_column(String(128), default=None)
    engine_state: Mapped[str | None] = mapped_column(String(32), default=None)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    running_since: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        Index("ix_jobs_project_created", "project_id", "created_at", "id"),
        # `GET /v1/jobs?name=...`: without it, a full scan of the jobs table (docs/benchmarks.md).
        Index("ix_jobs_project_name", "project_id", "name", "created_at", "id"),
        Index("ix_jobs_queue", "status", "priority", "created_at"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_idempotency"),
    )


class JobEvent(Base):
    """One line of a job's history; the integer id is the cursor and the SSE event id."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(8), default="info")
    type: Mapped[str] = mapped_column(String(16), default="message")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)


class JobMetric(Base):
    """A scalar series point (loss, lr, eval_loss, …) per optimizer step, for charts."""

    __tablename__ = "job_metrics"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_job_metrics_job_name_step", "job_id", "name", "step"),)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("ckpt"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    is_best: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)


class Export(Base):
    """A checkpoint exported as a standalone Hugging Face model folder, made by a worker.

    One row per (checkpoint, kind): asking again answers with the same export (a failed one is
    retried). `kind` is `full` (a full fine-tune), `merged` (LoRA folded into its base) or
    `adapter` (the LoRA adapter alone)."""

    __tablename__ = "exports"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("export"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|running|succeeded|failed
    error: Mapped[str | None] = mapped_column(Text, default=None)
    path: Mapped[str | None] = mapped_column(Text, default=None)  # the folder, once succeeded
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    worker_id: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # Written by the exporting worker while it runs: a stale one means the worker was lost.
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        UniqueConstraint("checkpoint_id", "kind", name="uq_exports_checkpoint_kind"),
        Index("ix_exports_job_created", "job_id", "created_at", "id"),
        Index("ix_exports_status", "status"),
    )


class WorkerNode(Base):
    """A registered worker process: its host, GPUs and slots, kept alive by heartbeats."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list[Any]] = mapped_column(default=list)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), default="online")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class ServingHost(Base):
    """A running inference host (`twinkle-jobs serve`): where the API server relays generation
    requests to. Registered at start, heartbeated with what it holds in memory; a host whose
    heartbeat is older than `stale_after_seconds` is not live and gets no requests."""

    __tablename__ = "serving_hosts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("serve"))
    url: Mapped[str] = mapped_column(Text)  # what the API server connects to
    engine: Mapped[str] = mapped_column(String(32))  # transformers | vllm
    # [{"checkpoint": "<dir>", "model": "<name>", "bytes": N}], most recently used first.
    loaded: Mapped[list[Any]] = mapped_column(default=list)
    loaded_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)  # the bound of what it keeps loaded
    slots: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class GpuLease(Base):
    """A GPU of one machine held by a training job or a serving host (`jobcore.gpu_leases`).

    The primary key makes a GPU one holder's at a time across every process of the machine:
    workers insert a row for each GPU they give a job in the transaction that claims it, a serving
    host for each GPU it serves on. The owner refreshes `heartbeat_at`; a row older than
    `stale_after_seconds` (its owner died) no longer holds the GPU and is replaced by the next
    taker."""

    __tablename__ = "gpu_leases"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)  # TWINKLE_WORKER_HOST
    gpu_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)  # the worker or serving host id
    holder: Mapped[str] = mapped_column(String(64))  # the job id, or the serving host id
    kind: Mapped[str] = mapped_column(String(16))  # job | serving
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One attempt-tracked POST of a job's terminal state to its webhook_url."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("whd"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(32))  # job.succeeded | job.failed | job.cancelled
    job_attempt: Mapped[int] = mapped_column(Integer, default=0)  # a resumed job notifies again
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|succeeded|failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    response_status: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        UniqueConstraint("job_id", "event", "job_attempt", name="uq_webhook_deliveries_job_event"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )


class GangMember(Base):
    """One node of a multi-node job attempt: the worker on a distinct host that leased GPUs for it.

    Node 0 (the job's owner, `jobs.worker_id`) inserts its row when it claims the job and publishes
    the rendezvous address and port in it; other workers join by inserting the next node rank. The
    unique constraints make joining atomic: two workers racing for a rank, or two nodes on one
    host, end with one row and one integrity error. Rows are deleted when the attempt ends.
    """

    __tablename__ = "gang_members"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("node"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    # Rendezvous endpoint, set on node 0's row only: where the other nodes' torchrun connects.
    address: Mapped[str | None] = mapped_column(String(255), default=None)
    port: Mapped[int | None] = mapped_column(Integer, default=None)
    gpu_ids: Mapped[list[Any] | None] = mapped_column(default=None)
    status: Mapped[str] = mapped_column(String(16), default="joined")  # joined|running|exited|failed
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "node_rank", name="uq_gang_members_rank"),
        UniqueConstraint("job_id", "attempt", "host", name="uq_gang_members_host"),
        Index("ix_gang_members_worker", "worker_id"),
    )


def lock_jobs_for_events(session: Session, job_ids: list[str]) -> None:
    """Take the job rows before writing their events, so a job's event ids follow commit order
    and an `after=<id>` cursor never skips an event.

    An id is drawn from the sequence when the row is inserted but becomes visible at commit; two
    open transactions writing events for one job could commit out of id order, and a reader whose
    cursor had passed the later id would never see the earlier one. Holding the job's row (as an
    UPDATE does) from before the first event until the transaction ends makes the next writer draw
    its ids after this one committed. SQLite needs nothing: it has one writer at a time, from its
    first write to its commit. Rows added through the ORM get this from the flush hook below; a
    core `insert()` of events calls it itself.
    """
    if not job_ids or session.get_bind().dialect.name != "postgresql":
        return
    # FOR NO KEY UPDATE, in id order: what the job's own UPDATE takes, without blocking the
    # key-share locks that inserting rows which reference the job take.
    lock = (
        select(Job.id)
        .where(Job.id.in_(sorted(set(job_ids))))
        .order_by(Job.id)
        .with_for_update(key_share=True)
    )
    session.connection().execute(lock)


@event.listens_for(Session, "before_flush")
def _lock_jobs_of_new_events(session: Session, _context: Any, _instances: Any) -> None:
    job_ids = [obj.job_id for obj in session.new if isinstance(obj, JobEvent) and obj.job_id]
    lock_jobs_for_events(session, job_ids)
