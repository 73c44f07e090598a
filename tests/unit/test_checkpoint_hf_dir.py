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


# --------------------------------------------------------------------- the sharded layout
def _sharded(model_dir: Path) -> TransformersModel:
    """Full-parameter FSDP2 in one process (a trivial gloo group): saves the sharded layout."""
    torch.manual_seed(0)
    model = TransformersModel(model_id=str(model_dir), strategy="native_fsdp", mixed_precision="no")
    model.set_optimizer("adamw", lr=1e-2)
    return model


def _step(model: TransformersModel) -> None:
    encoded = model.tokenizer(["a robot builds long books and old maps."], return_tensors="pt")
    model.forward_backward(inputs={**encoded, "labels": encoded["input_ids"].clone()})
    model.clip_grad_and_step()


def test_a_sharded_checkpoint_is_consolidated_once_even_when_raced(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoModelForCausalLM

    from twinkle_core.checkpoint import read_trainer_state
    from twinkle_core.model.state_io import full_model_state_dict

    model = _sharded(tiny_model_dir)
    _step(model)
    path = Path(model.save("step-1", output_dir=tmp_path, save_optimizer=True))
    assert read_trainer_state(path)["weights"] == "sharded"
    assert (path / "dcp" / ".metadata").is_file() and (path / "config.json").is_file()
    assert not (path / "model.safetensors").exists() and not (path / "optimizer").exists()

    # Four readers at once (inference, export, a job's model_id...): one answer, no debris.
    with ThreadPoolExecutor(4) as pool:
        answers = set(pool.map(hf_model_dir, [path] * 4))
    assert answers == {path / "hf"}
    assert not [p for p in path.iterdir() if p.name.startswith(".tmp-")]
    weights = path / "hf" / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert hf_model_dir(path) == path / "hf" and weights.stat().st_mtime_ns == written  # cached

    trained = full_model_state_dict(model.wrapped)
    loaded = AutoModelForCausalLM.from_pretrained(str(path / "hf")).state_dict()
    assert trained.keys() == loaded.keys()
    assert all(torch.equal(trained[k], loaded[k]) for k in trained)


def test_a_sharded_checkpoint_resumes_bitwise_and_hf_weights_true_writes_hf(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from twinkle_core.checkpoint import has_hf_weights, read_trainer_state
    from twinkle_core.model.state_io import full_model_state_dict

    model = _sharded(tiny_model_dir)
    _step(model)
    sharded = model.save("sharded", output_dir=tmp_path, save_optimizer=True)
    plain = model.save("plain", output_dir=tmp_path, save_optimizer=True, hf_weights=True)
    assert has_hf_weights(plain) and read_trainer_state(plain)["weights"] == "hf"
    with pytest.raises(ValueError, match="hf_weights must be True, False or None"):
        model.save("bad", output_dir=tmp_path, hf_weights="yes")  # type: ignore[arg-type]
    _step(model)
    expected = full_model_state_dict(model.wrapped)
    for checkpoint in (sharded, plain):
        again = _sharded(tiny_model_dir)
        assert again.resume_from_checkpoint(checkpoint)["cur_step"] == 1
        _step(again)
        state = full_model_state_dict(again.wrapped)
        assert all(torch.equal(expected[k], state[k]) for k in expected), checkpoint
    fresh = _sharded(tiny_model_dir)
    fresh.resume_from_checkpoint(sharded, resume_only_model=True)
    assert fresh.cur_step == 0
