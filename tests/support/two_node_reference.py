"""The 2-node reference that the cluster-engine launchers are held to (issue 18: a 2-node job
through Ray or Slurm ends with the same losses as a 2-node torchrun gang of the same spec).

`two_node_spec` is the spec every such test trains (4 steps, a checkpoint every 2, seed 7, one
rank per node, gloo on CPU), differing only in `resources.launcher`. `start_gang_run` runs it as
worker.gang's nodes run it (two torchruns joined by the c10d rendezvous, on loopback), in the
background, so that it trains while the engine's job does; tests/integration/conftest.py's
session-scoped `gang_reference` starts it once for every module that compares with it.
`assert_same_training` compares a job directory with it: every step's loss, and the final
weights bit for bit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

MAX_STEPS = 4


def two_node_spec(tiny_model_dir: Path, text_dataset: Path, launcher: str) -> dict[str, Any]:
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
        "resources": {"nnodes": 2, "nproc_per_node": 1, "launcher": launcher},
    }


def step_losses(job_dir: Path) -> dict[int, float]:
    """Loss per step from progress.jsonl; a resumed run's lines replace the lost ones."""
    losses = {}
    for line in (job_dir / "progress.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step":
            losses[event["step"]] = event["loss"]
    return losses


def final_weights(job_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    checkpoint = job_dir / "checkpoints" / f"step-{MAX_STEPS}"
    assert (checkpoint / "COMPLETE").exists(), sorted(p.name for p in checkpoint.parent.iterdir())
    weights: dict[str, Any] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    assert weights
    return weights


def assert_same_training(job_dir: Path, reference_dir: Path) -> None:
    """Every step's loss and the final weights (bit for bit) of `job_dir` are the reference's."""
    import torch

    assert sorted(step_losses(reference_dir)) == list(range(1, MAX_STEPS + 1))
    assert step_losses(job_dir) == step_losses(reference_dir)
    expected, got = final_weights(reference_dir), final_weights(job_dir)
    assert expected.keys() == got.keys()
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []


class GangRun:
    """The reference run, started in the background: it trains while the engine's job does."""

    def __init__(self, job_dir: Path, procs: list[subprocess.Popen[bytes]]) -> None:
        self.job_dir, self.procs = job_dir, procs

    def result(self) -> Path:
        """Its job directory, once both nodes exited 0 (at once when they already have)."""
        codes = [proc.wait(timeout=300) for proc in self.procs]
        assert codes == [0, 0], (self.job_dir / "logs" / "attempt-1.log").read_text()[-3000:]
        return self.job_dir

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_gang_run(job_dir: Path, tiny_model_dir: Path, text_dataset: Path) -> GangRun:
    """`two_node_spec` as a 2-node torchrun gang (what worker.gang's nodes run), on loopback."""
    from worker.launch import AttemptPaths, Rendezvous, free_port, resolve_torchrun, runner_env, torchrun_argv

    (job_dir / "spec.json").write_text(json.dumps(two_node_spec(tiny_model_dir, text_dataset, "torchrun")))
    port, procs = free_port(), []
    for node in (0, 1):
        paths = AttemptPaths(job_dir, 1, node)
        rendezvous = Rendezvous(2, node, "127.0.0.1", port, join_timeout_seconds=120)
        argv = torchrun_argv(resolve_torchrun("torchrun"), 1, paths, None, "twinkle_core.train", rendezvous)
        env = {**runner_env("gang", job_dir, []), "HF_HUB_OFFLINE": "1"}
        paths.log.parent.mkdir(parents=True, exist_ok=True)
        with open(paths.log, "wb") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    return GangRun(job_dir, procs)
