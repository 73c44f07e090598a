"""The merge of a LoRA job's adapter into its base before a job that trains on from it launches:
once, stoppable, and a failure that says whether a retry could help. (The merge itself, through a
real worker: tests/integration/test_cli_ci.py.)"""

from __future__ import annotations

from pathlib import Path

from twinkle_core.export import ExportRequest
from worker.base_merge import Merge, merged_base_dir, run_merge


def request(tmp_path: Path, checkpoint: Path) -> ExportRequest:
    return ExportRequest(
        checkpoint_dir=str(checkpoint),
        output_dir=str(merged_base_dir(tmp_path / "job")),
        kind="merged",
        base_model="org/tiny-llama",
        job_id="job-lora",
        step=2,
    )


def test_a_merged_folder_is_there_already_so_nothing_runs(tmp_path: Path) -> None:
    asked = request(tmp_path, tmp_path / "no-such-checkpoint")
    Path(asked.output_dir).mkdir(parents=True)
    result = run_merge(asked, tmp_path / "attempt-1.log", lambda: False, poll_seconds=0.01)
    assert result.outcome is Merge.DONE
    assert not (tmp_path / "attempt-1.log").exists()


def test_a_refused_merge_is_a_user_error_with_its_reason_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "attempt-1.log"
    result = run_merge(request(tmp_path, tmp_path / "no-such-checkpoint"), log, lambda: True, poll_seconds=5)
    assert result.outcome is Merge.FAILED and result.user_error
    assert "job 'job-lora' (step 2)" in result.message and "exit code 2" in result.message
    text = log.read_text()
    assert text.startswith("merging the LoRA adapter of job job-lora (step 2) into its base\n")
    assert "export failed:" in text
    assert not list((tmp_path / "job").glob(".*request.json"))  # the request file is cleaned up


def test_a_job_stopped_meanwhile_stops_the_merge(tmp_path: Path) -> None:
    asks: list[bool] = []

    def still_wanted() -> bool:
        asks.append(False)
        return False

    asked = request(tmp_path, tmp_path / "no-such-checkpoint")
    result = run_merge(asked, tmp_path / "attempt-1.log", still_wanted, poll_seconds=0.01)
    assert result.outcome is Merge.STOPPED and asks == [False]
    assert not Path(asked.output_dir).exists()
