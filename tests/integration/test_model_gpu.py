"""CUDA-only checks (run by bench/gpu.sh on a GPU machine): real fp8 training and CUDA precisions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batch(model: object, texts: list[str]) -> dict[str, torch.Tensor]:
    encoded = model.tokenizer(texts, padding=True, return_tensors="pt")  # type: ignore[attr-defined]
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9), reason="fp8 needs sm_89+"
)
def test_fp8_trains_with_float8_linear_layers(tiny_model_dir: Path) -> None:
    pytest.importorskip("torchao")
    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="fp8")
    model.set_optimizer("adamw", lr=1e-3)
    batch = _batch(model, ["the cat likes small boats."] * 16)
    losses = []
    for _ in range(5):
        model.forward_backward(inputs=batch)
        result = model.clip_grad_and_step()
        assert result is not None
        losses.append(result["loss"])
    float8 = [m for m in model.model.modules() if type(m).__name__ == "Float8Linear"]
    assert float8, "no layer was converted to fp8"
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "no"])
def test_cuda_precisions_train(tiny_model_dir: Path, precision: str) -> None:
    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision=precision)
    model.set_optimizer("adamw", lr=1e-3)
    batch = _batch(model, ["a robot builds long books."] * 8)
    model.forward_backward(inputs=batch)
    result = model.clip_grad_and_step()
    assert result is not None and torch.isfinite(torch.tensor(result["loss"]))
    assert next(model.model.parameters()).device.type == "cuda"


@pytest.mark.slow
@pytest.mark.parametrize(("dp", "fsdp"), [(1, 2), (2, 2)])
def test_default_strategy_shards_through_accelerate_fsdp2(
    tmp_path: Path, tiny_model_dir: Path, dp: int, fsdp: int
) -> None:
    """On CUDA strategy='accelerate' with an FSDP mesh is accelerate's own FSDP2 (HSDP on 2-D)."""
    import json

    from dist_scripts.launch import SCRIPTS, torchrun

    if torch.cuda.device_count() < dp * fsdp:
        pytest.skip(f"needs {dp * fsdp} GPUs, this machine has {torch.cuda.device_count()}")
    script = str(SCRIPTS / "accelerate_fsdp_gpu.py")
    proc = torchrun([script, str(tiny_model_dir), str(tmp_path), str(dp), str(fsdp)], nproc=dp * fsdp)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["implementation"].startswith("accelerate FSDP2"), report
    assert report["sharded"] and report["mesh_dims"] == (2 if dp > 1 else 1), report
    assert report["losses"][-1] < report["losses"][0] and report["resumed_step"] == 3
