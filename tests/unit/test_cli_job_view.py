"""`twinkle-jobs jobs get`'s text view of a job (twinkle_cli/job_view.py): the lines a person
reads first, each present only when the job has that field. The command's own run against a live
server is in tests/integration/test_cli_ci.py."""

from __future__ import annotations

from typing import Any

from twinkle_cli.job_view import describe_job, job_table, sample_lines

CKPT = "/data/jobs/job-1/checkpoints"


def _job(**fields: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": "job-1",
        "name": "support-bot",
        "status": "running",
        "actions": ["pause", "cancel", "clone"],
        "spec": {"model": {"model_id": "/models/Qwen3-0.6B"}, "adapter": None},
        "progress": {"step": 40, "total_steps": 200, "percent": 20.0, "loss": 1.23456, "eta_seconds": 95.4},
        "queue_position": None,
        "engine": None,
        "latest_checkpoint": None,
        "best_checkpoint": None,
        "fine_tuned_model": None,
        "error": None,
        "created_at": "2026-12-06T06:00:00Z",
        "started_at": "2026-12-06T06:00:05Z",
        "finished_at": None,
    }
    return {**job, **fields}


def test_a_running_job() -> None:
    assert describe_job(_job()) == [
        "job-1  running  support-bot",
        "base model  /models/Qwen3-0.6B  (full fine-tune)",
        "progress    [####................]  20.0% step 40/200 loss 1.2346 eta 95s",
        "times       created 2026-12-06 06:00:00Z, started 2026-12-06 06:00:05Z",
        "actions     pause, cancel, clone",
    ]


def test_a_succeeded_lora_job_names_its_checkpoints_and_its_model() -> None:
    lines = describe_job(
        _job(
            status="succeeded",
            actions=["clone", "delete"],
            spec={"model": {"model_id": "/models/Qwen3-0.6B"}, "adapter": {"type": "lora", "r": 16}},
            progress={"step": 200, "total_steps": 200, "percent": 100.0, "loss": 0.5},
            latest_checkpoint={"step": 200, "path": f"{CKPT}/step-200"},
            best_checkpoint={"step": 150, "path": f"{CKPT}/step-150"},
            fine_tuned_model="ft:Qwen3-0.6B:support-bot:job-1",
            finished_at="2026-12-06T06:10:05Z",
        )
    )
    assert lines == [
        "job-1  succeeded  support-bot",
        "base model  /models/Qwen3-0.6B  (LoRA r=16)",
        "progress    [####################] 100.0% step 200/200 loss 0.5000",
        f"checkpoint  step 200  {CKPT}/step-200",
        f"best        step 150  {CKPT}/step-150",
        "model       ft:Qwen3-0.6B:support-bot:job-1  (twinkle-jobs chat job-1)",
        "times       created 2026-12-06 06:00:00Z, started 2026-12-06 06:00:05Z, "
        "finished 2026-12-06 06:10:05Z (600 s)",
        "actions     clone, delete",
    ]


def test_a_failed_job_shows_its_error_and_a_best_checkpoint_only_when_it_differs() -> None:
    checkpoint = {"step": 20, "path": f"{CKPT}/step-20"}
    lines = describe_job(
        _job(
            status="failed",
            actions=["resume", "clone", "delete"],
            latest_checkpoint=checkpoint,
            best_checkpoint=checkpoint,
            error={"kind": "user", "message": "CUDA out of memory"},
            finished_at="2026-12-06T06:01:00Z",
        )
    )
    assert "error       user: CUDA out of memory" in lines
    assert [line.split()[0] for line in lines[1:]] == [
        "base",
        "progress",
        "checkpoint",
        "error",
        "times",
        "actions",
    ]


def test_a_queued_job_from_a_list_without_its_spec() -> None:
    lines = describe_job(
        _job(
            status="queued",
            name=None,
            spec=None,
            progress={"step": 0, "total_steps": None},
            queue_position=2,
            started_at=None,
            engine={"name": "slurm", "job_id": None, "state": None},
        )
    )
    assert lines == [
        "job-1  queued",
        "progress    step 0/?",
        "queue       position 2",
        "engine      slurm - (-)",
        "times       created 2026-12-06 06:00:00Z",
        "actions     pause, cancel, clone",
    ]


def test_a_sample_event_shows_what_the_model_said_one_line_per_prompt() -> None:
    event = {
        "type": "sample",
        "message": "samples at step 100",
        "data": {
            "step": 100,
            "samples": [
                {"prompt": "2+2=", "completion": "4"},
                {"prompt": "Write a poem", "completion": "Roses are red,\nviolets " + "la " * 100},
            ],
        },
    }
    first, second = sample_lines(event)
    assert first == "    '2+2=' -> 4"
    assert second.startswith("    'Write a poem' -> Roses are red,\\nviolets la la")
    assert second.endswith("…") and len(second) < 240  # cut, on one line
    assert sample_lines({"type": "metrics", "data": {"samples": [{"prompt": "x"}]}}) == []
    assert sample_lines({"type": "sample", "data": None}) == []


def test_the_list_is_a_table_with_columns_as_wide_as_their_cells() -> None:
    done = _job(status="succeeded", progress={"step": 200, "total_steps": 200, "loss": 0.5})
    queued = _job(id="job-22", status="queued", name=None, progress={"step": 0, "total_steps": None})
    assert job_table([done, queued]) == [
        "ID      STATUS     STEP     LOSS    CREATED               NAME",
        "job-1   succeeded  200/200  0.5000  2026-12-06 06:00:00Z  support-bot",
        "job-22  queued     0        -       2026-12-06 06:00:00Z",
    ]
    assert job_table([]) == ["ID  STATUS  STEP  LOSS  CREATED  NAME"]
