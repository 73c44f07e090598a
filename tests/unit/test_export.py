"""twinkle_core.export in process, on checkpoints built here (no training): what each kind writes,
that a merge equals the adapter on its base, the dtype and kwargs rules, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinkle_core.export import ExportRequest, export_checkpoint, public_base_name

IDS = torch.tensor([[1, 4, 9, 16, 25, 36]])


@pytest.fixture(scope="module")
def lora_checkpoint(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.Tensor]:
    """A complete checkpoint holding a LoRA adapter (B non-zero, as after training) and the
    logits of base + adapter, unmerged."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tmp_path_factory.mktemp("lora-ckpt") / "step-5"
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    model.save_pretrained(str(directory))
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(str(directory))
    (directory / "trainer_state.json").write_text("{}")
    (directory / "COMPLETE").write_text("ok\n")
    with torch.no_grad():
        return directory, model.eval()(IDS).logits


def request(checkpoint: Path, out: Path, kind: str, **fields: object) -> ExportRequest:
    return ExportRequest(
        checkpoint_dir=str(checkpoint),
        output_dir=str(out),
        kind=kind,
        job_id="job-1",
        step=5,
        **fields,  # type: ignore[arg-type]
    )


def test_merged_equals_the_adapter_on_its_base(
    lora_checkpoint: tuple[Path, torch.Tensor], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    checkpoint, expected = lora_checkpoint
    # A GPU attention kernel the job trained with must not stop a CPU export.
    out = export_checkpoint(
        request(
            checkpoint,
            tmp_path / "merged",
            "merged",
            base_model=str(tiny_model_dir),
            base_model_name="org/tiny",
            kwargs={"attn_implementation": "flash_attention_2"},
        )
    )
    files = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "README.md",
    } <= files
    assert not files & {"COMPLETE", "trainer_state.json", "adapter_config.json"}
    assert not list(tmp_path.glob(".*partial"))
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(IDS).logits, expected, rtol=1e-4, atol=1e-4)
    card = (out / "README.md").read_text()
    assert "base model: `org/tiny`" in card and "job-1" in card and "step 5" in card
    assert "base_model:" not in card  # the job's base is a local path: no Hub link in the metadata


def test_the_adapter_alone_names_its_base(lora_checkpoint: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    checkpoint, _ = lora_checkpoint
    out = export_checkpoint(request(checkpoint, tmp_path / "a", "adapter", base_model_name="org/tiny"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "org/tiny" and config["inference_mode"] is True
    assert (out / "adapter_model.safetensors").read_bytes() == (
        checkpoint / "adapter_model.safetensors"
    ).read_bytes()
    assert "library_name: peft" in (out / "README.md").read_text()


def test_a_merge_keeps_the_dtype_the_job_loaded_its_base_in(
    lora_checkpoint: tuple[Path, torch.Tensor], tiny_model_dir: Path, tmp_path: Path
) -> None:
    checkpoint, _ = lora_checkpoint
    out = export_checkpoint(
        request(
            checkpoint,
            tmp_path / "bf16",
            "merged",
            base_model=str(tiny_model_dir),
            kwargs={"dtype": "bfloat16"},
        )
    )
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_refusals_name_the_reason(lora_checkpoint: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    checkpoint, _ = lora_checkpoint
    with pytest.raises(ValueError, match="holds a LoRA adapter"):
        export_checkpoint(request(checkpoint, tmp_path / "f", "full"))
    with pytest.raises(ValueError, match="no base weights to merge into"):
        export_checkpoint(request(checkpoint, tmp_path / "m", "merged", base_model=None))
    (tmp_path / "exists").mkdir()
    with pytest.raises(ValueError, match="exists already"):
        export_checkpoint(request(checkpoint, tmp_path / "exists", "adapter"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]  # nothing half-written left


def test_public_base_names() -> None:
    assert public_base_name("hf://org/name") == "org/name"
    assert public_base_name("ms://org/name") == "org/name"
    assert public_base_name("org/name") == "org/name"
    assert public_base_name("/models/base") == "/models/base"
    assert public_base_name(None) is None
