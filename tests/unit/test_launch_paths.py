"""A spec's local paths are checked at submit and again when the worker launches the job (or
exports from it): a path fine at submit may be a symlink into another project's storage by then,
and the runner reads the resolved path that was checked."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import File, Job
from jobcore.local_paths import PathRefused, pin_local_path
from worker.exports import Exporter
from worker.spec_resolution import resolve_spec


def victims_upload(api: Api) -> Path:
    """Another project's uploaded dataset, as stored in the data dir."""
    content = json.dumps({"text": "the other project's secret"}) + "\n"
    files = {"file": ("secret.jsonl", io.BytesIO(content.encode()), "application/jsonl")}
    victim = api.token("victim")
    answer = api.client.post("/v1/files", files=files, data={"purpose": "fine-tune"}, headers=victim)
    assert answer.is_success, answer.text
    with api.session() as session:
        row = session.get(File, answer.json()["id"])
        assert row is not None
        return Path(row.storage_path)


def submitted_with(api: Api, roots: Path, **data: str) -> Job:
    body = spec_body()
    body["spec"]["data"] = data
    answer = api.client.post("/v1/jobs", json=body, headers=api.token("attacker"))
    assert answer.status_code == 201, answer.text
    with api.session() as session:
        job = session.get(Job, answer.json()["id"])
        assert job is not None
        session.expunge(job)
        return job


def test_a_dataset_swapped_for_a_link_into_another_projects_uploads_fails_the_launch(
    api: Api, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    mine = roots / "mine.jsonl"
    mine.write_text('{"text": "mine"}\n')
    job = submitted_with(api, roots, train_file=str(mine))
    secret = victims_upload(api)
    mine.unlink()
    os.symlink(secret, mine)  # after the submit's check
    refused = pytest.raises(ValueError, match=r"data\.train_file: .* in the service's own storage")
    with api.session() as session, refused:
        resolve_spec(session, session.merge(job), api.settings)


def test_a_link_within_the_roots_reaches_the_runner_resolved(api: Api, tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    real = roots / "datasets" / "train.jsonl"
    real.parent.mkdir()
    real.write_text('{"text": "hello"}\n')
    link = roots / "current.jsonl"
    os.symlink(real, link)
    job = submitted_with(api, roots, train_file=str(link), validation_file=str(link))
    with api.session() as session:
        spec = resolve_spec(session, session.merge(job), api.settings).spec
    # The runner opens the checked file itself, whatever the link points at by then.
    assert spec.data.train_file == spec.data.validation_file == str(real)
    assert spec.model.model_id == "org/tiny-llama"  # a hub id is no path


def test_a_removed_dataset_is_a_user_error_at_launch(api: Api, tmp_path: Path) -> None:
    dataset = tmp_path / "roots" / "gone.jsonl"
    dataset.write_text('{"text": "hello"}\n')
    job = submitted_with(api, tmp_path / "roots", train_file=str(dataset))
    dataset.unlink()
    with api.session() as session, pytest.raises(ValueError, match=r"data\.train_file: .* does not exist"):
        resolve_spec(session, session.merge(job), api.settings)


def test_the_roots_are_checked_again_where_the_worker_was_given_them(api: Api, tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"text": "x"}\n')
    assert api.settings.allowed_roots is not None
    with pytest.raises(PathRefused, match="outside the allowed data roots"):
        pin_local_path(str(outside), api.settings)
    # A worker left on the default roots trusts the submit's check for them, and still refuses
    # its own storage.
    default = api.settings.model_copy(update={"allowed_roots": None})
    assert pin_local_path(str(outside), default) == str(outside)
    with pytest.raises(PathRefused, match="service's own storage"):
        pin_local_path(str(api.settings.files_dir), default)
    assert pin_local_path("file-abc", default) == "file-abc"
    assert pin_local_path("ft:tiny:job-1", default) == "ft:tiny:job-1"


def test_a_merged_export_checks_its_base_again_and_the_other_kinds_only_name_it(
    api: Api, tmp_path: Path
) -> None:
    exporter = Exporter(api.settings, "w1")
    base = tmp_path / "roots" / "base-model"
    base.mkdir()
    assert exporter._base_model(str(base), "merged") == str(base)
    base.rmdir()
    os.symlink(api.settings.jobs_dir, base)
    with pytest.raises(ValueError, match=r"base model \(model\.model_id\): .* service's own storage"):
        exporter._base_model(str(base), "merged")
    assert exporter._base_model(str(base), "adapter") == str(base)  # named in its config, never read


def test_a_gang_node_tells_node_0s_spec_of_this_attempt_from_an_earlier_copy(tmp_path: Path) -> None:
    """A node that shares node 0's job directory finds this attempt's spec there; one that does
    not (or holds only its copy of an earlier attempt) resolves and checks its own."""
    from twinkle_core.spec import JobSpec
    from worker.spec_resolution import spec_written_for, write_spec

    spec = JobSpec.model_validate(
        {"model": {"model_id": "org/m"}, "data": {"train_file": "hf://datasets/o/d"}}
    )
    assert not spec_written_for(tmp_path, 1)
    write_spec(spec, tmp_path, 1)
    assert spec_written_for(tmp_path, 1) and not spec_written_for(tmp_path, 2)
    write_spec(spec, tmp_path, 2)
    assert spec_written_for(tmp_path, 2)
    assert JobSpec.load(tmp_path / "spec.json").model.model_id == "org/m"
