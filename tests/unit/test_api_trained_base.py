"""Training on from a fine-tuned model: `spec.model.model_id` names a job's model or checkpoint
(`ft:...`, `JOB:ckpt-STEP`) of the caller's project. The server checks the name at creation and
keeps it in the spec; the worker resolves it to the checkpoint's directory at launch."""

from __future__ import annotations

from typing import Any

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.models import Checkpoint, Job
from worker.spec_resolution import resolve_spec


def trained(api: Api, **overrides: Any) -> tuple[dict[str, Any], str]:
    """A succeeded full fine-tune with checkpoints at steps 2 and 4, and its model's name."""
    job = api.submit(name="support bot", **overrides)
    api.force_status(job["id"], "succeeded")
    api.add_checkpoint(job["id"], 2)
    api.add_checkpoint(job["id"], 4)
    name = api.client.get(f"/v1/jobs/{job['id']}", headers=api.admin).json()["fine_tuned_model"]
    return job, name


def on_top_of(api: Api, model_id: str, headers: dict[str, str] | None = None, **spec: Any) -> Any:
    body = spec_body(name="round two")
    body["spec"]["model"]["model_id"] = model_id
    body["spec"].update(spec)
    return api.client.post("/v1/jobs", json=body, headers=headers or api.admin)


def test_a_fine_tuned_model_is_a_base_by_name_and_the_worker_gets_its_checkpoint(api: Api) -> None:
    source, name = trained(api)
    for model_id, step in ((name, 4), (f"{source['id']}:ckpt-2", 2)):
        answer = on_top_of(api, model_id)
        assert answer.status_code == 201, answer.text
        job = answer.json()
        assert job["spec"]["model"]["model_id"] == model_id  # the spec says what it trained on
        with api.session() as session:
            row = session.get(Job, job["id"])
            assert row is not None
            launched = resolve_spec(session, row, api.settings).spec
        expected = api.settings.jobs_dir / source["id"] / "checkpoints" / f"step-{step}"
        assert launched.model.model_id == str(expected)
    # Its own model is named after the first base, not after the name it was given.
    second = on_top_of(api, name).json()
    api.force_status(second["id"], "succeeded")
    api.add_checkpoint(second["id"], 1)
    renamed = api.client.get(f"/v1/jobs/{second['id']}", headers=api.admin).json()["fine_tuned_model"]
    assert renamed == f"ft:tiny-llama:round-two:{second['id']}"


def _refusal(answer: Any) -> str:
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == "spec.model.model_id"
    return str(error["message"])


def test_names_that_lead_to_no_trainable_weights_are_422_saying_why(api: Api) -> None:
    source, name = trained(api)
    assert "no job" in _refusal(on_top_of(api, name, headers=api.token("team-b")))  # another project
    assert "is not the name of job" in _refusal(on_top_of(api, name.replace("tiny-llama", "other")))
    assert "no complete checkpoint at step 3" in _refusal(on_top_of(api, f"{source['id']}:ckpt-3"))
    assert "LoRA adapter on a fine-tuned" in _refusal(on_top_of(api, name, adapter={"r": 4}))

    running = api.submit(name="still going")
    api.force_status(running["id"], "running")
    api.add_checkpoint(running["id"], 1)
    running_name = api.client.get(f"/v1/jobs/{running['id']}", headers=api.admin).json()
    assert "is running" in _refusal(on_top_of(api, f"ft:tiny-llama:still-going:{running['id']}"))
    assert on_top_of(api, f"{running['id']}:ckpt-1").status_code == 201  # a checkpoint is there
    assert running_name["fine_tuned_model"] is None

    _, lora_name = trained(api, spec={**spec_body()["spec"], "adapter": {"r": 4}})
    assert "LoRA adapter on a fine-tuned" in _refusal(on_top_of(api, lora_name, adapter={"r": 4}))
    from_config = {"config": {"model_type": "llama", "hidden_size": 64}, "tokenizer_id": "org/tokenizer"}
    _, random_base = trained(api, spec={**spec_body()["spec"], "model": from_config, "adapter": {"r": 4}})
    assert "no base weights to merge it into" in _refusal(on_top_of(api, random_base))


def test_a_lora_jobs_model_is_a_base_merged_in_the_new_jobs_directory(api: Api) -> None:
    """The worker merges the LoRA job's adapter into that job's own base before the launch
    (worker.base_merge); the spec names the merged folder, and the merge what to merge."""
    lora_spec = {**spec_body()["spec"], "adapter": {"r": 4}}
    lora_spec["model"] = {**lora_spec["model"], "config": {"rope_theta": 10000.0}}
    source, lora_name = trained(api, spec=lora_spec)
    answer = on_top_of(api, lora_name)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    with api.session() as session:
        row = session.get(Job, job["id"])
        assert row is not None
        resolved = resolve_spec(session, row, api.settings)
    merge = resolved.base_merge
    assert merge is not None and merge.kind == "merged"
    assert (
        resolved.spec.model.model_id
        == merge.output_dir
        == str(api.settings.jobs_dir / job["id"] / "base-model")
    )
    assert merge.checkpoint_dir == str(api.settings.jobs_dir / source["id"] / "checkpoints" / "step-4")
    assert (merge.base_model, merge.job_id, merge.step) == ("org/tiny-llama", source["id"], 4)
    assert merge.config == {"rope_theta": 10000.0}  # the base as the LoRA job built it
    # A full fine-tune's model needs no merge.
    _, full_name = trained(api)
    with api.session() as session:
        row = session.get(Job, on_top_of(api, full_name).json()["id"])
        assert row is not None
        assert resolve_spec(session, row, api.settings).base_merge is None


def test_a_source_gone_before_launch_fails_the_job_naming_the_field(api: Api) -> None:
    source, name = trained(api)
    job = on_top_of(api, name).json()
    with api.session() as session, session.begin():
        for checkpoint in session.query(Checkpoint).filter_by(job_id=source["id"]):
            checkpoint.deleted = True
    with api.session() as session:
        row = session.get(Job, job["id"])
        assert row is not None
        with pytest.raises(ValueError, match=r"model\.model_id: job .* has no complete checkpoint left"):
            resolve_spec(session, row, api.settings)


def test_the_fine_tuning_api_takes_a_fine_tuned_model_as_its_base(api: Api) -> None:
    _, name = trained(api)
    upload = api.client.post(
        "/v1/files",
        files={"file": ("d.jsonl", b'{"text": "a"}\n')},
        data={"purpose": "fine-tune"},
        headers=api.admin,
    )
    assert upload.status_code == 201, upload.text
    body = {"model": name, "training_file": upload.json()["id"]}
    created = api.client.post("/v1/fine_tuning/jobs", json=body, headers=api.admin)
    assert created.status_code == 200, created.text
    assert created.json()["model"] == name
    refused = api.client.post("/v1/fine_tuning/jobs", json={**body, "model": f"{name}x"}, headers=api.admin)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"


def test_a_job_others_still_train_from_is_not_deleted(api: Api) -> None:
    source, name = trained(api)
    follower = on_top_of(api, name).json()  # queued
    refused = api.client.delete(f"/v1/jobs/{source['id']}", headers=api.admin)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "model_in_use" and follower["id"] in refused.text
    api.force_status(follower["id"], "paused")  # a resume loads the base again
    assert api.client.delete(f"/v1/jobs/{source['id']}", headers=api.admin).status_code == 409
    api.force_status(follower["id"], "cancelled")
    assert api.client.delete(f"/v1/jobs/{source['id']}", headers=api.admin).status_code == 200
