"""Exports: a worker turns a checkpoint into a standalone Hugging Face model folder.

One `Exporter` per worker process, a thread that makes one export at a time, each in its own
process (`python -m twinkle_core.export`): the worker stays free of torch, and an OOM while a
large base model is merged ends that process, not the worker and the jobs it supervises.

Exports run on the CPU (`CUDA_VISIBLE_DEVICES` empty) and lease no GPU: a merge is one pass over
the weights, bound by memory and disk rather than compute, and it never has to wait for GPUs that
training jobs hold. One at a time bounds the memory a worker spends on them (a merge holds the
base model once).

The `exports` table is the queue, as `jobs` is for training: the broker's `worker.export` task
only pokes the thread, which also looks for pending exports every heartbeat, so a lost message
delays an export by seconds. Claims are compare-and-set (`pending` -> `running`); a running
export heartbeats its row, and one whose heartbeat went stale (its worker died) goes back to
`pending` for any worker to take.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobcore import storage
from jobcore.db.models import Checkpoint, Export, Job, utcnow
from jobcore.db.session import session_scope
from jobcore.jobs.spec import job_spec
from jobcore.local_paths import PathRefused, pin_local_path
from jobcore.settings import Settings
from twinkle_core.export import ExportRequest, public_base_name
from worker.checkpoints import local_copy

log = logging.getLogger(__name__)

PENDING, RUNNING, SUCCEEDED, FAILED = "pending", "running", "succeeded", "failed"
ERROR_TAIL_CHARS = 2000


def exports_dir(settings: Settings, job_id: str) -> Path:
    """`<job dir>/exports`: deleting the job deletes its exports (and their archives) with it."""
    return settings.jobs_dir / job_id / "exports"


@dataclass
class ClaimedExport:
    id: str
    request: ExportRequest


class Exporter:
    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.db = settings.resolved_database_url
        self.worker_id = worker_id
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._loop, name="worker-exports", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """An export was requested (the broker's task): look now rather than at the next beat."""
        self._due.set()

    def stop(self, timeout: float = 10.0) -> None:
        """End the running export's process; its row goes back to `pending` (see `run`)."""
        self._stopping.set()
        self._due.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                requeue_stale(self.settings)
                while not self._stopping.is_set() and (claimed := self.claim_next()) is not None:
                    self.run(claimed)
            except Exception:
                log.exception("export pass failed; retrying next heartbeat")
            self._due.wait(self.settings.heartbeat_seconds)
            self._due.clear()

    def claim_next(self) -> ClaimedExport | None:
        with session_scope(self.db) as session:
            candidates = session.scalars(
                select(Export.id).where(Export.status == PENDING).order_by(Export.created_at).limit(8)
            ).all()
            for export_id in candidates:
                now = utcnow()
                result = session.execute(
                    update(Export)
                    .where(Export.id == export_id, Export.status == PENDING)
                    .values(
                        status=RUNNING, worker_id=self.worker_id, started_at=now, heartbeat_at=now, error=None
                    )
                )
                if result.rowcount == 1:  # type: ignore[attr-defined]
                    session.commit()  # ours now, whatever happens while the request is built
                    try:
                        return ClaimedExport(export_id, self._request(session, export_id))
                    except Exception as exc:  # a spec or checkpoint that cannot be exported
                        _finish(session, export_id, FAILED, error=str(exc) or type(exc).__name__)
                        session.commit()
        return None

    def _request(self, session: Session, export_id: str) -> ExportRequest:
        export = session.get(Export, export_id)
        assert export is not None
        job = session.get(Job, export.job_id)
        checkpoint = session.get(Checkpoint, export.checkpoint_id)
        if job is None or checkpoint is None or checkpoint.deleted:
            raise ValueError("the checkpoint was deleted before it could be exported")
        spec = job_spec(job.spec)
        source = checkpoint.path
        if storage.is_remote(source):
            # Object storage: through the job dir's local copy, as a resume does.
            job_dir = self.settings.jobs_dir / job.id
            source = str(local_copy(source, job_dir, storage.artifact_store(self.settings), self.settings))
        target = exports_dir(self.settings, job.id) / export.id
        if target.exists():  # a lost worker's finished folder, its row never marked: make it again
            shutil.rmtree(target)
        return ExportRequest(
            checkpoint_dir=source,
            output_dir=str(target),
            kind=export.kind,  # type: ignore[arg-type]  # the API only stores EXPORT_KINDS
            base_model=self._base_model(spec.model.model_id, export.kind),
            base_model_name=public_base_name(spec.model.model_id),
            model_cls=spec.model.model_cls,
            config=spec.model.config,
            kwargs=spec.model.kwargs,
            job_id=job.id,
            job_name=job.name,
            step=export.step,
        )

    def _base_model(self, model_id: str | None, kind: str) -> str | None:
        """The job's base as the export reads it: a merge loads it, so a local path is checked
        again and resolved (a link may have changed since submit); the other kinds only name it."""
        if kind != "merged":
            return model_id
        try:
            return pin_local_path(model_id, self.settings)
        except PathRefused as exc:
            raise ValueError(f"the job's base model (model.model_id): {exc}") from None

    # ------------------------------------------------------------------------------- running
    def run(self, claimed: ClaimedExport) -> None:
        directory = Path(claimed.request.output_dir).parent
        directory.mkdir(parents=True, exist_ok=True)
        request_file = directory / f".{claimed.id}.request.json"
        log_file = directory / f".{claimed.id}.log"
        claimed.request.write(request_file)
        log.info("export %s: %s of %s", claimed.id, claimed.request.kind, claimed.request.checkpoint_dir)
        with log_file.open("wb") as out:
            self._proc = start_export(request_file, out)
            while True:
                try:
                    code = self._proc.wait(self.settings.heartbeat_seconds)
                    break
                except subprocess.TimeoutExpired:
                    self._heartbeat(claimed.id)
        self._proc = None
        with session_scope(self.db) as session:
            if self._stopping.is_set() and code != 0:
                # Stopped with the worker: not the export's fault, another worker makes it.
                session.execute(
                    update(Export).where(Export.id == claimed.id).values(status=PENDING, worker_id=None)
                )
            elif code == 0:
                target = Path(claimed.request.output_dir)
                _finish(session, claimed.id, SUCCEEDED, path=str(target), size=_size(target))
            else:
                _finish(session, claimed.id, FAILED, error=_failure(log_file, code))
        request_file.unlink(missing_ok=True)
        if job_deleted(self.db, claimed.request.job_id):
            # The job was deleted while its export ran (its directory with it): what the export
            # wrote since, the job dir it recreated included, goes too.
            shutil.rmtree(self.settings.jobs_dir / claimed.request.job_id, ignore_errors=True)
        log.info("export %s ended with exit code %s", claimed.id, code)

    def _heartbeat(self, export_id: str) -> None:
        """Beat the export's heartbeat; a database that fails now is logged and the export goes on
        (leaving `run` here would orphan the export's process, which another claim would then
        race in the same folder once the row looked stale)."""
        try:
            with session_scope(self.db) as session:
                session.execute(update(Export).where(Export.id == export_id).values(heartbeat_at=utcnow()))
        except Exception:
            log.warning("export %s: heartbeat failed; the export goes on", export_id, exc_info=True)


def start_export(request_file: Path, out: IO[bytes]) -> subprocess.Popen[bytes]:
    """`python -m twinkle_core.export` on an ExportRequest file, its output into `out`: on the CPU,
    in a session of its own (the exporter's exports, and a LoRA job's model merged as a new job's
    base: worker.base_merge)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "twinkle_core.export", str(request_file)]
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def job_deleted(db: str, job_id: str) -> bool:
    with session_scope(db) as session:
        return session.get(Job, job_id) is None


def requeue_stale(settings: Settings) -> int:
    """Running exports whose worker stopped heartbeating them go back to `pending`."""
    cutoff = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    with session_scope(settings.resolved_database_url) as session:
        result = session.execute(
            update(Export)
            .where(Export.status == RUNNING, Export.heartbeat_at < cutoff)
            .values(status=PENDING, worker_id=None)
        )
        count = int(result.rowcount or 0)  # type: ignore[attr-defined]
    if count:
        log.warning("%d export(s) of lost workers requeued", count)
    return count


def _finish(
    session: Session,
    export_id: str,
    status: str,
    *,
    error: str | None = None,
    path: str | None = None,
    size: int | None = None,
) -> None:
    session.execute(
        update(Export)
        .where(Export.id == export_id)
        .values(status=status, error=error, path=path, size_bytes=size, finished_at=utcnow())
    )


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _failure(log_file: Path, code: int) -> str:
    """The exporter's own message for a user error (exit 2), else the tail of its output."""
    text = log_file.read_text(errors="replace") if log_file.is_file() else ""
    for line in reversed(text.splitlines()):
        if line.startswith("export failed: "):
            return line.removeprefix("export failed: ")
    return f"the export process exited with code {code}: {text[-ERROR_TAIL_CHARS:]}"
