"""Experiment trackers: rank 0 of the runner writes its metrics through each library's own API.

`training.report_to` names them (`tensorboard`, `mlflow`, `wandb`). Each tracker is a small class
with `log_metrics(step, metrics)` and `close(status)`; the libraries are imported when a tracker
is opened, never at import time, so this module stays light (the API server and the spec import
it for the names and for `missing_library`) and a job without trackers never loads them.

- TensorBoard: event files in `<job_dir>/tensorboard/` (`torch.utils.tensorboard.SummaryWriter`,
  which needs the `tensorboard` package). A resumed attempt purges the steps after its checkpoint,
  so the curves show the run that counts.
- MLflow: to `MLFLOW_TRACKING_URI`; unset, a SQLite store in the job directory
  (`sqlite:///<job_dir>/mlflow.db`: MLflow 3 refuses its old `./mlruns` file store unless told
  otherwise). Experiment `MLFLOW_EXPERIMENT_NAME` (default `twinkle-jobs`), one run per job,
  named by the job id and continued by a resumed attempt.
- W&B: project `WANDB_PROJECT` (default `twinkle-jobs`), run id and name from the job id, files
  under the job directory; offline (`<job_dir>/wandb/offline-run-*`, `wandb sync` uploads it)
  unless `WANDB_API_KEY` is set.

Metric names: `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_second` at each
logged step, `eval/loss` at each evaluation, the same values as the `step`/`eval` records of
progress.jsonl.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

logger = logging.getLogger(__name__)

TrackerName = Literal["tensorboard", "mlflow", "wandb"]
TRACKERS: tuple[str, ...] = get_args(TrackerName)
# The package each tracker needs, as pip installs it, and the module that proves it is there.
LIBRARIES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow-skinny", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DB = "mlflow.db"
WANDB_DIR = "wandb"
# What each tracker leaves in the job directory by default (a directory or one file), which the
# API offers for download: `GET /v1/jobs/{id}/artifacts`.
JOB_DIR_OUTPUTS: dict[str, str] = {"tensorboard": TENSORBOARD_DIR, "mlflow": MLFLOW_DB, "wandb": WANDB_DIR}
DEFAULT_PROJECT = "twinkle-jobs"


def missing_library(name: str) -> str | None:
    """None when tracker `name` can run in this environment, else what is missing (a sentence)."""
    package, module = LIBRARIES[name]
    if importlib.util.find_spec(module) is not None:
        return None
    return (
        f"the tracker '{name}' needs the Python package '{package}', which is not installed "
        "(pip install 'twinkle-jobs[trackers]')"
    )


class Tracker(Protocol):
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, status: str = "finished") -> None: ...


class TensorBoardTracker:
    def __init__(self, job_dir: Path, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = job_dir / TENSORBOARD_DIR
        # purge_step: after a resume from step N, events of an earlier attempt past N are hidden.
        purge_step = start_step + 1 if start_step else None
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, status: str = "finished") -> None:
        self.writer.close()


class MLflowTracker:
    RUN_TAG = "twinkle.job_id"

    def __init__(self, job_dir: Path, job_id: str, params: dict[str, Any] | None = None) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{job_dir / MLFLOW_DB}"
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{self.RUN_TAG}` = '{job_id}'", max_results=1
        )
        if found:  # a resumed attempt continues the job's run
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=job_id, tags={self.RUN_TAG: job_id})
            self.run_id = run.info.run_id
            from mlflow.entities import Param

            items = [Param(key, value) for key, value in (params or {}).items()]
            for start in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(key, float(value), now, step) for key, value in metrics.items()]
        )

    def close(self, status: str = "finished") -> None:
        # finished, failed, or killed (stopped on request: a resumed attempt continues the run)
        self.client.set_terminated(self.run_id, status=status.upper())


class WandbTracker:
    def __init__(self, job_dir: Path, job_id: str, config: dict[str, Any] | None = None) -> None:
        import wandb

        self.run = wandb.init(
            mode="online" if os.environ.get("WANDB_API_KEY") else "offline",
            dir=str(job_dir),  # wandb writes into <dir>/wandb (WANDB_DIR)
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=job_id,
            id=re.sub(r"[^A-Za-z0-9_-]", "-", job_id)[:64],
            resume="allow",
            config=config or {},
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self, status: str = "finished") -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)


class Trackers:
    """The job's open trackers. A tracker whose logging fails is dropped with a warning: the
    metrics stay in progress.jsonl and the training goes on."""

    def __init__(self, trackers: dict[str, Tracker] | None = None) -> None:
        self.trackers: dict[str, Tracker] = dict(trackers or {})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                tracker.log_metrics(step, metrics)
            except Exception as exc:
                logger.warning("tracker %s failed at step %d and is turned off: %s", name, step, exc)
                self.trackers.pop(name)

    def close(self, status: str = "finished") -> None:
        for name, tracker in self.trackers.items():
            try:
                tracker.close(status)
            except Exception as exc:
                logger.warning("tracker %s failed to close: %s", name, exc)
        self.trackers.clear()


def check_available(names: Sequence[str], param: str = "training.report_to") -> None:
    """ValueError naming `param[i]` for the first tracker whose library is not installed here."""
    for index, name in enumerate(names):
        problem = missing_library(name)
        if problem is not None:
            raise ValueError(f"{param}[{index}]: {problem}")


def open_trackers(
    names: Sequence[str],
    job_dir: Path,
    job_id: str,
    *,
    start_step: int = 0,
    config: dict[str, Any] | None = None,
) -> Trackers:
    """Open the trackers `names` for the job in `job_dir` (call it on rank 0 only)."""
    check_available(names)
    opened: dict[str, Tracker] = {}
    try:
        for name in names:
            if name == "tensorboard":
                opened[name] = TensorBoardTracker(job_dir, start_step)
            elif name == "mlflow":
                opened[name] = MLflowTracker(job_dir, job_id, _flat_params(config or {}))
            elif name == "wandb":
                opened[name] = WandbTracker(job_dir, job_id, config)
            else:
                known = ", ".join(TRACKERS)
                raise ValueError(f"training.report_to: unknown tracker {name!r} (known: {known})")
    except BaseException:
        Trackers(opened).close("failed")
        raise
    return Trackers(opened)


def _flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested spec as MLflow params: `section.field` -> value, each at most 500 characters."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat_params(value, f"{name}."))
        else:
            flat[name] = str(value)[:500]
    return flat
