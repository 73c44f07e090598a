"""A worker with `TWINKLE_ARTIFACT_URL=s3://...` (moto's S3 server on loopback): checkpoints are
uploaded after their marker and recorded with `s3://` locations, pruning deletes their objects,
and a job resumed on a host without the files (job dir gone) downloads its checkpoint first."""

from __future__ import annotations

import shutil
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from test_worker_support import WorkerEnv, fake_runner, fake_spec, sqlite_env

from jobcore.broker import send_wakeup
from jobcore.db.models import Checkpoint
from jobcore.db.session import session_scope
from jobcore.storage import store_for
from server.checkpoints.service import checkpoint_archive

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

pytestmark = pytest.mark.slow

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture()
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def env(tmp_path: Path, s3_endpoint: str) -> Iterator[WorkerEnv]:
    bucket = f"twinkle-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    yield from sqlite_env(
        tmp_path,
        TWINKLE_WORKER_RUNNER=str(fake_runner(tmp_path)),
        TWINKLE_ARTIFACT_URL=f"s3://{bucket}/prod",
        TWINKLE_S3_ENDPOINT_URL=s3_endpoint,
        **CREDENTIALS,
    )


def checkpoint_rows(env: WorkerEnv, job_id: str) -> list[Checkpoint]:
    with session_scope(env.database_url) as session:
        rows = list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)))
        for row in rows:
            session.expunge(row)
        return sorted(rows, key=lambda r: r.step)


def test_checkpoints_go_to_object_storage_and_a_job_resumes_from_there(
    env: WorkerEnv, s3_endpoint: str
) -> None:
    spec = fake_spec(max_steps=16, save_every=2, step_seconds=0.5)
    spec["training"]["save_total_limit"] = 2
    job_id = env.submit(spec, max_retries=0)
    env.start_worker()
    env.wait_for(job_id, lambda j: j.step >= 5, timeout=60, what="step 5")
    env.set_status(job_id, "pausing")
    paused = env.wait_status(job_id, "paused", "succeeded", "failed", timeout=60)
    assert paused.status == "paused", paused.error
    env.stop_workers()

    rows = checkpoint_rows(env, job_id)
    live = [r for r in rows if not r.deleted]
    assert all(r.path.startswith("s3://") and "/prod/jobs/" in r.path for r in rows), [r.path for r in rows]
    assert len(live) == 2 and live[-1].step == paused.step
    settings = env.settings()
    settings.s3_endpoint_url = s3_endpoint
    store = store_for(rows[0].path, settings)
    for row in rows:  # pruned checkpoints lose their objects; kept ones are complete
        assert store.is_complete(row.path) == (not row.deleted), row.path

    # The server serves the newest one from the bucket alone.
    shutil.rmtree(env.data_dir / "jobs" / job_id)  # as on a host without the worker's disk
    archive = checkpoint_archive(settings, live[-1])
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert f"{job_id}-step-{live[-1].step}/COMPLETE" in names and any("state.json" in n for n in names)

    # Resume on a worker that has none of the files: it downloads the checkpoint first.
    env.set_status(job_id, "queued")
    env.start_worker()
    send_wakeup(job_id, env.settings())
    done = env.wait_status(job_id, "succeeded", "failed", timeout=90)
    assert done.status == "succeeded", done.error
    resumed = [e for e in env.events(job_id) if "resuming from checkpoint" in e.message]
    assert len(resumed) == 1, [e.message for e in env.events(job_id)]
    local = Path(resumed[0].data["resume_from"])
    assert local == env.data_dir / "jobs" / job_id / "checkpoints" / f"step-{paused.step}"
    started = [e.data for e in env.events(job_id) if e.data and "start_step" in e.data]
    assert [d["start_step"] for d in started] == [0, paused.step]
    assert checkpoint_rows(env, job_id)[-1].path.endswith("/checkpoints/step-16")


