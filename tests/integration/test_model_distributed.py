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
CONFIGS = [
    "ddp",
    "fsdp2",
    "ddp_lora",
    "fsdp2_lora",
    "ddp_bf16",
    "fsdp2_bf16",
    "ddp_fp16",
    "fsdp2_fp16",
    "fsdp2_hf",  # FSDP2 with the HF layout (hf_weights=True); plain "fsdp2" checkpoints are sharded
    "ddp_dcp_optimizer",  # a DDP checkpoint with the optimizer in DCP (`optimizer/`), as before optimizer.pt
]


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


def test_checkpoints_load_as_hf_models_in_either_layout(
    trained: dict[str, Any], tiny_model_dir: Path
) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from twinkle_core.checkpoint import hf_model_dir, is_complete, read_trainer_state

    work: Path = trained["work"]
    sharded, plain = work / "fsdp2" / "straight", work / "fsdp2_hf" / "straight"
    for full in (sharded, plain):
        assert is_complete(full)
        state = read_trainer_state(full)
        assert state["format_version"] == 1 and state["world_size"] == 2 and state["cur_step"] == 4
        assert (full / "tokenizer.json").is_file() and (full / "config.json").is_file()
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in full.iterdir()}
    # Sharded: each rank's shards of model and optimizer in one DCP save, no HF weights until read.
    assert read_trainer_state(sharded)["weights"] == "sharded"
    assert {p.name for p in (sharded / "dcp").iterdir()} >= {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert not (sharded / "model.safetensors").exists() and not (sharded / "optimizer").exists()
    assert read_trainer_state(plain)["weights"] == "hf" and hf_model_dir(plain) == plain
    consolidated = hf_model_dir(sharded)
    assert consolidated == sharded / "hf" and hf_model_dir(sharded) == consolidated
    # The two layouts of the same training hold the same weights, bit for bit.
    a, b = load_file(str(consolidated / "model.safetensors")), load_file(str(plain / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    AutoModelForCausalLM.from_pretrained(str(consolidated))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    PeftModel.from_pretrained(base, str(hf_model_dir(work / "fsdp2_lora" / "straight")))
    assert (work / "ddp_fp16" / "straight" / "scaler.pt").is_file()


def test_a_ddp_checkpoint_holds_the_optimizer_in_one_file(trained: dict[str, Any]) -> None:
    work: Path = trained["work"]
    for config in ("ddp", "ddp_lora", "ddp_bf16", "ddp_fp16"):
        for checkpoint in (work / config / "straight", work / config / "half"):
            assert (checkpoint / "optimizer.pt").is_file(), checkpoint
            assert not (checkpoint / "optimizer").exists(), checkpoint
    # FSDP2 shards the optimizer: beside HF weights it is still one DCP shard per rank.
    hf_layout = work / "fsdp2_hf" / "half"
    assert (hf_layout / "optimizer" / ".metadata").is_file() and not (hf_layout / "optimizer.pt").exists()
    # What test_exact_resume_in_a_new_process_is_bitwise resumed for ddp_dcp_optimizer:
    old_layout = work / "ddp_dcp_optimizer" / "half"
    assert (old_layout / "optimizer" / ".metadata").is_file() and not (old_layout / "optimizer.pt").exists()


def test_a_sharded_checkpoint_is_a_model_id(trained: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    from twinkle_core.checkpoint import hf_model_dir
    from twinkle_core.model import TransformersModel

    checkpoint = trained["work"] / "fsdp2_bf16" / "half"
    model = TransformersModel(model_id=str(checkpoint), mixed_precision="no")
    saved = load_file(str(hf_model_dir(checkpoint) / "model.safetensors"))
    loaded = model.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())


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
