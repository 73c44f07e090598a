"""A job's tracker outputs over the API: listed, downloaded as tar.gz, read by tensorboard's reader."""

from __future__ import annotations

import io
import os
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api

from twinkle_core.trackers import TensorBoardTracker

pytest.importorskip("tensorboard")


def _job_dir(api: Api, job_id: str) -> Path:
    directory = api.settings.jobs_dir / job_id
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _unpack(payload: bytes, target: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(target, filter="data")
    return names


def test_tensorboard_files_download_and_parse_with_the_jobs_losses(api: Api, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job_id = api.submit()["id"]
    assert api.client.get(f"/v1/jobs/{job_id}/artifacts", headers=api.admin).json()["data"] == []

    losses = {1: 2.5, 2: 2.25, 3: 2.0}
    tracker = TensorBoardTracker(_job_dir(api, job_id))
    for step, loss in losses.items():
        tracker.log_metrics(step, {"train/loss": loss})
    tracker.close()

    listed = api.client.get(f"/v1/jobs/{job_id}/artifacts", headers=api.admin).json()
    (board,) = listed["data"]
    assert board["name"] == "tensorboard" and board["path"] == "tensorboard" and board["files"] == 1
    assert board["size_bytes"] > 0 and board["download_url"] == f"/v1/jobs/{job_id}/artifacts/tensorboard"

    response = api.client.get(board["download_url"], headers=api.admin)
    assert response.status_code == 200 and response.headers["content-type"] == "application/gzip"
    assert f'filename="{job_id}-tensorboard.tar.gz"' in response.headers["content-disposition"]
    names = _unpack(response.content, tmp_path)
    assert all(n.startswith(f"{job_id}-tensorboard/tensorboard/") for n in names if "/" in n)
    reader = EventAccumulator(str(tmp_path / f"{job_id}-tensorboard" / "tensorboard"))
    reader.Reload()
    assert [(s.step, np.float32(s.value)) for s in reader.Scalars("train/loss")] == [
        (step, np.float32(loss)) for step, loss in losses.items()
    ]
    # The temporary archive is gone once sent.
    assert not list((api.settings.data_dir / "archives").glob(f".{job_id}-*"))


def test_mlflow_database_downloads_and_links_out_of_the_job_dir_are_never_followed(
    api: Api, tmp_path: Path
) -> None:
    job_id = api.submit()["id"]
    job_dir = _job_dir(api, job_id)
    with sqlite3.connect(job_dir / "mlflow.db") as db:
        db.execute("CREATE TABLE metrics (key TEXT, value REAL)")
        db.execute("INSERT INTO metrics VALUES ('train/loss', 1.5)")
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (job_dir / "wandb").mkdir()
    os.symlink(secret, job_dir / "wandb" / "leak.txt")  # a job that tries to leak a host file

    data = api.client.get(f"/v1/jobs/{job_id}/artifacts", headers=api.admin).json()["data"]
    assert [a["name"] for a in data] == ["mlflow"]  # the wandb dir holds only a link: nothing
    assert api.client.get(f"/v1/jobs/{job_id}/artifacts/wandb", headers=api.admin).status_code == 404

    response = api.client.get(f"/v1/jobs/{job_id}/artifacts/mlflow", headers=api.admin)
    assert response.status_code == 200
    _unpack(response.content, tmp_path / "out")
    with sqlite3.connect(tmp_path / "out" / f"{job_id}-mlflow" / "mlflow.db") as db:
        assert db.execute("SELECT key, value FROM metrics").fetchall() == [("train/loss", 1.5)]


def test_unknown_names_other_projects_and_missing_outputs(api: Api) -> None:
    job_id = api.submit()["id"]
    bad = api.client.get(f"/v1/jobs/{job_id}/artifacts/..%2F..%2Fetc", headers=api.admin)
    assert bad.status_code == 404  # no route: a name is one path segment from a fixed set
    unknown = api.client.get(f"/v1/jobs/{job_id}/artifacts/comet", headers=api.admin)
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "name"
    missing = api.client.get(f"/v1/jobs/{job_id}/artifacts/tensorboard", headers=api.admin)
    assert missing.status_code == 404 and "no tensorboard output" in missing.json()["error"]["message"]
    other = api.token("p2")
    assert api.client.get(f"/v1/jobs/{job_id}/artifacts", headers=other).status_code == 404
    assert api.client.get(f"/v1/jobs/{job_id}/artifacts/tensorboard", headers=other).status_code == 404


def test_cli_lists_and_downloads_through_the_client(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner
    from test_api_support import BOOTSTRAP
    from test_cli_admin import client_of

    from twinkle_cli import resources
    from twinkle_cli.main import cli

    job_id = api.submit()["id"]
    tracker = TensorBoardTracker(_job_dir(api, job_id))
    tracker.log_metrics(1, {"train/loss": 1.0})
    tracker.close()
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})

    listed = runner.invoke(cli, ["jobs", "artifacts", job_id], catch_exceptions=False)
    assert listed.exit_code == 0 and listed.output.startswith("tensorboard  1 files  ")
    dest = tmp_path / "board.tar.gz"
    saved = runner.invoke(
        cli,
        ["jobs", "artifacts", job_id, "--download", "tensorboard", "--dest", str(dest)],
        catch_exceptions=False,
    )
    assert saved.exit_code == 0 and saved.output.strip() == str(dest)
    assert any(
        n.endswith(".tfevents." + n.split(".tfevents.")[-1]) for n in _unpack(dest.read_bytes(), tmp_path)
    )
    missing = runner.invoke(cli, ["jobs", "artifacts", job_id, "--download", "mlflow"])
    assert missing.exit_code != 0 and "no mlflow output" in missing.output

    # --dest: a folder takes the default name; a missing folder is made; an unwritable place is
    # said in one line and leaves no part file behind.
    args = ["jobs", "artifacts", job_id, "--download", "tensorboard", "--dest"]
    into = runner.invoke(cli, [*args, str(tmp_path)], catch_exceptions=False)
    assert into.exit_code == 0 and into.output.strip() == str(tmp_path / f"{job_id}-tensorboard.tar.gz")
    nested = tmp_path / "new" / "deeper" / "b.tar.gz"
    made = runner.invoke(cli, [*args, str(nested)], catch_exceptions=False)
    assert made.exit_code == 0 and nested.stat().st_size > 0
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    refused = runner.invoke(cli, [*args, str(blocker / "b.tar.gz")])
    assert refused.exit_code == 1 and f"cannot write {blocker / 'b.tar.gz'}" in refused.output
    assert "Traceback" not in refused.output and not list(tmp_path.rglob("*.part"))
