"""TransformersModel under torchrun with gloo: DDP, FSDP2, HSDP, LoRA, precisions, exact resume.

Three launches cover everything (each launch costs seconds of start-up, so the checks are batched
in tests/integration/dist_scripts/model_checks.py and asserted here).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from dist_scripts.launch import SCRIPTS, torchrun

pytestmark = pytest.mark.slow

SCRIPT = str(SCRIPTS / "model_checks.py")
CONFIGS = ["ddp", "fsdp2", "ddp_lora", "fsdp2_lora", "ddp_bf16", "fsdp2_bf16", "ddp_fp16", "fsdp2_fp16"]


def _launch(phase: str, work: Path, model_dir: Path, data: Path, nproc: int = 2) -> dict[str, Any]:
    proc = torchrun([SCRIPT, phase, str(work), str(model_dir), str(data)], nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((work / f"{phase}-rank0.json").read_text())


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("model-checks")
    first = _launch("train", work, tiny_model_dir, text_dataset)
    second = _launch("resume", work, tiny_model_dir, text_dataset)
    return {"work": work, "train": first, "resume": second}


def test_ddp_and_fsdp2_give_the_same_weights(trained: dict[str, Any]) -> None:
    assert trained["train"]["ddp_vs_fsdp2"] <= 1e-6
    assert trained["train"]["ddp_vs_fsdp2_lora"] <= 1e-6


def test_gradient_accumulation_4x1_equals_1x4(trained: dict[str, Any]) -> None:
    assert trained["train"]["accumulation_ddp"] <= 1e-6
    assert trained["train"]["accumulation_fsdp2"] <= 1e-6


@pytest.mark.parametrize("config", CONFIGS)
def test_exact_resume_in_a_new_process_is_bitwise(trained: dict[str, Any], config: str) -> None:
    resumed = trained["resume"][config]
    assert resumed["resumed"] == {
        "cur_step": 2,
        "consumed_train_samples": 16,
        "gradient_accumulation_steps": 2,
    }
    assert resumed["bitwise"], f"{config}: N/2 + save + resume + N/2 differs from N straight steps"


@pytest.mark.parametrize("config", CONFIGS)
def test_training_reduces_the_loss(trained: dict[str, Any], config: str) -> None:
    losses = trained["train"][config]["losses"]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    if "lora" in config:
        # LoRA at lr 1e-3 moves the loss by less than batch-to-batch noise in 4 steps.
        assert trained["train"][config]["main_adapter_trained"]
    else:
        assert losses[-1] < losses[0]


def test_only_the_chosen_adapter_trains(trained: dict[str, Any]) -> None:
    assert trained["train"]["ddp_lora"]["other_adapter_untouched"]
    assert trained["train"]["fsdp2_lora"]["other_adapter_untouched"]


def test_checkpoints_are_plain_hf_and_load_back(trained: dict[str, Any], tiny_model_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinkle_core.checkpoint import is_complete, read_trainer_state

    work: Path = trained["work"]
    full = work / "fsdp2" / "straight"
    assert is_complete(full)
    state = read_trainer_state(full)
    assert state["format_version"] == 1 and state["world_size"] == 2 and state["cur_step"] == 4
    assert (full / "tokenizer.json").is_file() and (full / "optimizer").is_dir()
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in full.iterdir()}
    AutoModelForCausalLM.from_pretrained(str(full))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    PeftModel.from_pretrained(base, str(work / "fsdp2_lora" / "straight"))
    assert (work / "ddp_fp16" / "straight" / "scaler.pt").is_file()


def test_checkpoint_without_marker_is_refused(trained: dict[str, Any], tmp_path: Path) -> None:
    from twinkle_core.checkpoint import COMPLETE_MARKER
    from twinkle_core.model import TransformersModel

    broken = tmp_path / "broken"
    shutil.copytree(trained["work"] / "ddp" / "straight", broken)
    (broken / COMPLETE_MARKER).unlink()
    with pytest.raises(ValueError, match="COMPLETE"):
        TransformersModel(model_id=str(broken), mixed_precision="no")


def test_hybrid_sharding_and_memory_efficient_init_on_four_ranks(
    tmp_path: Path, tiny_model_dir: Path, text_dataset: Path
) -> None:
    result = _launch("hsdp", tmp_path, tiny_model_dir, text_dataset, nproc=4)
    assert result["mesh_dims"] == ["dp", "fsdp"]
    assert result["placements"] == ["Replicate", "Shard"]
    assert result["ddp_vs_hsdp"] <= 1e-6
    assert result["efficient_init_bitwise"], "memory-efficient init must give rank 0's weights everywhere"
    assert result["flat_efficient_init_bitwise"], "the same on a 1-D mesh (direct scatter)"
    assert result["inv_freq_equal_on_ranks"], "non-persistent buffers must be rebroadcast after to_empty"
    assert result["ddp_vs_efficient"] <= 1e-6
