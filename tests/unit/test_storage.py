"""Object storage for checkpoints against a real S3-compatible server (moto's server mode on
loopback): upload with the marker last, listing, download, deletion, and the download API."""

from __future__ import annotations

import io
import socket
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api

from jobcore.db.models import Checkpoint
from jobcore.storage import S3Store, is_remote, split_s3_url

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


@pytest.fixture()
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on a free loopback port, with throwaway credentials."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
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
def bucket(s3_endpoint: str) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


def make_checkpoint(root: Path, step: int) -> Path:
    directory = root / f"step-{step}"
    (directory / "optim").mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (directory / "optim" / "rank-0.pt").write_bytes(b"\x01" * 1000)
    (directory / "COMPLETE").write_text("ok\n")
    return directory


def test_urls_are_parsed_and_bad_ones_name_the_setting() -> None:
    assert split_s3_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert split_s3_url("s3://bucket") == ("bucket", "")
    assert is_remote("s3://b/x") and not is_remote("/data/jobs/x") and not is_remote(None)
    for bad in ("bucket/prefix", "s3://", "file:///tmp"):
        with pytest.raises(ValueError, match="TWINKLE_ARTIFACT_URL"):
            split_s3_url(bad)


def test_upload_list_download_delete_round_trip(tmp_path: Path, s3_endpoint: str, bucket: str) -> None:
    store = S3Store(f"s3://{bucket}/team", s3_endpoint)
    local = make_checkpoint(tmp_path / "local", 4)
    location = store.upload_checkpoint("job-1", local)
    assert location == f"s3://{bucket}/team/jobs/job-1/checkpoints/step-4"
    files = {f.relative: f.size for f in store.list_files(location)}
    assert files == {"COMPLETE": 3, "model.safetensors": 256 * 64, "optim/rank-0.pt": 1000}
    assert store.is_complete(location)

    target = tmp_path / "elsewhere" / "step-4"
    target.parent.mkdir()
    store.download(location, target)
    for name in files:
        assert (target / name).read_bytes() == (local / name).read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["step-4"]  # no partial download left

    store.delete(location)
    assert store.list_files(location) == [] and not store.is_complete(location)
    with pytest.raises(FileNotFoundError, match="incomplete or gone"):
        store.download(location, tmp_path / "again")


def test_the_marker_is_uploaded_last(tmp_path: Path, s3_endpoint: str, bucket: str) -> None:
    store = S3Store(f"s3://{bucket}", s3_endpoint)
    uploaded: list[str] = []
    real_upload = store.client.upload_file

    def recording_upload(path: str, bucket_name: str, key: str) -> None:
        uploaded.append(key.rsplit("/", 1)[-1])
        real_upload(path, bucket_name, key)

    store.client.upload_file = recording_upload
    store.upload_checkpoint("job-2", make_checkpoint(tmp_path, 9))
    assert uploaded[-1] == "COMPLETE" and len(uploaded) == 3


def test_a_checkpoint_without_its_marker_in_storage_is_not_complete(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    store = S3Store(f"s3://{bucket}", s3_endpoint)
    local = make_checkpoint(tmp_path, 2)
    (local / "COMPLETE").unlink()  # a worker that died mid-upload leaves exactly this
    location = store.upload_checkpoint("job-3", local)
    assert store.list_files(location) and not store.is_complete(location)
    with pytest.raises(FileNotFoundError):
        store.download(location, tmp_path / "target")


def test_the_api_lists_and_downloads_a_checkpoint_in_object_storage(
    api: Api, tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    api.settings.s3_endpoint_url = s3_endpoint
    job = api.submit()
    store = S3Store(f"s3://{bucket}/p", s3_endpoint)
    local = make_checkpoint(tmp_path / "worker-host", 5)
    location = store.upload_checkpoint(job["id"], local)
    with api.session() as session, session.begin():
        row = Checkpoint(job_id=job["id"], step=5, path=location, metrics={}, size_bytes=17384)
        session.add(row)
        session.flush()
        ckpt_id = row.id
    listed = api.client.get(f"/v1/jobs/{job['id']}/checkpoints", headers=api.admin).json()
    assert [c["id"] for c in listed["data"]] == [ckpt_id]

    url = f"/v1/jobs/{job['id']}/checkpoints/{ckpt_id}/download"
    response = api.client.get(url, headers=api.admin)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    root = f"{job['id']}-step-5"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        assert sorted(tar.getnames()) == [
            f"{root}/{n}" for n in ("COMPLETE", "model.safetensors", "optim/rank-0.pt")
        ]
        member = tar.extractfile(f"{root}/model.safetensors")
        assert member is not None and member.read() == (local / "model.safetensors").read_bytes()
    partial = api.client.get(url, headers={**api.admin, "Range": "bytes=512-"})
    assert partial.status_code == 206 and partial.content == response.content[512:]

    other = api.submit()
    gone = store.upload_checkpoint(other["id"], make_checkpoint(tmp_path / "gone", 6))
    store.delete(gone)
    with api.session() as session, session.begin():
        row = Checkpoint(job_id=other["id"], step=6, path=gone, metrics={}, size_bytes=0)
        session.add(row)
        session.flush()
        gone_id = row.id
    missing = api.client.get(f"/v1/jobs/{other['id']}/checkpoints/{gone_id}/download", headers=api.admin)
    assert missing.status_code == 404 and "no longer in storage" in missing.json()["error"]["message"]
