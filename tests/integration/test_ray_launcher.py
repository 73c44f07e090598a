"""The Ray launcher against a real local Ray cluster with its job API (started here once for the
module: 2 logical CPUs, dashboard on loopback).

- `RayJobAttempt` alone: exit codes, logs and files come back as the supervisor expects, and
  stopping works.
- The service (API server + worker, subprocesses, SQLite) with `TWINKLE_RAY_ADDRESS`: a job with
  `resources.launcher: "ray"` runs as a Ray job to `succeeded` with its step events; a Ray job
  killed mid-run (SIGKILL of its processes: an infra failure) is retried from its checkpoint and
  ends bitwise equal to the uninterrupted run; `POST /cancel` stops the Ray job and leaves no
  process.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip(
    "ray", reason="ray is not installed (the optional group: pip install 'twinkle-jobs[ray]')"
)

from worker.ray_launcher import STOPPED_EXIT_CODE, RayJobAttempt, ray_env  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def dashboard_address() -> Iterator[str]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a loopback test cluster needs no token
    context = ray.init(
        num_cpus=2,  # logical: a 2-rank job's entrypoint reserves 2
        num_gpus=0,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=free_port(),
        object_store_memory=100 * 1024**2,
        log_to_driver=False,
    )
    try:
        yield f"http://{context.dashboard_url}"
    finally:
        ray.shutdown()


def submit(address: str, tmp_path: Path, name: str, code: str, attempt: int = 1) -> RayJobAttempt:
    env = {"TWINKLE_JOB_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "7", "PYTHONUNBUFFERED": "1"}
    return RayJobAttempt.submit(
        address,
        job_id=f"{name}-{os.getpid()}",
        attempt=attempt,
        argv=[sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        log_path=tmp_path / "logs" / f"{name}-{attempt}.log",
        num_cpus=0.5,
        num_gpus=0,
    )


def test_exit_codes_logs_and_job_files(dashboard_address: str, tmp_path: Path) -> None:
    ok = submit(
        dashboard_address,
        tmp_path,
        "ok",
        "import os, pathlib; print('hello from ray', os.environ['TWINKLE_JOB_DIR']);"
        "pathlib.Path('progress.jsonl').write_text('{\"event\": \"done\"}\\n')",
    )
    assert ok.wait(timeout=120) == 0
    assert f"hello from ray {tmp_path}" in (tmp_path / "logs" / "ok-1.log").read_text()
    assert (tmp_path / "progress.jsonl").read_text() == '{"event": "done"}\n'  # ran in the job dir
    user_error = submit(dashboard_address, tmp_path, "bad", "import sys; sys.exit(2)")
    assert user_error.wait(timeout=120) == 2  # the runner's user-error code reaches classify()
    assert ray_env({"CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1"}) == {"HF_HUB_OFFLINE": "1"}


def test_terminate_stops_the_job(dashboard_address: str, tmp_path: Path) -> None:
    job = submit(
        dashboard_address, tmp_path, "sleeper", "import time; print('sleeping', flush=True); time.sleep(600)"
    )
    log = tmp_path / "logs" / "sleeper-1.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "sleeping" in log.read_text()):
        assert job.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    job.terminate(grace_seconds=60)
    assert job.poll() == STOPPED_EXIT_CODE
    assert job.pids() == [] and job.signal_ranks(10) == 0 and not job.can_signal


def test_a_new_attempt_stops_the_ray_job_of_an_earlier_one(dashboard_address: str, tmp_path: Path) -> None:
    """A worker that died leaves its Ray job running: the next attempt must not train beside it."""
    sleeper = "import time; print('sleeping', flush=True); time.sleep(600)"
    first = submit(dashboard_address, tmp_path, "lost", sleeper)
    deadline = time.monotonic() + 120
    while first.client.get_job_status(first.submission_id) != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    second = submit(dashboard_address, tmp_path, "lost", "print('attempt 2')", attempt=2)
    assert first.poll() == STOPPED_EXIT_CODE  # stopped before the second was submitted
    assert second.wait(timeout=120) == 0


def test_the_job_runner_runs_as_a_ray_job(
    dashboard_address: str, tmp_path: Path, tiny_model_dir: Path, text_dataset: Path
) -> None:
    """The worker's own runner command (torchrun -m twinkle_core.train spec.json) as a Ray job:
    progress.jsonl and the checkpoint appear in the job directory, as the supervisor expects."""
    from twinkle_core.progress import ProgressReader
    from worker.launch import AttemptPaths, resolve_torchrun, runner_env, torchrun_argv

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = {
        "model": {"model_id": str(tiny_model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(text_dataset), "max_length": 32},
        "training": {"max_steps": 2, "batch_size": 2, "save_every": 2},
        "resources": {"nproc_per_node": 1},
    }
    paths = AttemptPaths(job_dir, 1)
    paths.spec.write_text(json.dumps(spec))
    argv = torchrun_argv(resolve_torchrun("torchrun"), 1, paths, None, "twinkle_core.train")
    env = runner_env("ray-runner", job_dir, [])
    attempt = RayJobAttempt.submit(
        dashboard_address, "ray-runner", 1, argv, env, job_dir, paths.log, num_cpus=1, num_gpus=0
    )
    assert attempt.wait(timeout=240) == 0, paths.log.read_text()[-3000:]
    kinds = [event["event"] for event in ProgressReader(job_dir / "progress.jsonl").read_new()]
    assert kinds[0] == "started" and "checkpoint" in kinds and kinds[-1] == "done"
    assert "Running entrypoint for job twinkle-ray-runner-attempt-1" in paths.log.read_text()


# -- the service with the Ray launcher ----------------------------------------------------------

# `twinkle_core.train` with a hold, so that a test acts on a job that provably has not finished:
# the first fresh (not resumed) run whose rank 0 takes the token file (an atomic rename) waits
# after step HOLD_STEP, its step-2 checkpoint complete, until it is stopped or killed. Waiting
# changes no arithmetic, so the weights equal those of a plain run.
HOLD_RUNNER = r"""
import os, sys, time
from twinkle_core import train

