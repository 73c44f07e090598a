"""The OpenAI-compatible endpoints, driven by the official `openai` Python package.

The client talks to the real app (SQLite and PostgreSQL) through FastAPI's TestClient, which is an
httpx.Client, so every request goes through routing, auth and the database as over the network.
"""

from __future__ import annotations

import io
import json
import time

import openai
import pytest
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api

from jobcore.db.models import Job


@pytest.fixture()
def oa(api: Api) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=BOOTSTRAP, http_client=api.client, max_retries=0
    )


def _upload(oa: openai.OpenAI, rows: int = 4) -> str:
    content = "".join(json.dumps({"prompt": f"q{i}", "completion": f" a{i}"}) + "\n" for i in range(rows))
    uploaded = oa.files.create(file=("train.jsonl", io.BytesIO(content.encode())), purpose="fine-tune")
    assert uploaded.object == "file" and uploaded.bytes == len(content) and uploaded.filename == "train.jsonl"
    return uploaded.id


def test_openai_client_full_session(api: Api, oa: openai.OpenAI) -> None:
    file_id = _upload(oa, rows=16)
    job = oa.fine_tuning.jobs.create(
        model="org/tiny-llama",
        training_file=file_id,
        hyperparameters={"n_epochs": 2, "learning_rate_multiplier": 5},
        suffix="my-run",
        seed=7,
        metadata={"team": "nlp"},
    )
    assert job.object == "fine_tuning.job" and job.status == "queued"
    assert job.hyperparameters.n_epochs == 2
    assert job.hyperparameters.batch_size == 8  # "auto", resolved and recorded
    assert job.hyperparameters.learning_rate_multiplier == pytest.approx(5)
    assert job.seed == 7 and job.training_file == file_id and job.metadata == {"team": "nlp"}
    assert api.dispatched == [job.id]

    # The same job through the native API: one store, the spec carries the resolved values.
    native = api.client.get(f"/v1/jobs/{job.id}", headers=api.admin).json()
    assert native["name"] == "my-run"
    assert native["spec"]["training"]["num_epochs"] == 2 and native["spec"]["training"]["seed"] == 7
    assert native["spec"]["optimizer"]["lr"] == pytest.approx(5e-5)

    listed = oa.fine_tuning.jobs.list(limit=10)
    assert [j.id for j in listed.data] == [job.id]
    assert oa.fine_tuning.jobs.retrieve(job.id).user_provided_suffix == "my-run"

    # A worker ran a few steps and saved a checkpoint (rows as the worker writes them).
    api.force_status(job.id, "running", step=2, total_steps=4)
    api.add_event(job.id, "step 2: loss=1.5", type_="metrics", data={"type": "step", "step": 2, "loss": 1.5})
    api.add_event(job.id, "eval at step 2: eval_loss=1.75", "metrics", data={"step": 2, "eval_loss": 1.75})
    ckpt = api.add_checkpoint(job.id, 2)
    assert oa.fine_tuning.jobs.retrieve(job.id).status == "running"

    events = oa.fine_tuning.jobs.list_events(job.id, limit=50)
    assert all(e.object == "fine_tuning.job.event" for e in events.data)
    ids = [int(e.id.removeprefix("ftevent-")) for e in events.data]
    assert ids == sorted(ids, reverse=True)  # newest first, as OpenAI lists them
    assert {"message", "metrics"} >= {e.type for e in events.data}
    # Metrics under OpenAI's names: a step's loss as train_loss, an evaluation's as valid_loss.
    evaluated, stepped = (e.data for e in events.data if e.type == "metrics")
    assert (evaluated["valid_loss"], stepped["train_loss"]) == (1.75, 1.5)
    assert "train_loss" not in evaluated and "valid_loss" not in stepped

    checkpoints = oa.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.id for c in checkpoints.data] == [ckpt["id"]]
    assert checkpoints.data[0].step_number == 2
    assert checkpoints.data[0].fine_tuned_model_checkpoint == f"{job.id}:ckpt-2"  # callable as a model
    assert checkpoints.data[0].metrics.train_loss == pytest.approx(0.5)

    cancelled = oa.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "running"  # cancelling: the worker still has to stop the processes
    with api.session() as session:
        assert session.get(Job, job.id).status == "cancelling"  # type: ignore[union-attr]


