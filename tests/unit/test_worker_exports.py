"""The worker's exporter against a real (SQLite) database: one claim per export, the request it
builds from the job's spec, failures recorded with the exporter's own message, and the exports of
lost workers requeued. The export itself runs in tests/integration/test_exports.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobcore.db.migrate import upgrade
from jobcore.db.models import Checkpoint, Export, Job, Project, utcnow
from jobcore.db.session import session_scope
from jobcore.settings import Settings
from worker.exports import Exporter, requeue_stale

LORA_SPEC: dict[str, Any] = {
    "model": {"model_id": "hf://org/base", "config": {"hidden_size": 64}},
    "data": {"train_file": "/dev/null"},
    "adapter": {"r": 4},
}


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Migrated once per module (about 2 s); each test works on its own copy."""
    path = tmp_path_factory.mktemp("exports-db") / "template.sqlite"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture()
def settings(tmp_path: Path, migrated_db: Path) -> Settings:
    shutil.copy(migrated_db, tmp_path / "db.sqlite")
    s = Settings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", stale_after_seconds=5
    )
    s.ensure_dirs()
    return s


@pytest.fixture()
def export_id(settings: Settings) -> Iterator[str]:
    """A pending merged export of a LoRA job's (complete) step-3 checkpoint."""
    checkpoint_dir = settings.jobs_dir / "job-x" / "checkpoints" / "step-3"
    checkpoint_dir.mkdir(parents=True)
    (checkpoint_dir / "COMPLETE").write_text("ok")
    with session_scope(settings.resolved_database_url) as session:
        project = Project(name="p")
        session.add(project)
        session.flush()
        session.add(Job(id="job-x", project_id=project.id, name="tuned", spec=LORA_SPEC, status="succeeded"))
        session.flush()
        ckpt = Checkpoint(job_id="job-x", step=3, path=str(checkpoint_dir))
        session.add(ckpt)
        session.flush()
        export = Export(job_id="job-x", checkpoint_id=ckpt.id, step=3, kind="merged")
        session.add(export)
        session.flush()
        created = export.id
    yield created


def row(settings: Settings, export_id: str) -> Export:
    with session_scope(settings.resolved_database_url) as session:
        export = session.get(Export, export_id)
        assert export is not None
        session.expunge(export)
        return export


def test_one_worker_claims_an_export_with_what_the_job_trained_on(settings: Settings, export_id: str) -> None:
    first, second = Exporter(settings, "worker-a"), Exporter(settings, "worker-b")
    claimed = first.claim_next()
    assert claimed is not None and claimed.id == export_id
    assert second.claim_next() is None  # compare-and-set: pending -> running once
    request = claimed.request
    assert (request.kind, request.base_model, request.base_model_name) == (
        "merged",
        "hf://org/base",
        "org/base",
    )
    assert request.config == {"hidden_size": 64} and request.model_cls == "AutoModelForCausalLM"
    assert Path(request.checkpoint_dir) == settings.jobs_dir / "job-x" / "checkpoints" / "step-3"
    assert (
        Path(request.output_dir) == settings.jobs_dir / "job-x" / "exports" / export_id
    )  # goes with the job
    assert (request.job_id, request.job_name, request.step) == ("job-x", "tuned", 3)
    export = row(settings, export_id)
    assert (export.status, export.worker_id) == ("running", "worker-a") and export.heartbeat_at is not None


def test_a_failed_export_records_the_exporters_message(settings: Settings, export_id: str) -> None:
    exporter = Exporter(settings, "worker-a")
    claimed = exporter.claim_next()
    assert claimed is not None
    (Path(claimed.request.checkpoint_dir) / "COMPLETE").unlink()  # removed by retention meanwhile
    exporter.run(claimed)  # the real `python -m twinkle_core.export`, which refuses it
    export = row(settings, export_id)
    assert export.status == "failed" and export.finished_at is not None
    assert (
        export.error == f"{claimed.request.checkpoint_dir} is not a complete checkpoint (no COMPLETE marker)"
    )
    assert not Path(claimed.request.output_dir).exists()


def test_a_deleted_checkpoint_fails_at_the_claim(settings: Settings, export_id: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        session.query(Checkpoint).update({"deleted": True})
    assert Exporter(settings, "worker-a").claim_next() is None
    export = row(settings, export_id)
    assert export.status == "failed" and "deleted" in (export.error or "")


def test_the_running_exports_of_lost_workers_go_back_to_pending(settings: Settings, export_id: str) -> None:
    assert Exporter(settings, "worker-a").claim_next() is not None
    assert requeue_stale(settings) == 0  # heartbeating: left alone
    with session_scope(settings.resolved_database_url) as session:
        export = session.get(Export, export_id)
        assert export is not None
        export.heartbeat_at = utcnow() - timedelta(seconds=settings.stale_after_seconds + 1)
    assert requeue_stale(settings) == 1
    assert (row(settings, export_id).status, row(settings, export_id).worker_id) == ("pending", None)
    assert Exporter(settings, "worker-b").claim_next() is not None


def test_an_export_of_a_job_deleted_meanwhile_leaves_nothing_behind(
    settings: Settings, export_id: str
) -> None:
    exporter = Exporter(settings, "worker-a")
    claimed = exporter.claim_next()
    assert claimed is not None
    with session_scope(settings.resolved_database_url) as session:
        session.query(Job).delete()  # what DELETE /v1/jobs/{id} does to the rows (the files go too)
    job_dir = settings.jobs_dir / "job-x"
    assert job_dir.is_dir()
    exporter.run(claimed)
    assert not job_dir.exists()
    assert row_or_none(settings, export_id) is None


def row_or_none(settings: Settings, export_id: str) -> Export | None:
    with session_scope(settings.resolved_database_url) as session:
        return session.get(Export, export_id)


def test_a_checkpoint_in_object_storage_is_exported_from_a_local_copy(
    settings: Settings, export_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    location = "s3://bucket/jobs/job-x/checkpoints/step-3"
    with moto.mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bucket")
        for name, body in (("adapter_model.safetensors", b"weights"), ("COMPLETE", b"ok")):
            s3.put_object(Bucket="bucket", Key=f"jobs/job-x/checkpoints/step-3/{name}", Body=body)
        shutil.rmtree(settings.jobs_dir / "job-x")  # this host never had the files
        with session_scope(settings.resolved_database_url) as session:
            session.query(Checkpoint).update({"path": location})
        claimed = Exporter(settings, "worker-a").claim_next()
    assert claimed is not None, row(settings, export_id).error
    local = Path(claimed.request.checkpoint_dir)
    assert local == settings.jobs_dir / "job-x" / "checkpoints" / "step-3"
    assert (local / "adapter_model.safetensors").read_bytes() == b"weights" and (local / "COMPLETE").is_file()
