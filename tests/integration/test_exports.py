"""Exports end to end: a real server and worker on the embedded defaults (SQLite, the SQLite
broker: what `twinkle-jobs up` runs) train a tiny LoRA job and a tiny full job; their checkpoints
are exported through the API (the CLI for one, the client for the others), downloaded, unpacked,
and loaded in a fresh Python process that has neither this repository on `sys.path` nor any of
our packages importable: plain `AutoModelForCausalLM` / `PeftModel.from_pretrained` only.

The merged model's logits must equal the trained model's (the base with its adapter, unmerged,
as our library restores it from the checkpoint) within fp32 tolerance, and must differ from the
base's (the merge did something)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_service import TOKEN, LiveService, tiny_spec

from twinkle_client import TwinkleClient

pytestmark = pytest.mark.slow

STEPS = 2
REPO_ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = ("twinkle_core", "twinkle", "jobcore", "server", "worker", "twinkle_cli", "twinkle_client")
INPUT_IDS = [[1, 5, 9, 14, 3, 7, 22, 40]]

# Runs with `python -I` from a directory outside the repository: it refuses every import of ours
# (an editable install would otherwise find them), loads each export with plain transformers /
# peft, generates, and prints the logits of INPUT_IDS as JSON.
FRESH_LOADER = """
import importlib.abc, json, sys

OURS = set(sys.argv[1].split(","))
REPO = sys.argv[2]

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OURS:
            raise ImportError(f"{name} must not be needed to load an export")
        return None

sys.meta_path.insert(0, Refuse())
# The repository itself, never the interpreter's site-packages (the venv may live inside it).
sys.path[:] = [p for p in sys.path if p and (not p.startswith(REPO) or "site-packages" in p)]

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

merged_dir, adapter_dir, full_dir, input_ids = sys.argv[3], sys.argv[4], sys.argv[5], json.loads(sys.argv[6])
out = {}
models = {"merged": AutoModelForCausalLM.from_pretrained(merged_dir)}
models["full"] = AutoModelForCausalLM.from_pretrained(full_dir)
base_name = json.load(open(f"{adapter_dir}/adapter_config.json"))["base_model_name_or_path"]
models["adapter"] = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_name), adapter_dir)
ids = torch.tensor(input_ids)
for name, model in models.items():
    model.eval()
    with torch.no_grad():
        out[name] = model(ids).logits.tolist()
