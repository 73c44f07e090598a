"""Checkpoints API: listing, tar downloads with Range resume, tenancy, vanished files."""

from __future__ import annotations

import io
import shutil
import tarfile

from test_api_support import *  # noqa: F403
from test_api_support import Api


def test_list_checkpoints_highest_step_first(api: Api) -> None:
    job = api.submit()
    made = [api.add_checkpoint(job["id"], step, is_best=step == 20) for step in (10, 20, 30)]
    url = f"/v1/jobs/{job['id']}/checkpoints"
    page = api.client.get(f"{url}?limit=2", headers=api.admin).json()
    assert [c["step"] for c in page["data"]] == [30, 20] and page["has_more"]
    top = page["data"][0]
    assert set(top) == {"id", "object", "job_id", "step", "metrics", "size_bytes", "is_best", "created_at"}
    assert top["size_bytes"] == made[2]["size"] and top["metrics"] == {"loss": 1.0 / 30}
    rest = api.client.get(f"{url}?after={page['last_id']}", headers=api.admin).json()
    assert [c["step"] for c in rest["data"]] == [10] and not rest["has_more"]
    job_view = api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()
    assert job_view["latest_checkpoint"]["step"] == 30 and job_view["best_checkpoint"]["step"] == 20


def test_download_is_a_tar_of_the_checkpoint_and_supports_range(api: Api) -> None:
    job = api.submit()
    ckpt = api.add_checkpoint(job["id"], 7)
    url = f"/v1/jobs/{job['id']}/checkpoints/{ckpt['id']}/download"
    response = api.client.get(url, headers=api.admin)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    assert f"{job['id']}-step-7.tar" in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = sorted(tar.getnames())
        assert names == [f"{job['id']}-step-7/{n}" for n in ("COMPLETE", "shard-0.bin", "shard-1.bin")]
        shard = tar.extractfile(f"{job['id']}-step-7/shard-1.bin")
        assert shard is not None and shard.read() == bytes([7, 1]) * 4096
    whole = response.content
    partial = api.client.get(url, headers={**api.admin, "Range": "bytes=100-"})
    assert partial.status_code == 206 and partial.content == whole[100:]
    assert partial.headers["content-range"] == f"bytes 100-{len(whole) - 1}/{len(whole)}"


def test_download_of_vanished_or_foreign_checkpoints_is_404(api: Api) -> None:
    job = api.submit(api.token("a"))
    ckpt = api.add_checkpoint(job["id"], 3)
    url = f"/v1/jobs/{job['id']}/checkpoints/{ckpt['id']}/download"
    assert api.client.get(url, headers=api.token("b")).status_code == 404
    assert api.client.get(f"/v1/jobs/{job['id']}/checkpoints", headers=api.token("b")).status_code == 404
    shutil.rmtree(ckpt["path"])
    gone = api.client.get(url, headers=api.token("a"))
    assert gone.status_code == 404 and "no longer on disk" in gone.json()["error"]["message"]
    missing = f"/v1/jobs/{job['id']}/checkpoints/ckpt-nope/download"
    assert api.client.get(missing, headers=api.token("a")).status_code == 404


def test_a_checkpoint_path_outside_the_data_dir_is_never_served(api: Api, tmp_path: object) -> None:
    from pathlib import Path

    from jobcore.db.models import Checkpoint

    job = api.submit()
    secret = Path(str(tmp_path)) / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not serve")
    with api.session() as session, session.begin():
        row = Checkpoint(job_id=job["id"], step=1, path=str(secret), metrics={}, size_bytes=1)
        session.add(row)
        session.flush()
        ckpt_id = row.id
    response = api.client.get(f"/v1/jobs/{job['id']}/checkpoints/{ckpt_id}/download", headers=api.admin)
    assert response.status_code == 404
