"""What the API checks about a spec's integrations: tracker libraries and hub dataset ids."""

from __future__ import annotations

import pytest
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from twinkle_core import trackers


def _post(api: Api, **training: object) -> tuple[int, dict[str, object]]:
    body = spec_body()
    body["spec"]["training"] = training
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    return response.status_code, response.json()


def test_installed_trackers_are_accepted_and_stored(api: Api) -> None:
    status, job = _post(api, report_to=["tensorboard", "mlflow", "wandb"])
    assert status == 201, job
    assert job["spec"]["training"]["report_to"] == ["tensorboard", "mlflow", "wandb"]  # type: ignore[index]
    status, job = _post(api)
    assert status == 201 and job["spec"]["training"]["report_to"] == []  # type: ignore[index]


def test_a_tracker_missing_on_the_server_is_422_naming_its_index(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(trackers.LIBRARIES, "mlflow", ("mlflow-skinny", "twinkle_no_such_module"))
    status, body = _post(api, report_to=["tensorboard", "mlflow"])
    assert status == 422, body
    error = body["error"]
    assert error["param"] == "spec.training.report_to[1]"  # type: ignore[index]
    assert "'mlflow-skinny'" in error["message"]  # type: ignore[index]


def test_unknown_and_repeated_trackers_are_422(api: Api) -> None:
    status, body = _post(api, report_to=["comet"])
    assert status == 422 and body["error"]["param"].startswith("spec.training.report_to")  # type: ignore[index]
    status, body = _post(api, report_to=["wandb", "wandb"])
    assert status == 422 and "repeated: wandb" in body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize("field", ["train_file", "validation_file"])
def test_hub_datasets_are_accepted_in_the_hf_datasets_form_only(api: Api, field: str) -> None:
    body = spec_body()
    body["spec"]["data"].update(
        {field: "hf://datasets/org-1/qa.v2", "columns": {"prompt": "question", "completion": "answer"}}
    )
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["data"]["columns"] == {"prompt": "question", "completion": "answer"}
    del body["spec"]["data"]["columns"]
    for value in (
        "org/qa",  # a bare id names a model; the runner could not read it as data
        "hf://org/qa",
        "ms://org/qa",
        "hf://datasets/org",
        "hf://datasets/org/qa/extra",
        "hf://datasets/../qa",
        "hf://datasets/org/qa?revision=x",
    ):
        body["spec"]["data"][field] = value
        response = api.client.post("/v1/jobs", json=body, headers=api.admin)
        assert response.status_code == 422, (value, response.text)
        error = response.json()["error"]
        assert error["param"] == f"spec.data.{field}" and "hf://datasets/org/name" in error["message"], value


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train_file": "/data/train.jsonl", "split": "train"}, "data.split applies to a hub dataset"),
        ({"columns": {"prompt": "q"}, "train_file": "/data/train.jsonl"}, "data.columns applies"),
        ({"columns": {"question": "q"}}, "messages"),
        ({"split": "train; rm -rf /"}, "pattern"),
    ],
)
def test_hub_dataset_settings_are_checked_at_submit(api: Api, data: dict[str, object], message: str) -> None:
    body = spec_body()
    body["spec"]["data"].update(data)
    response = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"].startswith("spec.data") and message in error["message"], error