tokenizer = AutoTokenizer.from_pretrained(merged_dir)
prompt = tokenizer("the cat", return_tensors="pt")
generated = models["merged"].generate(**prompt, max_new_tokens=5, do_sample=False)
out["generated_tokens"] = int(generated.shape[1] - prompt["input_ids"].shape[1])
out["ours_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in OURS)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> Iterator[dict[str, Any]]:
    """The live service, and a LoRA job and a full job that both trained STEPS steps."""
    tmp = tmp_path_factory.mktemp("exports")
    service = LiveService.configure(tmp, [tiny_model_dir, text_dataset.parent])
    try:
        service.start_server()
        service.start_worker(concurrency=2)
        jobs = {}
        with service.client() as http:
            for name, adapter in (("lora", {"r": 4, "lora_alpha": 8}), ("full", None)):
                spec = tiny_spec(tiny_model_dir, text_dataset, steps=STEPS, nproc=1, save_every=1)
                spec["optimizer"]["lr"] = 1e-2  # enough for the weights to move visibly in 2 steps
                spec["adapter"] = adapter
                response = http.post("/v1/jobs", json={"name": name, "spec": spec})
                assert response.status_code == 201, response.text
                jobs[name] = response.json()["id"]
        for job_id in jobs.values():
            job = service.wait_terminal(job_id, timeout=240)
            assert job["status"] == "succeeded", (job, service.worker_log())
        yield {"service": service, "jobs": jobs, "tmp": tmp}
    finally:
        service.stop()


def cli(service: LiveService, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TWINKLE_URL": service.url, "TWINKLE_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "twinkle_cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def trained_lora_logits(tiny_model_dir: Path, checkpoint: Path) -> Any:
    """The LoRA job's model as training left it: base + adapter, restored by our library."""
    import torch

    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="no")
    model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    model.resume_from_checkpoint(checkpoint, resume_only_model=True)
    module = model.model.eval()
    with torch.no_grad():
        return module(torch.tensor(INPUT_IDS)).logits


def test_exports_load_and_generate_with_plain_transformers_and_peft(
    trained: dict[str, Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    service: LiveService = trained["service"]
    lora, full = trained["jobs"]["lora"], trained["jobs"]["full"]

    # The CLI: waits for the worker, downloads and unpacks (the default kind of a LoRA job: merged).
    run = cli(
        service, "checkpoints", "export", lora, str(STEPS), "--dest", str(tmp_path / "merged"), "-o", "json"
    )
    assert run.returncode == 0, run.stderr + service.worker_log()
    merged_export = json.loads(run.stdout)
    assert (merged_export["kind"], merged_export["status"]) == ("merged", "succeeded")
    assert merged_export["path"] == str(tmp_path / "merged") and merged_export["size_bytes"] > 0

    with TwinkleClient(service.url, TOKEN) as client:
        assert client.exports.create(lora, STEPS)["id"] == merged_export["id"]  # idempotent
        adapter = client.exports.create(lora, STEPS, merge=False)
        whole = client.exports.create(full, STEPS)
        for export in (adapter, whole):
            done = client.exports.wait(export["id"], timeout=180)
            assert done["status"] == "succeeded", (done, service.worker_log())
        client.exports.download_folder(adapter["id"], tmp_path / "adapter")
        archive = client.exports.download(whole["id"], tmp_path / "full.tar")
        listed = [e["kind"] for e in client.exports.list(lora)]
    assert sorted(listed) == ["adapter", "merged"]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "full-unpacked", filter="data")
    (full_dir,) = (tmp_path / "full-unpacked").iterdir()
    assert full_dir.name == f"{full}-step-{STEPS}-full"

    # Plain HF folders: weights, config, tokenizer and card; nothing of the training state.
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    for folder in (merged_dir, full_dir):
        files = {p.name for p in folder.iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "README.md",
        } <= files
        assert not files & {"COMPLETE", "trainer_state.json", "optimizer", "scheduler.pt", "rng_state_0.pth"}
    assert {p.name for p in adapter_dir.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_model_dir
    )
    card = (merged_dir / "README.md").read_text()
    assert lora in card and f"step {STEPS}" in card and str(tiny_model_dir) in card
    assert all(n.startswith(f"{full}-step-{STEPS}-full/") for n in names)

    # A fresh interpreter without our packages loads all three and generates.
    fresh = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            FRESH_LOADER,
            ",".join(OUR_PACKAGES),
            str(REPO_ROOT),
            str(merged_dir),
            str(adapter_dir),
            str(full_dir),
            json.dumps(INPUT_IDS),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    loaded = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert loaded["ours_loaded"] == [] and loaded["generated_tokens"] == 5

    # The merged model is the trained model; the adapter on its base is too; the full export is
    # the full job's checkpoint.
    checkpoints = service.data_dir / "jobs"
    trained_logits = trained_lora_logits(tiny_model_dir, checkpoints / lora / "checkpoints" / f"step-{STEPS}")
    merged_logits, adapter_logits = torch.tensor(loaded["merged"]), torch.tensor(loaded["adapter"])
    torch.testing.assert_close(merged_logits, trained_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(adapter_logits, trained_logits, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    with torch.no_grad():
        base_logits = base(torch.tensor(INPUT_IDS)).logits
    assert (merged_logits - base_logits).abs().max() > 1e-3, "the merge changed nothing"
    full_checkpoint = AutoModelForCausalLM.from_pretrained(
        str(checkpoints / full / "checkpoints" / f"step-{STEPS}")
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            torch.tensor(loaded["full"]),
            full_checkpoint(torch.tensor(INPUT_IDS)).logits,
            rtol=1e-5,
            atol=1e-5,
        )


def test_a_failed_export_says_why_the_cli_exits_1_and_a_new_request_retries_it(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The worker's failure reaches the API and the CLI: the step-1 checkpoint of the full job is
    complete (the API accepts it) but its weights are gone; once they are back, asking again
    queues the same export again and it succeeds."""
    service: LiveService = trained["service"]
    full = trained["jobs"]["full"]
    weights = service.data_dir / "jobs" / full / "checkpoints" / "step-1" / "model.safetensors"
    moved = weights.with_name("model.safetensors.moved")
    weights.rename(moved)
    try:
        run = cli(service, "checkpoints", "export", full, "1", "--dest", str(tmp_path / "x"), "-o", "json")
        assert run.returncode == 1, run.stdout + run.stderr
        failed = json.loads(run.stdout)
        assert failed["status"] == "failed" and "weights" in failed["error"]  # whose are missing
        assert not (tmp_path / "x").exists()
    finally:
        moved.rename(weights)
    run = cli(service, "checkpoints", "export", full, "1", "--dest", str(tmp_path / "x"), "-o", "json")
    assert run.returncode == 0, run.stderr
    retried = json.loads(run.stdout)
    assert retried["id"] == failed["id"] and retried["status"] == "succeeded" and retried["error"] is None
    assert (tmp_path / "x" / "model.safetensors").is_file()
