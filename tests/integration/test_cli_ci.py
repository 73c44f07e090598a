"""The CLI as a CI pipeline uses it: `jobs submit --wait` passes when the fine-tune succeeds and
fails the step when it fails; the other commands read what the job left behind or act on a job.

The job-control commands run against a server with no worker, so a job stays `queued` exactly as
long as the test needs it to; the following and progress output against a real worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_service import TOKEN, LiveService, tiny_spec

from jobcore.model_names import base_name

pytestmark = pytest.mark.slow


@pytest.fixture()
def service(tmp_path: Path, tiny_model_dir: Path) -> Iterator[LiveService]:
    svc = LiveService.configure(tmp_path, [tiny_model_dir])
    svc.start_server()
    svc.start_worker()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture()
def idle_service(tmp_path: Path, tiny_model_dir: Path) -> Iterator[LiveService]:
    """A server without any worker: submitted jobs stay queued until the test acts on them."""
    svc = LiveService.configure(tmp_path, [tiny_model_dir])
    svc.start_server()
    try:
        yield svc
    finally:
        svc.stop()


def cli_command(service: LiveService, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "TWINKLE_URL": service.url, "TWINKLE_TOKEN": TOKEN}
    return [sys.executable, "-m", "twinkle_cli.main", *args], env


def cli(service: LiveService, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv, env = cli_command(service, *args)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def cli_json(service: LiveService, *args: str) -> Any:
    result = cli(service, *args, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def job_file(tmp_path: Path, name: str, spec: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "spec": spec}))
    return path


def test_ci_script_passes_and_fails_with_the_job(
    service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=32)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"name": "ci-good", "spec": tiny_spec(tiny_model_dir, dataset, steps=2)}))

    assert cli(service, "jobs", "validate", "-f", str(good)).returncode == 0

    ok = cli(service, "jobs", "submit", "-f", str(good), "--wait", "-o", "json")
    assert ok.returncode == 0, ok.stdout + ok.stderr + service.worker_log()
    job = json.loads(ok.stdout)
    assert job["status"] == "succeeded" and job["progress"]["step"] == 2
    # The pipeline's next step reads the name to call the model by from this one object.
    assert job["fine_tuned_model"] == f"ft:{base_name(job['spec']['model']['model_id'])}:ci-good:{job['id']}"

    listed = json.loads(cli(service, "jobs", "list", "-o", "json").stdout)
    assert [j["id"] for j in listed] == [job["id"]]

    checkpoints = json.loads(cli(service, "checkpoints", "list", job["id"], "-o", "json").stdout)
    assert checkpoints and checkpoints[0]["step"] == 2
    assert checkpoints[0]["metrics"]["loss"] == pytest.approx(job["progress"]["loss"])  # the step's loss
    archive = tmp_path / "ckpt.tar"
    got = cli(service, "checkpoints", "download", job["id"], checkpoints[0]["id"], "--dest", str(archive))
    assert got.returncode == 0, got.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(name.endswith("COMPLETE") for name in names)
    assert any(name.endswith("config.json") for name in names)

    logs = cli(service, "jobs", "logs", job["id"], "-n", "50")
    assert logs.returncode == 0 and "==>" in logs.stdout
    # The log tells the training as it went, not only warnings: rank 0's lines for its events.
    assert "[rank0]:" in logs.stdout and "training started: 2 steps, world size 2" in logs.stdout
    assert re.search(r"step 2/2: loss=\d+\.\d{4} lr=", logs.stdout), logs.stdout
    assert "training finished at step 2" in logs.stdout

    # The next round trains on from the model by its name, as OpenAI's fine-tuning does.
    model = job["fine_tuned_model"]
    again = cli(
        service, "jobs", "submit", "-f", str(good), "--set", f"model.model_id={model}", "--name", "ci-again",
        "--wait", "-o", "json",
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr + service.worker_log()
    second = json.loads(again.stdout)
    assert second["status"] == "succeeded" and second["spec"]["model"]["model_id"] == model
    assert second["fine_tuned_model"].startswith(f"ft:{base_name(str(tiny_model_dir))}:ci-again:")

    # A dataset with a broken line: a user error, so the job fails without retries and so does the step.
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": \n')
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "ci-bad", "spec": tiny_spec(tiny_model_dir, broken, steps=2)}))
    failed = cli(service, "jobs", "submit", "-f", str(bad), "--wait")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "failed" in failed.stderr and "line 2" in failed.stderr


def test_validate_names_the_bad_field(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "model: {model_id: org/m, mixed_precision: fp9}\ndata: {train_file: org/d}\ntraining: {max_step: 4}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "twinkle_cli.main", "jobs", "validate", "-f", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "spec.model.mixed_precision" in result.stderr
    assert "unknown field 'spec.training.max_step' (did you mean 'spec.training.max_steps'?)" in result.stderr


def test_follow_shows_events_and_a_progress_line_with_step_loss_and_eta(
    service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "upload.jsonl", n=32)
    uploaded = cli_json(service, "files", "upload", str(dataset))
    assert uploaded["object"] == "file" and uploaded["rows"] == 32
    assert [f["id"] for f in cli_json(service, "files", "list")] == [uploaded["id"]]
    listed_text = cli(service, "files", "list")
    assert uploaded["id"] in listed_text.stdout and "upload.jsonl" in listed_text.stdout

    spec = tiny_spec(tiny_model_dir, dataset, steps=4, nproc=1)
    spec["data"]["train_file"] = uploaded["id"]
    followed = cli(service, "jobs", "submit", "-f", str(job_file(tmp_path, "ci-follow", spec)), "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr + service.worker_log()
    out, err = followed.stdout, followed.stderr
    assert out.startswith("submitted job-")
    # Every event in order: queued first, each step, then the final status.
    assert "[    status] job queued" in out
    steps = [line for line in out.splitlines() if "[   metrics] step " in line]
    assert [line.split("step ")[1].split(":")[0] for line in steps] == ["1", "2", "3", "4"]
    assert out.index("job queued") < out.index("step 1") < out.index("step 4")
    # One progress line per step on stderr; the ETA once two steps give a pace, until the last.
    progress = [line for line in err.splitlines() if " step " in line and "/4" in line]
    assert [p.split("step ")[1].split("/")[0] for p in progress] == ["1", "2", "3", "4"]
    assert all(" loss " in p for p in progress)
    assert "eta" not in progress[0] and "eta" in progress[1] and "eta" in progress[2]
    assert "succeeded" in out.splitlines()[-1]


def test_job_commands_act_on_a_queued_job(
    idle_service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=16)
    path = job_file(tmp_path, "ctl", tiny_spec(tiny_model_dir, dataset, steps=2))
    job = cli_json(idle_service, "jobs", "submit", "-f", str(path))
    assert job["status"] == "queued"
    job_id = job["id"]

    assert cli_json(idle_service, "jobs", "get", job_id)["name"] == "ctl"
    assert cli_json(idle_service, "jobs", "pause", job_id)["status"] == "paused"
    assert cli_json(idle_service, "jobs", "resume", job_id)["status"] == "queued"
    clone = cli_json(
        idle_service, "jobs", "clone", job_id, "--set", "training.max_steps=7", "--name", "ctl-2"
    )
    assert clone["id"] != job_id and clone["spec"]["training"]["max_steps"] == 7 and clone["name"] == "ctl-2"
    assert cli_json(idle_service, "jobs", "cancel", job_id)["status"] == "cancelled"
    text = cli(idle_service, "jobs", "get", job_id)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"{job_id}  cancelled  ctl"
    assert lines[1] == f"base model  {tiny_model_dir}  (full fine-tune)"
    assert lines[-1] == "actions     resume, clone, delete"  # the server's list, not the CLI's own
    assert not any(line.startswith(("checkpoint", "model ")) for line in lines)  # none yet

    events = cli(idle_service, "jobs", "events", job_id, "-o", "json")
    assert events.returncode == 0, events.stderr
    statuses = [e["data"]["to"] for e in map(json.loads, events.stdout.splitlines()) if e["type"] == "status"]
    assert statuses == ["queued", "paused", "queued", "cancelled"]

    table = cli(idle_service, "jobs", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "STATUS", "STEP", "LOSS", "CREATED", "NAME"]
    assert [row.split()[:2] for row in table[1:]] == [[clone["id"], "queued"], [job_id, "cancelled"]]
    queued = cli_json(idle_service, "jobs", "list", "--status", "queued", "--status", "paused")
    assert [j["id"] for j in queued] == [clone["id"]]
    both = cli_json(idle_service, "jobs", "list", "--status", "queued", "--status", "cancelled")
    assert {j["id"] for j in both} == {job_id, clone["id"]}

    # An action the state does not allow fails the command with the server's message.
    again = cli(idle_service, "jobs", "pause", job_id)
    assert again.returncode == 1 and "409" in again.stderr and "cancelled" in again.stderr


def _wait_for_job(service: LiveService, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with service.client() as client:
        while time.monotonic() < deadline:
            jobs = client.get("/v1/jobs", params={"name": name}).json()["data"]
            if jobs:
                return dict(jobs[0])
            time.sleep(0.2)
    raise TimeoutError(f"no job named {name} appeared")


def test_wait_exits_2_when_the_job_is_cancelled(
    idle_service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=16)
    path = job_file(tmp_path, "to-cancel", tiny_spec(tiny_model_dir, dataset, steps=2))
    argv, env = cli_command(idle_service, "jobs", "submit", "-f", str(path), "--wait")
    waiting = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job = _wait_for_job(idle_service, "to-cancel")
        assert cli(idle_service, "jobs", "cancel", job["id"]).returncode == 0
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 2, out + err
    assert f"job {job['id']} cancelled" in err


def test_timeouts_end_the_wait_with_exit_3_even_when_no_event_comes(
    idle_service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from twinkle_core.assets import write_text_dataset

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=16)
    path = job_file(tmp_path, "silent", tiny_spec(tiny_model_dir, dataset, steps=2))
    for mode in ("--follow", "--wait"):
        started = time.monotonic()
        result = cli(idle_service, "jobs", "submit", "-f", str(path), mode, "--timeout", "3", timeout=120)
        elapsed = time.monotonic() - started
        assert result.returncode == 3, mode + result.stdout + result.stderr
        assert "still queued after the 3.0 s timeout" in result.stderr
        # Well before the stream's 15 s keep-alive: the deadline does not wait for an event.
        assert elapsed < 14, (mode, elapsed)
    job = _wait_for_job(idle_service, "silent")
    watched = cli(idle_service, "jobs", "events", job["id"], "--follow", "--timeout", "2", timeout=120)
    assert watched.returncode == 3 and "job queued" in watched.stdout


def test_a_lora_jobs_model_is_trained_on_in_full_from_its_merged_weights(
    service: LiveService, tmp_path: Path, tiny_model_dir: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinkle_core.assets import write_text_dataset
    from twinkle_core.checkpoint import hf_model_dir

    dataset = write_text_dataset(tmp_path / "train.jsonl", n=32)
    lora_spec = {**tiny_spec(tiny_model_dir, dataset, steps=2, nproc=1), "adapter": {"r": 4}}
    lora_spec["optimizer"] = {"lr": 5e-2}  # an adapter that moves the weights visibly in 2 steps
    lora = cli_json(service, "jobs", "submit", "-f", str(job_file(tmp_path, "lora", lora_spec)), "--wait")
    assert lora["status"] == "succeeded", lora

    on_lora = job_file(tmp_path, "on-lora", tiny_spec(tiny_model_dir, dataset, steps=2, nproc=1))
    args = (
        "jobs",
        "submit",
        "-f",
        str(on_lora),
        "--set",
        f"model.model_id={lora['fine_tuned_model']}",
        "--wait",
    )
    full = cli_json(service, *args)
    assert full["status"] == "succeeded", str(full) + service.worker_log()
    assert full["spec"]["model"]["model_id"] == lora["fine_tuned_model"]
    with service.client() as client:
        events = client.get(f"/v1/jobs/{full['id']}/events", params={"limit": 100}).json()["data"]
    assert any(f"merging the LoRA adapter of job {lora['id']} (step 2)" in e["message"] for e in events)

    # What the job trained on: the LoRA job's adapter folded into its base, not the bare base.
    merged = service.data_dir / "jobs" / full["id"] / "base-model"
    adapter = hf_model_dir(service.data_dir / "jobs" / lora["id"] / "checkpoints" / "step-2")
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    bare = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    expected = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().state_dict()
    got = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.allclose(got[name], expected[name], atol=1e-6) for name in got)
    assert any(not torch.equal(got[name], bare[name]) for name in got)  # the adapter moved something