def test_cancel_queued_and_pause_resume(oa: openai.OpenAI) -> None:
    file_id = _upload(oa)
    job = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id)
    assert job.hyperparameters.n_epochs == 3 and job.hyperparameters.learning_rate_multiplier == 1
    paused = oa.fine_tuning.jobs.pause(job.id)
    assert paused.status == "paused"
    assert oa.fine_tuning.jobs.resume(job.id).status == "queued"
    assert oa.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    with pytest.raises(openai.ConflictError) as exc:
        oa.fine_tuning.jobs.cancel(job.id)
    assert "cancelled" in str(exc.value)


def test_auto_batch_size_fits_a_small_file_and_a_given_one_must(oa: openai.OpenAI) -> None:
    small = _upload(oa, rows=5)
    job = oa.fine_tuning.jobs.create(
        model="org/tiny-llama",
        training_file=small,
        extra_body={"twinkle_spec": {"resources": {"nproc_per_node": 2}}},
    )
    assert job.hyperparameters.batch_size == 4  # the largest multiple of the 2 ranks within 5 rows
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=small, hyperparameters={"batch_size": 6}
        )
    error = exc.value.body
    assert error["param"] == "hyperparameters.batch_size"  # type: ignore[index]
    assert error["message"] == (  # type: ignore[index]
        f"hyperparameters.batch_size (6) is larger than the 5 rows of training_file ({small}): "
        "not one full batch"
    )


def test_a_union_fields_error_names_the_field_not_pydantics_member(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=_upload(oa), hyperparameters={"n_epochs": "lots"}
        )
    error = exc.value.body
    assert error["param"] == "hyperparameters.n_epochs"  # type: ignore[index]
    assert ".int" not in error["message"] and "literal" not in error["message"]  # type: ignore[index]