HOLD_STEP = 2
plain_after_step = train.JobRunner.after_step

def after_step(self, result):
    outcome = plain_after_step(self, result)
    fresh = self.resume_from is None and os.environ.get("RANK", "0") == "0"
    if outcome is None and fresh and self.model.cur_step == HOLD_STEP:
        try:
            os.rename(os.environ["TWINKLE_TEST_HOLD_TOKEN"], self.job_dir / "held")
        except FileNotFoundError:
            return outcome  # no token: run through
        while not (self.stop.terminate or self.stop.pause):
            time.sleep(0.1)
    return outcome

train.JobRunner.after_step = after_step
train.run()
"""
MAX_STEPS = 4


class RayService:
    """A LiveService whose worker submits launcher='ray' jobs to the module's Ray cluster."""

    def __init__(self, svc: Any, token: Path, address: str) -> None:
        self.svc, self.token, self.address = svc, token, address

    def submit(self, spec: dict[str, Any], **fields: Any) -> str:
        with self.svc.client() as client:
            response = client.post("/v1/jobs", json={"name": "ray-job", "spec": spec, **fields})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.svc.client() as client:
            return dict(client.get(f"/v1/jobs/{job_id}").json())

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self.svc.client() as client:
            page = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()
        return list(page["data"])

    def job_dir(self, job_id: str) -> Path:
        return Path(self.svc.data_dir) / "jobs" / job_id

    def wait_held(self, job_id: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not (self.job_dir(job_id) / "held").exists():
            job = self.job(job_id)
            assert job["status"] in ("queued", "starting", "running"), (job, self.svc.worker_log())
            assert time.monotonic() < deadline, f"job {job_id} never held: {job}\n{self.svc.worker_log()}"
            time.sleep(0.3)

    def ray_status(self, job_id: str, attempt: int) -> str:
        from ray.job_submission import JobSubmissionClient

        from worker.ray_launcher import submission_id

        return str(JobSubmissionClient(self.address).get_job_status(submission_id(job_id, attempt)))


@pytest.fixture(scope="module")
def ray_service(
    dashboard_address: str, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> Iterator[RayService]:
    from live_service import LiveService

    root = tmp_path_factory.mktemp("ray-service")
    runner = root / "hold_runner.py"
    runner.write_text(HOLD_RUNNER)
    token = root / "hold-token"
    svc = LiveService.configure(
        root,
        [tiny_model_dir, text_dataset.parent],
        TWINKLE_RAY_ADDRESS=dashboard_address,
        TWINKLE_WORKER_RUNNER=str(runner),
        TWINKLE_TEST_HOLD_TOKEN=str(token),
        TWINKLE_HEARTBEAT_SECONDS="0.5",
        TWINKLE_CANCEL_GRACE_SECONDS="30",
    )
    svc.start_server()
    svc.start_worker()
    try:
        yield RayService(svc, token, dashboard_address)
    finally:
        svc.stop()


def ray_spec(tiny_model_dir: Path, text_dataset: Path) -> dict[str, Any]:
    return {
        "model": {"model_id": str(tiny_model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(text_dataset), "max_length": 32},
        "training": {
            "max_steps": MAX_STEPS,
            "batch_size": 4,
            "save_every": 2,
            "save_total_limit": None,
            "seed": 7,
        },
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": 2, "launcher": "ray"},
    }


def final_weights(job_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    checkpoint = job_dir / "checkpoints" / f"step-{MAX_STEPS}"
    assert (checkpoint / "COMPLETE").exists(), sorted(p.name for p in checkpoint.parent.iterdir())
    weights: dict[str, Any] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    assert weights
    return weights


def job_processes(job_dir: Path) -> list[Any]:
    import psutil

    from worker.process_tree import processes_referencing

    return [
        p
        for p in processes_referencing(str(job_dir), "spec.json")
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def kill_processes(job_dir: Path) -> int:
    """SIGKILL every process of the job (torchrun and its ranks, under Ray's job supervisor)."""
    import psutil

    victims = job_processes(job_dir)
    for proc in victims:
        proc.kill()
    psutil.wait_procs(victims, timeout=30)
    return len(victims)


@pytest.mark.timeout(600)
def test_a_ray_job_succeeds_and_a_killed_one_resumes_bitwise_equal(
    ray_service: RayService, tiny_model_dir: Path, text_dataset: Path
) -> None:
    spec = ray_spec(tiny_model_dir, text_dataset)
    ray_service.token.write_text("hold")
    victim = ray_service.submit(spec, max_retries=1)
    ray_service.wait_held(victim)  # attempt 1 waits after its step-2 checkpoint
    assert kill_processes(ray_service.job_dir(victim)) >= 3  # torchrun and both ranks
    reference = ray_service.submit(spec)  # the token is gone: this one runs through

    for job_id in (reference, victim):
        job = ray_service.svc.wait_terminal(job_id, timeout=420)
        assert job["status"] == "succeeded", (job, ray_service.svc.worker_log())

    # The uninterrupted job ran as one Ray job and reported every step.
    assert ray_service.job(reference)["attempt"] == 1
    assert ray_service.ray_status(reference, 1) == "SUCCEEDED"
    events = ray_service.events(reference)
    steps = [e["data"]["step"] for e in events if e["type"] == "metrics" and "step" in (e["data"] or {})]
    assert steps == list(range(1, MAX_STEPS + 1)), events
    assert any(e["message"].startswith(f"submitted Ray job twinkle-{reference}-attempt-1") for e in events)

    # The killed job: an infra failure, retried from its step-2 checkpoint as a second Ray job.
    assert ray_service.ray_status(victim, 1) == "FAILED"
    assert ray_service.ray_status(victim, 2) == "SUCCEEDED"
    victim_job = ray_service.job(victim)
    assert victim_job["attempt"] == 2
    messages = [e["message"] for e in ray_service.events(victim)]
    resumed = [m for m in messages if "resuming from checkpoint" in m]
    assert len(resumed) == 1 and resumed[0].endswith("step-2"), messages
    assert any("killed by signal 9" in m for m in messages), messages

    import torch

    expected, got = final_weights(ray_service.job_dir(reference)), final_weights(ray_service.job_dir(victim))
    assert expected.keys() == got.keys()
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []
    assert job_processes(ray_service.job_dir(victim)) == []


@pytest.mark.timeout(420)
def test_cancel_through_the_api_stops_the_ray_job(
    ray_service: RayService, tiny_model_dir: Path, text_dataset: Path
) -> None:
    ray_service.token.write_text("hold")
    job_id = ray_service.submit(ray_spec(tiny_model_dir, text_dataset))
    ray_service.wait_held(job_id)  # running, mid-way: it cannot finish before the cancel
    assert ray_service.ray_status(job_id, 1) == "RUNNING"
    with ray_service.svc.client() as client:
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    job = ray_service.svc.wait_terminal(job_id, timeout=120)
    assert job["status"] == "cancelled", (job, ray_service.svc.worker_log())
    assert ray_service.ray_status(job_id, 1) == "STOPPED"
    assert job_processes(ray_service.job_dir(job_id)) == []


@pytest.mark.timeout(420)
def test_pause_stops_the_ray_job_at_a_checkpoint_and_resume_finishes_it(
    ray_service: RayService, tiny_model_dir: Path, text_dataset: Path
) -> None:
    ray_service.token.write_text("hold")
    job_id = ray_service.submit(ray_spec(tiny_model_dir, text_dataset))
    ray_service.wait_held(job_id)
    with ray_service.svc.client() as client:
        assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
        deadline = time.monotonic() + 120
        while (job := ray_service.job(job_id))["status"] != "paused":
            assert job["status"] in ("running", "pausing") and time.monotonic() < deadline, job
            time.sleep(0.3)
        assert ray_service.ray_status(job_id, 1) == "STOPPED"
        assert "/checkpoints/step-" in job["resume_from"]
        assert job_processes(ray_service.job_dir(job_id)) == []
        assert client.post(f"/v1/jobs/{job_id}/resume").status_code == 200
    job = ray_service.svc.wait_terminal(job_id, timeout=240)
    assert job["status"] == "succeeded" and job["attempt"] == 2, (job, ray_service.svc.worker_log())
    assert ray_service.ray_status(job_id, 2) == "SUCCEEDED"
