"""A LoRA job's model as the base of a new job: its adapter merged into its base, once, in the new
job's directory, before the first launch.

The merge is the `merged` export (`twinkle_core.export`), run as the exporter runs it
(`worker.exports.start_export`: a process of its own on the CPU, so the worker stays free of
torch and an OOM ends that process only). Its output
goes into the attempt's log. The folder appears whole (the export renames it into place), so a
retry or a resume finds it and trains on it without merging again, even after the LoRA job's
checkpoint is gone. While it runs, the job's heartbeat goes on and a cancel or pause stops it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from jobcore.local_paths import PathRefused, pin_local_path
from jobcore.settings import Settings
from jobcore.trained_base import TrainedBase
from twinkle_core.export import ExportRequest, public_base_name
from worker.exports import start_export

# The merged weights, in the job's directory.
MERGED_BASE_DIR = "base-model"


class Merge(Enum):
    DONE = "done"
    STOPPED = "stopped"  # the job was cancelled or paused meanwhile
    FAILED = "failed"


@dataclass(frozen=True)
class MergeResult:
    outcome: Merge
    message: str = ""
    user_error: bool = False  # the export refused its request (exit 2): retrying changes nothing


def merged_base_dir(job_dir: Path) -> Path:
    return job_dir / MERGED_BASE_DIR


def merge_request(base: TrainedBase, job_dir: Path, settings: Settings) -> ExportRequest:
    """The export that merges `base`'s adapter into its own base, in `job_dir`. The base's path is
    checked again and resolved (it is read now; a link may have changed since the LoRA job ran)."""
    adapter_of = base.adapter_of
    assert adapter_of is not None, "a LoRA job's model"
    try:
        base_model = pin_local_path(adapter_of.model_id, settings)
    except PathRefused as exc:
        raise ValueError(f"model.model_id: the base of job '{base.job_id}''s adapter: {exc}") from None
    return ExportRequest(
        checkpoint_dir=base.checkpoint,
        output_dir=str(merged_base_dir(job_dir)),
        kind="merged",
        base_model=base_model,
        base_model_name=public_base_name(adapter_of.model_id),
        model_cls=adapter_of.model_cls,
        config=adapter_of.config,
        kwargs=adapter_of.kwargs,
        job_id=base.job_id,
        step=base.step,
    )


def run_merge(
    request: ExportRequest, log_path: Path, still_wanted: Callable[[], bool], poll_seconds: float
) -> MergeResult:
    """Merge unless the folder is there already. `still_wanted` is asked every `poll_seconds` (it
    beats the job's heartbeat): False stops the merge."""
    target = Path(request.output_dir)
    if target.is_dir():
        return MergeResult(Merge.DONE)
    request_file = target.parent / f".{target.name}.request.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    request.write(request_file)
    try:
        with open(log_path, "ab") as log:
            what = f"the LoRA adapter of job {request.job_id} (step {request.step})"
            log.write(f"merging {what} into its base\n".encode())
            log.flush()
            proc = start_export(request_file, log)
            while True:
                try:
                    code = proc.wait(poll_seconds)
                    break
                except subprocess.TimeoutExpired:
                    if not still_wanted():
                        proc.kill()  # a session of its own, and no children
                        proc.wait()
                        return MergeResult(Merge.STOPPED)
    finally:
        request_file.unlink(missing_ok=True)
    if code == 0 and target.is_dir():
        return MergeResult(Merge.DONE)
    return MergeResult(
        Merge.FAILED,
        f"merging the adapter of job '{request.job_id}' (step {request.step}) into its base failed "
        f"with exit code {code}: see the attempt's log",
        user_error=code == 2,
    )