def test_twinkle_spec_rides_along_and_errors_name_openai_fields(oa: openai.OpenAI) -> None:
    file_id = _upload(oa, rows=16)
    job = oa.fine_tuning.jobs.create(
        model="org/tiny-llama",
        training_file=file_id,
        extra_body={"twinkle_spec": {"training": {"max_steps": 5}, "resources": {"nproc_per_node": 2}}},
    )
    native = job.twinkle_job  # type: ignore[attr-defined]
    assert native["spec"]["training"]["max_steps"] == 5
    assert job.hyperparameters.n_epochs == "auto"  # max_steps sets the length, not the default 1 epoch
    assert native["spec"]["training"]["batch_size"] == 8  # auto, a multiple of the 2 ranks

    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file="file-doesnotexist")
    assert exc.value.body["param"] == "training_file"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama",
            training_file=file_id,
            extra_body={"twinkle_spec": {"model": {"strategy": "x"}}},
        )
    assert exc.value.body["param"] == "twinkle_spec.model.strategy"  # type: ignore[index]

    # An unknown key: the field meant, inside twinkle_spec where the user wrote it.
    for wrong, meant in (
        ("max_step", "twinkle_spec.training.max_steps"),
        ("lr", "twinkle_spec.optimizer.lr"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            oa.fine_tuning.jobs.create(
                model="org/tiny-llama",
                training_file=file_id,
                extra_body={"twinkle_spec": {"training": {wrong: 4}}},
            )
        assert exc.value.body["param"] == f"twinkle_spec.training.{wrong}"  # type: ignore[index]
        assert exc.value.body["message"].endswith(f"(did you mean '{meant}'?)")  # type: ignore[index]

    with pytest.raises(openai.BadRequestError):
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=file_id, hyperparameters={"n_epochs": 0}
        )


def test_other_projects_jobs_are_invisible(api: Api, oa: openai.OpenAI) -> None:
    job = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=_upload(oa))
    other_token = api.token("other")["Authorization"].removeprefix("Bearer ")
    other = openai.OpenAI(
        base_url="http://testserver/v1", api_key=other_token, http_client=api.client, max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(job.id)
    assert other.fine_tuning.jobs.list().data == []


def test_files_through_the_openai_client(oa: openai.OpenAI) -> None:
    rows = [json.dumps({"text": f"line {i}"}) + "\n" for i in range(3)]
    first = oa.files.create(file=("a.jsonl", io.BytesIO("".join(rows).encode())), purpose="fine-tune")
    second = oa.files.create(file=("b.jsonl", io.BytesIO(rows[0].encode())), purpose="fine-tune")
    # Shaped as OpenAI's FileObject: Unix seconds and a status, with our own fields beside them.
    assert isinstance(first.created_at, int) and abs(first.created_at - time.time()) < 300
    assert first.status == "processed" and first.purpose == "fine-tune"
    assert first.rows == 3 and first.format == "jsonl"  # type: ignore[attr-defined]

    assert [f.id for f in oa.files.list().data] == [second.id, first.id]  # newest first
    # The SDK's auto-pagination follows our cursors (after = the last id of a page).
    assert [f.id for f in oa.files.list(limit=1)] == [second.id, first.id]

    got = oa.files.retrieve(first.id)
    assert (got.filename, got.bytes, got.created_at) == ("a.jsonl", first.bytes, first.created_at)
    assert oa.files.content(first.id).read() == "".join(rows).encode()

    deleted = oa.files.delete(first.id)
    assert deleted.deleted is True and deleted.id == first.id and deleted.object == "file"
    with pytest.raises(openai.NotFoundError):
        oa.files.retrieve(first.id)
    assert [f.id for f in oa.files.list().data] == [second.id]


@pytest.mark.parametrize(
    ("twinkle_spec", "param"),
    [
        ({"resources": {"nproc_per_node": 0}}, "twinkle_spec.resources.nproc_per_node"),
        ({"resources": {"nnodes": "x"}}, "twinkle_spec.resources.nnodes"),
        ({"resources": {"nnodes": None}}, "twinkle_spec.resources.nnodes"),
        ({"resources": [1]}, "twinkle_spec.resources"),
        ({"model": "x"}, "twinkle_spec.model"),
        ({"data": "x"}, "twinkle_spec.data"),
        ({"training": "x"}, "twinkle_spec.training"),
        ({"optimizer": "x"}, "twinkle_spec.optimizer"),
    ],
)
def test_a_twinkle_spec_section_of_the_wrong_shape_is_a_400_naming_it(
    api: Api, oa: openai.OpenAI, twinkle_spec: dict[str, object], param: str
) -> None:
    file_id = _upload(oa)
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama",
            training_file=file_id,
            hyperparameters={"learning_rate_multiplier": 2.0},  # merged into twinkle_spec.optimizer
            extra_body={"twinkle_spec": twinkle_spec},
        )
    assert exc.value.body["param"] == param  # type: ignore[index]
    with api.session() as session:
        assert session.query(Job).count() == 0


def test_a_seed_over_32_bits_is_refused(oa: openai.OpenAI) -> None:
    file_id = _upload(oa)
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id, seed=2**32)
    assert exc.value.body["param"] == "seed"  # type: ignore[index]
    job = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id, seed=2**32 - 1)
    assert job.seed == 2**32 - 1


def test_n_epochs_and_max_steps_together_are_a_400_not_one_dropped(api: Api, oa: openai.OpenAI) -> None:
    file_id = _upload(oa)
    length = {"twinkle_spec": {"training": {"max_steps": 3}}}
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=file_id, hyperparameters={"n_epochs": 1}, extra_body=length
        )
    assert exc.value.body["param"] == "hyperparameters.n_epochs"  # type: ignore[index]
    assert "max_steps" in exc.value.body["message"]  # type: ignore[index]
    method = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=file_id, method=method, extra_body=length
        )  # type: ignore[arg-type]
    assert exc.value.body["param"] == "method.supervised.hyperparameters.n_epochs"  # type: ignore[index]
    assert exc.value.body["message"].startswith("method.supervised.hyperparameters.n_epochs and")  # type: ignore[index]
    with api.session() as session:
        assert session.query(Job).count() == 0
    # Either one alone sets the length.
    by_steps = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id, extra_body=length)
    assert by_steps.twinkle_job["spec"]["training"]["max_steps"] == 3  # type: ignore[attr-defined]
    by_epochs = oa.fine_tuning.jobs.create(
        model="org/tiny-llama", training_file=file_id, hyperparameters={"n_epochs": 1}
    )
    assert by_epochs.hyperparameters.n_epochs == 1