def test_a_node_without_the_resume_checkpoint_downloads_it_from_object_storage(
    env: WorkerEnv, s3_endpoint: str, tmp_path: Path
) -> None:
    """Node i > 0 of a multi-node job, on a host without node 0's disk, resumes from the bucket."""
    from jobcore.settings import Settings
    from jobcore.storage import S3Store
    from worker.gang_node import local_resume_point

    job_id = env.submit(fake_spec(), wake=False)
    node0_ckpt = tmp_path / "host-a" / "jobs" / job_id / "checkpoints" / "step-4"  # node 0's path
    (node0_ckpt / "model").mkdir(parents=True)
    (node0_ckpt / "model" / "shard-1.bin").write_bytes(bytes(range(256)) * 8)
    (node0_ckpt / "COMPLETE").write_text("ok\n")
    store = S3Store(env.extra_env["TWINKLE_ARTIFACT_URL"], s3_endpoint)
    location = store.upload_checkpoint(job_id, node0_ckpt)
    with session_scope(env.database_url) as session:
        session.add(Checkpoint(job_id=job_id, step=4, path=location, metrics={}, size_bytes=2053))
    expected_bytes = (node0_ckpt / "model" / "shard-1.bin").read_bytes()
    shutil.rmtree(tmp_path / "host-a")  # not visible from this host

    settings = Settings(
        data_dir=env.data_dir,
        database_url=env.database_url,
        artifact_url=env.extra_env["TWINKLE_ARTIFACT_URL"],
        s3_endpoint_url=s3_endpoint,
    )
    local = settings.jobs_dir / job_id / "checkpoints" / "step-4"
    with session_scope(env.database_url) as session:
        assert local_resume_point(settings, session, job_id, str(node0_ckpt)) == str(local)
    assert (local / "model" / "shard-1.bin").read_bytes() == expected_bytes
    assert (local / "COMPLETE").exists()
    assert not list(local.parent.glob(".download-*"))  # no partial download left behind

    store.delete(location)  # a second node start uses the local copy, without the bucket
    with session_scope(env.database_url) as session:
        assert local_resume_point(settings, session, job_id, str(node0_ckpt)) == str(local)
        with pytest.raises(FileNotFoundError, match="step-6"):
            local_resume_point(settings, session, job_id, str(node0_ckpt.parent / "step-6"))


def test_a_serving_host_fetches_a_checkpoint_kept_only_in_object_storage(
    tmp_path: Path, s3_endpoint: str, tiny_model_dir: Path
) -> None:
    # The host's jobs root has nothing of the job: the checkpoint is only in the bucket (as with
    # TWINKLE_ARTIFACT_URL after the worker's copy is gone). Its first request waits the load
    # timeout (here none) and gets 503 with Retry-After while the fetch and load go on; then it
    # answers, from the copy in the job's directory. A location without objects is 404.
    import dataclasses

    import httpx
    from serving_host import SECRET, make_checkpoint, running_host

    from jobcore.settings import Settings
    from jobcore.storage import S3Store
    from serving.app import create_app
    from serving.engine import Engine, Limits
    from serving.fetch import fetcher
    from serving.generation import TransformersBackend

    bucket = f"twinkle-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    store = S3Store(f"s3://{bucket}/prod", s3_endpoint)
    trained = make_checkpoint(tiny_model_dir, tmp_path / "worker-jobs", "job-s3", lora=False)
    location = store.upload_checkpoint("job-s3", trained)
    shutil.rmtree(tmp_path / "worker-jobs")

    settings = Settings(data_dir=tmp_path / "host", s3_endpoint_url=s3_endpoint)
    limits = Limits(memory_bytes=2**30, load_timeout=0, slots=1, slot_timeout=5)
    engine = Engine(TransformersBackend(), limits, fetch=fetcher(settings))
    app = create_app(engine, secret=SECRET, jobs_root=settings.jobs_dir, allowed_roots=[])

    def complete(checkpoint: str, job_id: str = "job-s3") -> httpx.Response:
        body = {
            "model": "ft:s3",
            "prompt": "the cat",
            "max_tokens": 4,
            "twinkle": {"checkpoint": checkpoint, "job_id": job_id, "model": "ft:s3"},
        }
        headers = {"Authorization": f"Bearer {SECRET}"}
        return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)

    with running_host(app) as url:
        first = complete(location)
        assert first.status_code == 503 and first.json()["error"]["code"] == "model_loading"
        assert first.headers["retry-after"]
        deadline = time.monotonic() + 60
        while (answer := complete(location)).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "ft:s3" and answer.json()["choices"][0]["text"] is not None
        copy = settings.jobs_dir / "job-s3" / "checkpoints" / trained.name
        assert (copy / "COMPLETE").is_file()
        assert engine.health()["models"][0]["checkpoint"] == location  # named as the server named it

        engine.limits = dataclasses.replace(limits, load_timeout=30)
        gone = complete(location.replace(trained.name, "step-99"))
        assert gone.status_code == 404 and gone.json()["error"]["param"] == "twinkle.checkpoint"
        bad = complete(location, job_id="../elsewhere")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "twinkle.job_id"
