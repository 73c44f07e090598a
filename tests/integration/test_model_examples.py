"""The seed's usage example and the cookbook (cookbook/transformers/fsdp2.py) run as documented."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from dist_scripts.launch import REPO_ROOT, SCRIPTS, torchrun

from twinkle_core.checkpoint import is_complete, read_trainer_state
from twinkle_core.hub import COMPLETE_MARKER

pytestmark = pytest.mark.slow

COOKBOOK = str(REPO_ROOT / "cookbook" / "transformers" / "fsdp2.py")


def test_seed_usage_example_on_four_ranks(
    tmp_path: Path, tiny_model_dir: Path, text_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local stand-in for the hub: the ms:// id is found in the download cache, never fetched.
    cached = tmp_path / "hub" / "ms" / "Qwen--Qwen3.5-4B"
    shutil.copytree(tiny_model_dir, cached)
    (cached / COMPLETE_MARKER).write_text("Qwen/Qwen3.5-4B")
    monkeypatch.setenv("TWINKLE_HUB_CACHE", str(tmp_path / "hub"))
    proc = torchrun([str(SCRIPTS / "seed_usage_example.py"), str(tmp_path), str(text_dataset)], nproc=4)
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads((tmp_path / "usage-rank0.json").read_text())
    # 64 samples / global batch 4 = 16 micro-batches = 4 optimizer steps of 4 micro-batches.
    assert result["micro_batches"] == 16 and len(result["losses"]) == 4
    assert json.loads((tmp_path / "usage-rank3.json").read_text())["losses"] == result["losses"]


def test_cookbook_interrupt_and_resume(tmp_path: Path) -> None:
    output = tmp_path / "fsdp2"
    first = torchrun([COOKBOOK, "--output-dir", str(output), "--max-steps", "4", "--stop-at", "2"])
    assert first.returncode == 0, first.stderr[-4000:]
    assert "stopped at step 2" in first.stdout
    checkpoint = output / "last-checkpoint"
    assert is_complete(checkpoint) and read_trainer_state(checkpoint)["cur_step"] == 2
    second = torchrun([COOKBOOK, "--output-dir", str(output), "--max-steps", "4", "--resume"])
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {checkpoint} at step 2" in second.stdout
    steps = [line.split(":")[0] for line in second.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 3", "step 4"]
    state = read_trainer_state(checkpoint)
    assert state["cur_step"] == 4 and state["consumed_train_samples"] == 4 * 4 * 2
