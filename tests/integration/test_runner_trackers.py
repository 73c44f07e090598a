"""The runner's experiment trackers on a real tiny job: the same metrics as progress.jsonl, read
back with tensorboard's and mlflow's own readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dist_scripts.launch import torchrun
from test_train_runner import events, write_job

from twinkle_core import trackers
from twinkle_core.assets import write_text_dataset

REPORT_TO = ["tensorboard", "mlflow"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tracker-data")
    write_text_dataset(directory / "train.jsonl", n=32)
    write_text_dataset(directory / "val.jsonl", n=8, seed=3)
    return directory


def test_two_rank_job_reports_its_metrics_to_tensorboard_and_mlflow(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = write_job(
        tmp_path / "job",
        tiny_model_dir,
        data_dir,
        training={"max_steps": 4, "save_every": None, "eval_every": 2, "report_to": REPORT_TO},
    )
    proc = torchrun(["-m", "twinkle_core.train", str(spec)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = events(spec.parent)
    steps = [e for e in log if e["event"] == "step"]
    evals = [e for e in log if e["event"] == "eval"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4] and [e["step"] for e in evals] == [2, 4]

    # TensorBoard: one event file (rank 0 alone writes), float32 values equal to the job's.
    board = spec.parent / "tensorboard"
    assert len(list(board.glob("events.out.tfevents.*"))) == 1
    reader = EventAccumulator(str(board))
    reader.Reload()
    for tag, records, key in (
        ("train/loss", steps, "loss"),
        ("train/lr", steps, "lr"),
        ("train/grad_norm", steps, "grad_norm"),
        ("eval/loss", evals, "eval_loss"),
    ):
        scalars = reader.Scalars(tag)
        assert [s.step for s in scalars] == [e["step"] for e in records], tag
        assert [np.float32(s.value) for s in scalars] == [np.float32(e[key]) for e in records], tag
    assert [s.step for s in reader.Scalars("train/tokens_per_second")] == [1, 2, 3, 4]

    # MLflow: the default store in the job dir, one finished run named after the job, same values.
    client = MlflowClient(tracking_uri=f"sqlite:///{spec.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("twinkle-jobs")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "job"
    assert run.data.params["training.max_steps"] == "4"
    for name, records, key in (("train/loss", steps, "loss"), ("eval/loss", evals, "eval_loss")):
        history = client.get_metric_history(run.info.run_id, name)
        assert [(m.step, m.value) for m in history] == [(e["step"], e[key]) for e in records], name


def test_a_tracker_library_missing_on_the_worker_fails_the_job_as_a_user_error(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, run_main: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(trackers.LIBRARIES, "wandb", ("wandb", "twinkle_no_such_module"))
    spec = write_job(
        tmp_path / "job",
        tiny_model_dir,
        data_dir,
        training={"max_steps": 1, "report_to": ["tensorboard", "wandb"]},
        resources={"nproc_per_node": 1},
    )
    assert run_main([str(spec)]) == 2
    error = events(spec.parent)[-1]
    assert error["event"] == "error" and error["kind"] == "user"
    assert "training.report_to[1]" in error["message"] and "'wandb'" in error["message"]
    assert not (spec.parent / "tensorboard").exists()  # refused before anything was opened
