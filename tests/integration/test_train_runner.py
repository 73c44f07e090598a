"""The job runner `python -m twinkle_core.train`: events, checkpoints, pause/stop, exact resume, errors."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from dist_scripts.launch import REPO_ROOT, torch_env, torchrun

from twinkle_core.assets import write_chat_dataset, write_text_dataset
from twinkle_core.checkpoint import is_complete, latest_complete_checkpoint, read_best


def write_job(job_dir: Path, model_dir: Path, data_dir: Path, **sections: dict[str, Any]) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {
        "model": {"model_id": str(model_dir), "mixed_precision": "no"},
        "data": {
            "train_file": str(data_dir / "train.jsonl"),
            "validation_file": str(data_dir / "val.jsonl"),
            "max_length": 32,
        },
        "training": {
            "max_steps": 6,
            "batch_size": 4,
            "gradient_accumulation_steps": 2,
            "save_every": 2,
            "eval_every": 2,
            "save_total_limit": 2,
        },
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": 2},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    (job_dir / "spec.json").write_text(json.dumps(spec))
    return job_dir / "spec.json"


def events(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("runner-data")
    write_text_dataset(directory / "train.jsonl", n=64)
    write_text_dataset(directory / "val.jsonl", n=12, seed=3)
    return directory


def _weights(checkpoint: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    from twinkle_core.checkpoint import hf_model_dir

    files = hf_model_dir(checkpoint)  # an FSDP2 job's checkpoints before the last are sharded
    adapter = files / "adapter_model.safetensors"
    return load_file(str(adapter if adapter.is_file() else files / "model.safetensors"))


def _catches(process: psutil.Process, sig: signal.Signals) -> bool:
    """Whether `process` has a handler installed for `sig` (the SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


def _launch_and_signal(spec: Path, sig: signal.Signals) -> tuple[int, list[dict[str, Any]]]:
    """Start a 2-rank job, signal it, return (torchrun exit code, events).

    SIGUSR1 (pause) goes to every rank as soon as both have installed their handlers, long before
    the first step: a tiny job's six steps take about 0.1 s, so waiting for a step event to appear
    and then signalling raced with the job's end. The runner checks for a stop after every
    micro-batch, so the pause lands after the first micro-batch, inside the first accumulation
    window (a checkpoint of step 0), whatever the machine's speed. SIGTERM goes to torchrun
    (which forwards it to the ranks) after the first step event of a job long enough not to end first.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "twinkle_core.train", str(spec)]
    log = (spec.parent / "log.txt").open("w")
    proc = subprocess.Popen(
        command, env=torch_env(), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (spec.parent / "log.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "the job did not get ready to be signalled within 300 s"
            if sig == signal.SIGUSR1:
                ranks = psutil.Process(proc.pid).children(recursive=True)
                if len(ranks) == 2 and all(_catches(rank, sig) for rank in ranks):
                    for rank in ranks:  # the worker signals every rank directly for a pause
                        rank.send_signal(sig)
                    break
            elif any(e["event"] == "step" for e in events(spec.parent)):
                proc.send_signal(sig)
                break
            time.sleep(0.02)
        return proc.wait(timeout=300), events(spec.parent)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


SAMPLES = {"sample_every": 2, "sample_prompts": ["the cat", "a robot builds"], "sample_max_new_tokens": 8}

# Dropout in both, so the resume must restore each rank's RNG (taken at the window's start when
# the stop comes inside a window) to be bitwise; FSDP2 + LoRA + bf16 is the other end of the matrix,
# with samples on: generating on every rank in lockstep must leave the resume bitwise too.
RESUME_CASES: dict[str, dict[str, dict[str, Any]]] = {
    "ddp": {"model": {"config": {"attention_dropout": 0.1}}},
    "fsdp2_lora_bf16": {
        "model": {
            "config": {"attention_dropout": 0.1},
            "strategy": "native_fsdp",
            "device_mesh": {"fsdp_size": 2},
            "mixed_precision": "bf16",
        },
        "adapter": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1},
        "training": SAMPLES,
    },
}


def _samples(log: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, str]]]]:
    return [(e["step"], e["samples"]) for e in log if e["event"] == "sample"]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_job_checkpoints_pauses_and_resumes_exactly(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, case: str
) -> None:
    sections = RESUME_CASES[case]
    straight = write_job(tmp_path / "straight", tiny_model_dir, data_dir, **sections)
    proc = torchrun(["-m", "twinkle_core.train", str(straight)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = events(straight.parent)
    kinds = [e["event"] for e in log]
    assert kinds[0] == "started" and kinds[-1] == "done"
    assert [e["step"] for e in log if e["event"] == "step"] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in log if e["event"] == "eval"] == [2, 4, 6]
    step_event = next(e for e in log if e["event"] == "step")
    assert set(step_event) >= {"loss", "lr", "grad_norm", "tokens_per_second", "samples_per_second", "epoch"}
    checkpoints = [e for e in log if e["event"] == "checkpoint"]
    assert [c["step"] for c in checkpoints] == [2, 4, 6]
    assert all("eval_loss" in c["metrics"] for c in checkpoints)
    losses = {e["step"]: e["loss"] for e in log if e["event"] == "step"}
    assert [c["metrics"]["loss"] for c in checkpoints] == [losses[2], losses[4], losses[6]]
    root = straight.parent / "checkpoints"
    best = read_best(root)
    assert best is not None
    best_event = [c for c in checkpoints if c["is_best"]][-1]
    assert best.path == best_event["path"]
    # save_total_limit=2 keeps the two newest (the best is one of them or kept besides).
    kept = sorted(p.name for p in root.iterdir() if is_complete(p))
    assert len(kept) == 2 and "step-6" in kept and Path(best.path).name in kept
    assert latest_complete_checkpoint(straight.parent) == root / "step-6"
    assert log[-1]["final_checkpoint"] == str(root / "step-6")
    state = json.loads((root / "step-6" / "trainer_state.json").read_text())
    assert state["cur_step"] == 6 and state["consumed_train_samples"] == 48 and state["world_size"] == 2

    # Pause (SIGUSR1 to every rank) after the first micro-batch of the first window: the checkpoint
    # is that of the last step boundary (step 0), `stopped`, exit 0.
    paused_sections = {**sections, "training": {**sections.get("training", {}), "save_every": None}}
    paused = write_job(tmp_path / "paused", tiny_model_dir, data_dir, **paused_sections)
    code, log = _launch_and_signal(paused, signal.SIGUSR1)
    assert code == 0
    stopped = log[-1]
    assert stopped["event"] == "stopped" and stopped["reason"] == "pause"
    assert log[-2]["event"] == "checkpoint" and log[-2]["path"] == stopped["checkpoint"]
    assert is_complete(stopped["checkpoint"]) and stopped["step"] == 0
    assert (
        json.loads((Path(stopped["checkpoint"]) / "trainer_state.json").read_text())["consumed_train_samples"]
        == 0
    )

    # Resume the paused job in new processes: the final weights equal the straight run's, bit for bit.
    proc = torchrun(["-m", "twinkle_core.train", str(paused), "--resume-from", stopped["checkpoint"]])
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed_log = events(paused.parent)
    started = [e for e in resumed_log if e["event"] == "started"][-1]
    assert started["resumed_from"] == stopped["checkpoint"] and started["start_step"] == stopped["step"]
    assert resumed_log[-1]["event"] == "done"
    a, b = _weights(root / "step-6"), _weights(paused.parent / "checkpoints" / "step-6")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    if "training" in sections:  # samples on: the resumed run says what the straight one said
        said = _samples(events(straight.parent))
        assert [step for step, _ in said] == [2, 4, 6]
        assert _samples(resumed_log) == said


def test_samples_are_written_every_n_steps_and_do_not_change_training(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path
) -> None:
    # DDP with dropout and accumulation windows of 2: samples come at optimizer steps 2 and 4, the
    # same on a rerun, and the final weights are bitwise those of the same job without samples.
    base = {"model": {"config": {"attention_dropout": 0.1}}}
    training = {"max_steps": 4, "save_every": None, "eval_every": None}
    runs = {}
    for name, extra in (("samples", SAMPLES), ("rerun", SAMPLES), ("plain", {})):
        spec = write_job(tmp_path / name, tiny_model_dir, data_dir, training={**training, **extra}, **base)
        proc = torchrun(["-m", "twinkle_core.train", str(spec)])
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = events(spec.parent)
    samples = _samples(runs["samples"])
    assert [step for step, _ in samples] == [2, 4]
    for _, pairs in samples:
        assert [p["prompt"] for p in pairs] == SAMPLES["sample_prompts"]
        assert all(p["completion"] for p in pairs), pairs
    assert _samples(runs["rerun"]) == samples and not _samples(runs["plain"])
    kinds = [e["event"] for e in runs["samples"]]
    assert kinds.index("sample") == kinds.index("step") + 2  # after step 2's event, not inside a window
    a = _weights(tmp_path / "samples" / "checkpoints" / "step-4")
    b = _weights(tmp_path / "plain" / "checkpoints" / "step-4")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


@pytest.mark.slow
def test_sigterm_checkpoints_and_stops_a_lora_fsdp2_job(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_chat_dataset(data / "train.jsonl", n=64)
    write_chat_dataset(data / "val.jsonl", n=8, seed=1)
    spec = write_job(
        tmp_path / "job",
        tiny_model_dir,
        data,
        model={"strategy": "native_fsdp", "device_mesh": {"fsdp_size": 2}, "mixed_precision": "bf16"},
        adapter={"r": 4, "lora_alpha": 8},
        training={"max_steps": 200, "save_every": None, "eval_every": None},
    )
    code, log = _launch_and_signal(spec, signal.SIGTERM)
    assert code != 0  # torchrun reports the ranks' 143 as a failure; the event says what happened
    stopped = [e for e in log if e["event"] == "stopped"]
    assert stopped and stopped[0]["reason"] == "terminate"
    checkpoint = Path(stopped[0]["checkpoint"])
    assert is_complete(checkpoint) and (checkpoint / "adapter_model.safetensors").is_file()
    assert not any(e["event"] == "error" for e in log)


# ------------------------------------------------------------- in-process: errors, 1 rank
def test_single_process_job_runs_to_done(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, run_main: Any
) -> None:
    spec = write_job(
        tmp_path / "job",
        tiny_model_dir,
        data_dir,
        training={"max_steps": 2, "save_every": None, "eval_every": None},
        resources={"nproc_per_node": 1},
        scheduler={"name": "linear", "warmup_steps": 1},
    )
    assert run_main([str(spec)]) == 0
    log = events(spec.parent)
    assert [e["event"] for e in log] == ["started", "step", "step", "eval", "checkpoint", "done"]
    assert log[1]["lr"] == 0.0 and log[2]["lr"] == pytest.approx(1e-3)


def test_early_stopping_ends_the_run_after_patience_evals_without_improvement(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, run_main: Any
) -> None:
    # A learning rate this large wrecks the model from the first update: after the first eval
    # the eval loss does not improve again (it rises, or turns NaN, which is no improvement).
    spec = write_job(
        tmp_path / "job",
        tiny_model_dir,
        data_dir,
        training={"max_steps": 20, "eval_every": 1, "save_every": None, "early_stopping_patience": 2},
        optimizer={"lr": 9.0},
        resources={"nproc_per_node": 1},
    )
    assert run_main([str(spec)]) == 0
    log = events(spec.parent)
    best, misses, expected_stop = float("inf"), 0, None
    for e in (e for e in log if e["event"] == "eval"):
        if e["eval_loss"] < best:
            best, misses = e["eval_loss"], 0
        else:
            misses += 1
        if misses == 2:
            expected_stop = e["step"]
            break
    done = log[-1]
    assert done["event"] == "done" and expected_stop is not None and expected_stop < 20, log
    assert done["step"] == expected_stop  # not one step further, and a final checkpoint there
    assert done["final_checkpoint"].endswith(f"step-{expected_stop}")


def test_eval_loss_is_the_same_on_one_and_two_ranks(tmp_path: Path, tiny_model_dir: Path) -> None:
    # 13 validation rows in global batches of 4 leave a last batch of 1, which two ranks pad to 2
    # with a wrapped-around row. The eval loss is the token-weighted mean over the whole set,
    # summed across ranks: the padding row must not count, and no row may count twice. A
    # learning rate of 1e-9 keeps the one training step from moving the weights measurably.
    data = tmp_path / "data"
    data.mkdir()
    write_text_dataset(data / "train.jsonl", n=16)
    write_text_dataset(data / "val.jsonl", n=13, seed=5)
    losses = {}
    for nproc in (1, 2):
        spec = write_job(
            tmp_path / f"ranks-{nproc}",
            tiny_model_dir,
            data,
            training={"max_steps": 1, "gradient_accumulation_steps": 1, "save_every": None, "eval_every": 1},
            optimizer={"lr": 1e-9},
            resources={"nproc_per_node": nproc},
        )
        proc = torchrun(["-m", "twinkle_core.train", str(spec)], nproc=nproc)
        assert proc.returncode == 0, proc.stderr[-3000:]
        evals = [e["eval_loss"] for e in events(spec.parent) if e["event"] == "eval"]
        assert evals, events(spec.parent)
        losses[nproc] = evals[-1]
    assert losses[2] == pytest.approx(losses[1], rel=1e-6), losses


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"training": {"no_such_field": 1}}, "invalid job spec"),
        ({"model": {"mixed_precision": "fp8"}}, "fp8"),
        ({"data": {"train_file": "/nonexistent/train.jsonl"}}, "data.train_file"),
        ({"data": {"train_file": "MALFORMED"}}, "line 2"),
        # A model directory without its weights: the same on every attempt, so not retried.
        ({"model": {"model_id": "NO_WEIGHTS"}}, "model.model_id"),
        ({"model": {"strategy": "accelerate", "device_mesh": {"fsdp_size": 1, "dp_size": 1}}}, None),
    ],
)
def test_user_errors_exit_2_with_an_error_event(
    tmp_path: Path,
    tiny_model_dir: Path,
    data_dir: Path,
    run_main: Any,
    change: dict[str, Any],
    message: str | None,
) -> None:
    if change.get("data", {}).get("train_file") == "MALFORMED":
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"text": "fine"}\n{"text": \n')
        change = {"data": {"train_file": str(bad)}}
    if change.get("model", {}).get("model_id") == "NO_WEIGHTS":
        weightless = tmp_path / "weightless"
        shutil.copytree(tiny_model_dir, weightless, ignore=shutil.ignore_patterns("*.safetensors*"))
        change = {"model": {"model_id": str(weightless)}}
    sections: dict[str, dict[str, Any]] = {"resources": {"nproc_per_node": 1}, "training": {"max_steps": 1}}
    for name, values in change.items():
        sections[name] = {**sections.get(name, {}), **values}
    spec = write_job(tmp_path / "job", tiny_model_dir, data_dir, **sections)
    code = run_main([str(spec)])
    log = events(spec.parent)
    if message is None:  # a valid variant: the control case
        assert code == 0 and log[-1]["event"] == "done"
        return
    assert code == 2
    assert log[-1]["event"] == "error" and log[-1]["kind"] == "user"
    assert message in log[-1]["message"]


def test_missing_spec_file_is_a_user_error(tmp_path: Path, run_main: Any) -> None:
    assert run_main([str(tmp_path / "spec.json")]) == 2
    assert events(tmp_path)[-1]["kind"] == "user"


def test_error_classification() -> None:
    import torch

    from twinkle_core.train import classify_error

    assert classify_error(ValueError("bad"), first_step_done=True) == "user"
    assert classify_error(torch.OutOfMemoryError("oom"), first_step_done=False) == "user"
    assert classify_error(torch.OutOfMemoryError("oom"), first_step_done=True) == "infra"
    assert classify_error(RuntimeError("gloo connection closed"), first_step_done=False) == "infra"
    # a Python error before the first step is the spec's or the model's: the same on every retry
    for exc in (TypeError("unexpected keyword 'foo'"), KeyError("hidden_size"), ImportError("flash_attn")):
        assert classify_error(exc, first_step_done=False) == "user", exc
        assert classify_error(exc, first_step_done=True) == "infra", exc
    assert classify_error(RuntimeError("size mismatch for lm_head.weight"), first_step_done=False) == "user"
    # what the machine or the network causes stays retryable at start-up too
    for exc in (
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        torch.distributed.DistNetworkError("store timeout"),
        ConnectionResetError("peer"),
        TimeoutError("rendezvous"),
        OSError(28, "No space left on device"),
        KeyboardInterrupt(),
    ):
        assert classify_error(exc, first_step_done=False) == "infra", exc


def test_only_a_local_directory_missing_a_model_file_is_the_users(tmp_path: Path) -> None:
    from twinkle_core.train import incomplete_model_directory

    missing = OSError(f"Error no file named model.safetensors found in directory {tmp_path}.")
    assert "model.model_id" in str(incomplete_model_directory(str(tmp_path), missing))
    # A hub id, a download that failed, or another OS error: for a retry to decide.
    assert incomplete_model_directory("ms://org/model", missing) is None
    assert incomplete_model_directory(str(tmp_path), ConnectionError("no file named x: reset")) is None
    assert incomplete_model_directory(str(tmp_path), OSError(28, "No space left on device")) is None
