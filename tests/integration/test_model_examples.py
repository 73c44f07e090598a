"""The cookbook (cookbook/transformers/fsdp2.py) runs as documented: the default strategy on a
2 x 2 hybrid-sharded mesh, interrupted and resumed, ends bitwise equal to an uninterrupted run.

(The seed's own usage example is tests/integration/test_seed_example.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_scripts.launch import REPO_ROOT, torchrun

from twinkle.checkpoint import is_complete, read_trainer_state

pytestmark = pytest.mark.slow

COOKBOOK = str(REPO_ROOT / "cookbook" / "transformers" / "fsdp2.py")
# 4 ranks: dp 2 x fsdp 2 (hybrid sharding); the default strategy; a full fine-tune.
HYBRID = ["--fsdp-size", "2", "--max-steps", "4"]


def model_weights(checkpoint: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    from twinkle_core.checkpoint import hf_model_dir

    # FSDP2 checkpoints are sharded: hf_model_dir consolidates them (as inference and export do).
    return dict(load_file(str(hf_model_dir(checkpoint) / "model.safetensors")))


def test_cookbook_default_strategy_on_a_2x2_mesh_resumes_bitwise(tmp_path: Path) -> None:
    import torch

    whole = torchrun([COOKBOOK, "--output-dir", str(tmp_path / "whole"), *HYBRID], nproc=4)
    assert whole.returncode == 0, whole.stderr[-4000:]
    assert "strategy='accelerate' runs as native FSDP2 (fully_shard), hybrid sharding (dp 2 x fsdp 2)" in (
        whole.stderr
    )

    output = tmp_path / "interrupted"
    first = torchrun([COOKBOOK, "--output-dir", str(output), *HYBRID, "--stop-at", "2"], nproc=4)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "stopped at step 2" in first.stdout
    checkpoint = output / "last-checkpoint"
    assert is_complete(checkpoint) and read_trainer_state(checkpoint)["cur_step"] == 2
    assert read_trainer_state(checkpoint)["strategy"] == "accelerate"

    second = torchrun([COOKBOOK, "--output-dir", str(output), *HYBRID, "--resume"], nproc=4)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {checkpoint} at step 2" in second.stdout
    steps = [line.split(":")[0] for line in second.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 3", "step 4"]
    state = read_trainer_state(checkpoint)
    assert state["cur_step"] == 4 and state["consumed_train_samples"] == 4 * 4 * 2

    resumed, reference = model_weights(checkpoint), model_weights(tmp_path / "whole" / "last-checkpoint")
    assert resumed.keys() == reference.keys() and resumed
    different = [k for k in resumed if not torch.equal(resumed[k], reference[k])]  # type: ignore[arg-type]
    assert not different, f"resumed weights differ from the uninterrupted run: {different[:5]}"
