"""`twinkle_core.checkpoint.hf_model_dir`: the plain Hugging Face view of a complete checkpoint.

Inference, export and `model_id=<checkpoint>` load a checkpoint through it without knowing its
layout; these tests hold it to what those callers do with the answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinkle_core.checkpoint import COMPLETE_MARKER, hf_model_dir
from twinkle_core.model import TransformersModel


def _trained(model_dir: Path, adapter: bool) -> TransformersModel:
    torch.manual_seed(0)
    model = TransformersModel(model_id=str(model_dir), mixed_precision="no")
    if adapter:
        model.add_adapter_to_model("default", {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})
    model.set_optimizer("adamw", lr=1e-2)
    encoded = model.tokenizer(["the cat likes small boats."], return_tensors="pt")
    model.forward_backward(inputs={**encoded, "labels": encoded["input_ids"].clone()})
    model.clip_grad_and_step()
    return model


def test_a_full_checkpoint_loads_with_from_pretrained(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _trained(tiny_model_dir, adapter=False)
    path = model.save("step-1", output_dir=tmp_path, save_optimizer=True)
    directory = hf_model_dir(path)
    loaded = AutoModelForCausalLM.from_pretrained(str(directory))
    for (name, trained), again in zip(model.model.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(trained, again), name
    assert AutoTokenizer.from_pretrained(str(directory)).vocab_size == model.tokenizer.vocab_size


def test_a_lora_checkpoint_loads_with_peft(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = _trained(tiny_model_dir, adapter=True)
    path = model.save("step-1", output_dir=tmp_path, save_optimizer=True)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    loaded = PeftModel.from_pretrained(base, str(hf_model_dir(path)))
    trained = {k: v for k, v in model.model.state_dict().items() if "lora_" in k}
    again = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert trained and trained.keys() == again.keys()
    assert all(torch.equal(trained[k], again[k]) for k in trained)


def test_only_a_complete_checkpoint_has_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = Path(_trained(tiny_model_dir, adapter=False).save("step-1", output_dir=tmp_path))
    (path / COMPLETE_MARKER).unlink()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        hf_model_dir(path)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        hf_model_dir(tmp_path / "missing")
