"""twinkle_core.trackers: each tracker through its library's own API, and what a missing library does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from twinkle_core import trackers
from twinkle_core.spec import JobSpec

METRICS = [(1, {"train/loss": 2.5, "train/lr": 1e-3}), (2, {"train/loss": 2.25, "train/lr": 5e-4})]


def _spec(**training: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"model": {"model_id": "/m"}, "data": {"train_file": "/d.jsonl"}, "training": training}
    )


def test_report_to_is_empty_by_default_and_names_known_trackers_once() -> None:
    assert _spec().training.report_to == []
    assert _spec(report_to=["tensorboard", "mlflow", "wandb"]).training.report_to == list(trackers.TRACKERS)
    with pytest.raises(ValidationError, match=r"training\.report_to\.0"):
        _spec(report_to=["comet"])
    with pytest.raises(ValidationError, match="repeated: mlflow"):
        _spec(report_to=["mlflow", "tensorboard", "mlflow"])


def test_a_missing_library_is_named_with_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test group installs every tracker library.
    assert all(trackers.missing_library(name) is None for name in trackers.TRACKERS)
    monkeypatch.setitem(trackers.LIBRARIES, "mlflow", ("mlflow-skinny", "twinkle_no_such_module"))
    problem = trackers.missing_library("mlflow")
    assert problem is not None and "'mlflow-skinny'" in problem
    with pytest.raises(ValueError, match=r"^training\.report_to\[1\]: the tracker 'mlflow' needs"):
        trackers.check_available(["tensorboard", "mlflow"])


def test_importing_the_module_loads_no_tracker_library() -> None:
    code = (
        "import sys, twinkle_core.trackers, twinkle_core.spec, twinkle_core.train\n"
        "names = ('tensorboard', 'mlflow', 'wandb', 'torch.utils.tensorboard')\n"
        "loaded = [m for m in names if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    opened = trackers.open_trackers(["tensorboard"], tmp_path, "job-1")
    for step, metrics in METRICS:
        opened.log_metrics(step, metrics)
    opened.close()
    reader = EventAccumulator(str(tmp_path / "tensorboard"))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("train/loss")] == [(1, 2.5), (2, 2.25)]


def test_mlflow_run_is_one_per_job_and_continued_by_a_resumed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    first = trackers.open_trackers(["mlflow"], tmp_path, "job-1", config={"training": {"max_steps": 4}})
    first.log_metrics(*METRICS[0])
    first.close("killed")
    second = trackers.open_trackers(["mlflow"], tmp_path, "job-1")
    second.log_metrics(*METRICS[1])
    second.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("twinkle-jobs")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "job-1" and run.info.status == "FINISHED"
    assert run.data.params["training.max_steps"] == "4"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.5), (2, 2.25)]


def test_wandb_runs_offline_under_the_job_dir_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = trackers.WandbTracker(tmp_path, "job/1", config={"training": {"max_steps": 4}})
    run = tracker.run
    assert run.offline and run.id == "job-1" and run.name == "job/1"
    assert Path(run.dir).is_relative_to(tmp_path / "wandb")
    assert run.config["training"] == {"max_steps": 4}
    for step, metrics in [*METRICS, (3, {"train/loss": 2.0})]:
        tracker.log_metrics(step, metrics)
    # A step's row is committed when the next step begins: step 2's values are the summary now.
    assert run.summary["train/loss"] == 2.25 and run.summary["_step"] == 2
    tracker.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*-job-1")
    (log,) = offline.glob("run-job-1.wandb")
    assert log.stat().st_size > 0


def test_a_tracker_that_fails_is_dropped_and_the_rest_keep_logging() -> None:
    class Broken:
        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            raise ConnectionError("tracking server down")

        def close(self, status: str = "finished") -> None:
            raise AssertionError("a dropped tracker is not closed")

    class Kept:
        def __init__(self) -> None:
            self.seen: list[tuple[int, dict[str, float]]] = []
            self.status: str | None = None

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            self.seen.append((step, metrics))

        def close(self, status: str = "finished") -> None:
            self.status = status

    kept = Kept()
    opened = trackers.Trackers({"broken": Broken(), "kept": kept})
    for step, metrics in METRICS:
        opened.log_metrics(step, metrics)
    opened.close("failed")
    assert kept.seen == METRICS and kept.status == "failed"