def test_jobs_list_filters_by_metadata_and_takes_any_page_size(oa: openai.OpenAI) -> None:
    file_id = _upload(oa)
    tagged = {
        team: oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=file_id, metadata={"team": team, "run": "a"}
        ).id
        for team in ("nlp", "vision")
    }
    untagged = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id).id
    # The openai package sends `metadata={...}` as metadata[key]=value pairs; every pair must hold.
    assert [j.id for j in oa.fine_tuning.jobs.list(metadata={"team": "nlp"})] == [tagged["nlp"]]
    assert [j.id for j in oa.fine_tuning.jobs.list(metadata={"team": "nlp", "run": "b"})] == []
    assert {j.id for j in oa.fine_tuning.jobs.list(metadata={"run": "a"})} == set(tagged.values())
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.list(extra_query={"metadata[bad key]": "x"})
    assert exc.value.body["param"] == "metadata"  # type: ignore[index]
    # OpenAI's lists take page sizes far above ours: a page is capped, not refused.
    page = oa.fine_tuning.jobs.list(limit=10_000)
    assert [j.id for j in page.data][-1] == tagged["nlp"] and untagged in {j.id for j in page.data}
    assert oa.fine_tuning.jobs.list_events(untagged, limit=5_000).data
    assert oa.fine_tuning.jobs.checkpoints.list(untagged, limit=5_000).data == []
    with pytest.raises(openai.BadRequestError):
        oa.fine_tuning.jobs.list(limit=0)


def test_hyperparameters_given_twice_must_agree_and_other_methods_are_refused_by_name(
    api: Api, oa: openai.OpenAI
) -> None:
    file_id = _upload(oa)
    method = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    with pytest.raises(openai.BadRequestError) as exc:
        oa.fine_tuning.jobs.create(
            model="org/tiny-llama", training_file=file_id, hyperparameters={"n_epochs": 1}, method=method
        )  # type: ignore[arg-type]
    assert exc.value.body["param"] == "hyperparameters.n_epochs"  # type: ignore[index]
    with api.session() as session:
        assert session.query(Job).count() == 0
    # Agreeing, or each giving other fields: one set of hyperparameters.
    job = oa.fine_tuning.jobs.create(
        model="org/tiny-llama",
        training_file=file_id,
        hyperparameters={"n_epochs": 2, "batch_size": 4},
        method=method,  # type: ignore[arg-type]
    )
    assert (job.hyperparameters.n_epochs, job.hyperparameters.batch_size) == (2, 4)
    for kind in ("dpo", "reinforcement"):
        with pytest.raises(openai.BadRequestError) as exc:
            oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id, method={"type": kind})  # type: ignore[arg-type]
        assert exc.value.body["param"] == "method.type"  # type: ignore[index]
        assert f"'{kind}' is not supported" in exc.value.body["message"]  # type: ignore[index]


def test_deleting_a_fine_tuned_model_deletes_its_job(api: Api, oa: openai.OpenAI) -> None:
    file_id = _upload(oa)
    job = oa.fine_tuning.jobs.create(model="org/tiny-llama", training_file=file_id, suffix="gone")
    api.force_status(job.id, "succeeded")
    api.add_checkpoint(job.id, 2)
    model = oa.fine_tuning.jobs.retrieve(job.id).fine_tuned_model
    assert model is not None
    for other in (f"{job.id}:ckpt-2", "org/tiny-llama"):  # a checkpoint, a base model: not deleted
        with pytest.raises(openai.BadRequestError) as exc:
            oa.models.delete(other)
        assert exc.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        oa.models.delete("ft:tiny-llama:job-doesnotexist")

    deleted = oa.models.delete(model)
    assert (deleted.id, deleted.deleted) == (model, True)
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve(model)
    with pytest.raises(openai.NotFoundError):
        oa.fine_tuning.jobs.retrieve(job.id)  # the model lived in its job
    assert model not in {m.id for m in oa.models.list()}
