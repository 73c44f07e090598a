"""The worker with the real runner (`python -m twinkle_core.train` under torchrun, 2 ranks, gloo):
resume after losing the whole worker, and pause/resume, both bit-exact against an uninterrupted run.

The interrupted jobs wait at HOLD_STEP (see `HOLDING_RUNNER`) until the test pauses them or kills
their worker, so the interruption lands at a known step however loaded the machine is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_worker_support import (
    STACKS,
    WorkerEnv,
    holding_runner,
    job_processes,
    kill_tree,
    make_env,
    real_spec,
    sqlite_env,
    stack_env,
    steps_per_attempt,
    submit_held,
)

pytestmark = pytest.mark.slow

MAX_STEPS = 6
HOLD_STEP = 3  # jobs submitted with `submit_held` wait here for the test's pause or kill


def final_weights(env: WorkerEnv, job_id: str) -> dict[str, object]:
    ckpt = env.data_dir / "jobs" / job_id / "checkpoints" / f"step-{MAX_STEPS}"
    assert (ckpt / "COMPLETE").exists(), sorted(p.name for p in ckpt.parent.iterdir())
    files = sorted(ckpt.glob("*.safetensors"))
    assert files
    weights: dict[str, object] = {}
    for path in files:
        weights.update(load_file(str(path)))
    return weights


def assert_bitwise_equal(a: dict[str, object], b: dict[str, object]) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # type: ignore[arg-type]


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[WorkerEnv]:
    yield from sqlite_env(tmp_path)


@pytest.fixture(params=STACKS)
def held_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkerEnv]:
    """SQLite and PostgreSQL + Redis, jobs run by the real runner with a test-only hold (see
    `HOLDING_RUNNER`): jobs submitted with `submit_held` wait after HOLD_STEP."""
    yield from stack_env(request, tmp_path, TWINKLE_WORKER_RUNNER=str(holding_runner(tmp_path)))


def wait_until_held(env: WorkerEnv, job_id: str, timeout: float = 180.0) -> None:
    """The runner wrote HOLD_STEP's checkpoint and waits; the worker recorded that step."""
    deadline = time.monotonic() + timeout
    while not any(e["event"] == "checkpoint" and e["step"] == HOLD_STEP for e in env.progress(job_id)):
        assert time.monotonic() < deadline, f"no checkpoint at step {HOLD_STEP}\n{env.worker_logs()}"
        time.sleep(0.2)
    env.wait_for(job_id, lambda j: j.status == "running" and j.step == HOLD_STEP, what="held step")


def assert_resumed_once_at_hold(env: WorkerEnv, job_id: str) -> None:
    """Attempt 1 stopped at HOLD_STEP (it never finished); attempt 2 trained the steps after it."""
    progress = env.progress(job_id)
    assert steps_per_attempt(progress) == [
        list(range(1, HOLD_STEP + 1)),
        list(range(HOLD_STEP + 1, MAX_STEPS + 1)),
    ]
    assert [e["event"] for e in progress].count("done") == 1
    resumed = [e for e in env.events(job_id) if "resuming from checkpoint" in e.message]
    assert len(resumed) == 1 and resumed[0].data["resume_from"].endswith(f"step-{HOLD_STEP}")


def test_pause_then_resume_matches_an_uninterrupted_run(
    held_env: WorkerEnv, tiny_model_dir: Path, text_dataset: Path
) -> None:
    env = held_env
    env.start_worker(concurrency=2)
    spec = real_spec(tiny_model_dir, text_dataset, max_steps=MAX_STEPS)
    reference = env.submit(spec, name="reference")
    paused = submit_held(env, spec, HOLD_STEP, name="paused")
    wait_until_held(env, paused)
    env.set_status(paused, "pausing")
    job = env.wait_status(paused, "paused", "succeeded", "failed", timeout=120)
    assert job.status == "paused", job.error
    assert job.step == HOLD_STEP and str(job.resume_from).endswith(f"step-{HOLD_STEP}")
    assert job_processes(env, paused) == []
    env.set_status(paused, "queued")  # what the API's resume does
    env.wake(paused)
    for job_id in (reference, paused):
        done = env.wait_status(job_id, "succeeded", "failed", timeout=240)
        assert done.status == "succeeded", done.error
    assert env.job(paused).attempt == 2
    assert_resumed_once_at_hold(env, paused)
    assert_bitwise_equal(final_weights(env, reference), final_weights(env, paused))
    assert job_processes(env) == []


@pytest.mark.postgres
@pytest.mark.redis
def test_worker_killed_mid_job_resumes_on_a_new_worker_bitwise_equal(
    tmp_path: Path, postgres_url: str, redis_url: str, tiny_model_dir: Path, text_dataset: Path
) -> None:
    env = make_env(tmp_path, postgres_url, redis_url, TWINKLE_WORKER_RUNNER=str(holding_runner(tmp_path)))
    try:
        spec = real_spec(tiny_model_dir, text_dataset, max_steps=MAX_STEPS)
        victim = submit_held(env, spec, HOLD_STEP, name="victim", max_retries=1)
        doomed_worker = env.start_worker()
        wait_until_held(env, victim)
        reference = env.submit(spec, name="reference")
        env.start_worker()  # runs the reference meanwhile
        kill_tree(doomed_worker.pid)  # the whole worker: Celery process, torchrun, ranks
        # SIGKILL is delivered at once but a loaded machine may take a moment to reap the tree.
        deadline = time.monotonic() + 20
        while job_processes(env, victim) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_processes(env, victim) == []
        env.start_worker()  # finds the dead worker's job and resumes it
        for job_id in (victim, reference):
            done = env.wait_status(job_id, "succeeded", "failed", timeout=300)
            assert done.status == "succeeded", done.error
        assert env.job(victim).attempt == 2
        assert_resumed_once_at_hold(env, victim)
        assert_bitwise_equal(final_weights(env, reference), final_weights(env, victim))
        assert job_processes(env) == []
    finally:
        env.stop_workers()


def test_bad_training_data_is_a_user_error_without_retry(
    env: WorkerEnv, tiny_model_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    env.start_worker()
    job_id = env.submit(real_spec(tiny_model_dir, bad, max_steps=2), max_retries=2)
    job = env.wait_status(job_id, "succeeded", "failed", timeout=180)
    assert job.status == "failed" and job.attempt == 1
    assert job.error["kind"] == "user"
    assert "line 2" in job.error["message"], job.error
    assert job.error["log_tail"]
    assert job_processes(env) == []
