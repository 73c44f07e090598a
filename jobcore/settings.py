"""Service settings, read from the environment with the prefix TWINKLE_.

With nothing set the service runs on embedded defaults: SQLite and a SQLite-backed Celery broker
inside the data dir, so one machine needs no database or broker server.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path.home() / ".twinkle-jobs"


# The embedded database and broker in the data dir (when no URL is configured).
EMBEDDED_DATABASE = "twinkle.db"
EMBEDDED_BROKER = "broker.db"


def redacted_url(url: str) -> str:
    """`url` for a log line or a message: a password in it (`user:password@`, or libpq's
    `password=` parameter) reads `***`. Rewritten in place, not re-assembled, so any other part
    (sqlite's four slashes) stays as written."""
    url = re.sub(r"^([A-Za-z][\w+.-]*://[^:/?#@]*):[^/?#@]*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


class _Environment(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TWINKLE_", extra="ignore")


class SharedSettings(_Environment):
    """Read by the server and the worker alike: where the record, the broker and the files are."""

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = Field(default=None, description="Default: SQLite in the data dir")
    broker_url: str | None = Field(default=None, description="Default: an embedded SQLite broker")
    artifact_url: str | None = Field(
        default=None, description="Where checkpoints are stored: unset = the data dir; s3://bucket/prefix"
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint (MinIO, Ceph, ...); default: AWS"
    )
    stale_after_seconds: float = Field(default=30.0, gt=0, description="Heartbeat age that marks a job lost")
    allowed_roots: str | None = Field(
        default=None,
        description="Colon-separated directories a spec may name; default: the data dir. The server "
        "checks a path at submit, a worker again at launch, a serving host a LoRA's base",
    )
    serving_secret: str | None = Field(
        default=None,
        description="Bearer secret between the API server and serving hosts; unset: one generated "
        "into the data dir (a local stack shares it)",
    )


class ServerSettings(_Environment):
    """Read by the API server: first-use credentials and what a request may send or name."""

    bootstrap_token: str | None = Field(default=None, description="Admin token registered at start")
    rate_limit_url: str | None = Field(
        default=None,
        description="Where per-token rate limits are counted: a redis:// URL shares the count between "
        "server processes; 'memory' counts in each process; unset: TWINKLE_BROKER_URL when that is "
        "Redis, else in each process",
    )
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    max_request_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest body of any request but an upload (JSON); larger ones get 413 unread",
    )


class WorkerSettings(_Environment):
    """Read by a worker: its host, its GPUs, how it runs and supervises the runner."""

    worker_host: str = Field(default_factory=socket.gethostname)
    worker_gpus: str | None = Field(
        default=None, description="Comma-separated GPU ids a worker may lease; default: the GPUs it sees"
    )
    worker_slots: int = Field(default=1, ge=1, description="Jobs a GPU-less worker runs at once")
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    hang_timeout_seconds: float = Field(default=1800.0, gt=0, description="No progress for this long = hung")
    cancel_grace_seconds: float = Field(default=10.0, gt=0)
    torchrun: str = Field(
        default="twinkle-torchrun",
        description="The torchrun executable (the default is torchrun, ending a stop by signal in one line)",
    )
    worker_address: str | None = Field(
        default=None,
        description="Address other hosts reach this worker's node-0 rendezvous at; default: the hostname",
    )
    gang_timeout_seconds: float = Field(
        default=300.0, gt=0, description="How long a multi-node job waits for all its nodes to join"
    )
    ray_address: str | None = Field(
        default=None,
        description="A Ray cluster's job API (the dashboard, http://head:8265): this worker then also "
        "runs resources.launcher='ray' jobs, as Ray jobs there; unset: it never claims them",
    )
    slurm: bool = Field(
        default=False,
        description="This worker also hands resources.launcher='slurm' jobs to Slurm (sbatch on this "
        "host); unset: it never claims them",
    )
    slurm_bin_dir: str | None = Field(
        default=None, description="Where sbatch/scontrol/scancel are; default: PATH"
    )
    slurm_partition: str | None = Field(
        default=None, description="Partition of jobs whose spec names none; default: the cluster's"
    )
    slurm_account: str | None = Field(
        default=None,
        description="--account of Slurm jobs whose project has no slurm_account of its own (the admin "
        "API's project setting); unset: Slurm's default account of the submitting user",
    )
    slurm_gpus: bool = Field(
        default=True, description="Ask Slurm for nproc_per_node GPUs per node; false on a CPU-only cluster"
    )
    slurm_cpus_per_rank: int = Field(default=1, ge=1, description="CPUs Slurm allocates per rank")


class ServingSettings(_Environment):
    """Read by a serving host (`twinkle-jobs serve`): where it listens, how much it keeps loaded."""

    serving_host: str = Field(default="127.0.0.1", description="The interface the host listens on")
    serving_port: int = Field(default=8001, ge=0, le=65535, description="0: any free port")
    serving_url: str | None = Field(
        default=None, description="The URL the API server reaches this host at; default: http://host:port"
    )
    serving_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Bound on the parameter bytes of the models kept loaded (least recently used "
        "evicted first); default: 80% of the leased GPUs' memory (45% with vLLM), or half the "
        "machine's RAM without one",
    )
    serving_load_timeout: float = Field(
        default=30.0,
        ge=0,
        description="How long a request waits for its model to load (then 503; the load goes on)",
    )
    serving_slots: int = Field(default=2, ge=1, description="Generations run at once")
    serving_slot_timeout: float = Field(
        default=30.0, ge=0, description="How long a request waits for a free generation slot (then 503)"
    )
    serving_heartbeat_seconds: float = Field(default=5.0, gt=0)
    serving_gpus: int = Field(
        default=1,
        ge=0,
        description="GPUs the host leases from its machine's pool (TWINKLE_WORKER_GPUS, else the GPUs "
        "it sees), like a training job; waits while they are all leased; 0, or a machine without "
        "GPUs: none, serve on the CPU",
    )
    serving_engine: Literal["auto", "transformers", "vllm"] = Field(
        default="auto", description="auto: vLLM when it imports on a CUDA host, else transformers"
    )


class Settings(SharedSettings, ServerSettings, WorkerSettings, ServingSettings):
    """Every TWINKLE_* setting, parsed once per process. The sections above say who reads which;
    one process (`twinkle-jobs up`) may be both server and worker, so they share one object."""

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @property
    def rendezvous_address(self) -> str:
        return self.worker_address or socket.gethostname()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / EMBEDDED_DATABASE}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.data_dir / EMBEDDED_BROKER}"

    @property
    def resolved_rate_limit_url(self) -> str | None:
        """The Redis URL rate limits are counted in, or None: in each server process."""
        url = self.rate_limit_url or self.broker_url
        if not url or url == "memory" or url.split("://", 1)[0] not in ("redis", "rediss", "unix"):
            return None
        return url

    @property
    def serving_secret_value(self) -> str:
        """TWINKLE_SERVING_SECRET, else one kept in the data dir (created by the first reader, so the
        server and the host of one machine agree without set-up)."""
        if self.serving_secret:
            return self.serving_secret
        return _secret_in(self.serving_secret_path)

    @property
    def serving_secret_path(self) -> Path:
        return self.data_dir / "serving-secret"

    @property
    def local_token_path(self) -> Path:
        """Where the local stack (`up`, `demo`) keeps its admin token."""
        return self.data_dir / "local-admin-token"

    @property
    def archives_dir(self) -> Path:
        """Checkpoint and tracker archives, built for downloads."""
        return self.data_dir / "archives"

    @property
    def stack_logs_dir(self) -> Path:
        """The local stack's children's logs (`demo`)."""
        return self.data_dir / "logs"

    @property
    def vllm_work_dir(self) -> Path:
        return self.data_dir / "serving"

    @property
    def service_dirs(self) -> list[Path]:
        """The data dir's folders that are the service's own: every project's jobs, uploads and
        archives, the stack's logs, the vLLM backend's work (no spec may read them by path)."""
        return [self.jobs_dir, self.files_dir, self.archives_dir, self.stack_logs_dir, self.vllm_work_dir]

    @property
    def service_files(self) -> list[Path]:
        """The service's own files at the data dir's top: the embedded databases (SQLite's side
        files start with their names), the serving secret and the local stack's admin token."""
        names = (EMBEDDED_DATABASE, EMBEDDED_BROKER)
        return [*(self.data_dir / name for name in names), self.serving_secret_path, self.local_token_path]

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def allowed_root_paths(self) -> list[Path]:
        if not self.allowed_roots:
            return [self.data_dir]
        return [Path(p).expanduser().resolve() for p in self.allowed_roots.split(":") if p]

    def ensure_dirs(self) -> None:
        for path in (self.data_dir, self.jobs_dir, self.files_dir):
            path.mkdir(parents=True, exist_ok=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    settings = Settings()
    settings.ensure_dirs()
    return settings


@functools.cache
def _secret_in(path: Path) -> str:
    """The serving secret kept at `path`, created by the first reader. Read once per process: the
    relay needs it on every request, and the file is never rewritten (a new secret takes a
    restart of the server and its hosts, which read it at start)."""
    if not path.exists():
        # Written whole under a temporary name, then linked into place: a reader never sees
        # a half-written secret, and of two first readers one secret wins (link refuses to
        # replace).
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".serving-secret.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            temp.unlink()
    return path.read_text().strip()
