"""CUDA only (tests/integration/test_model_gpu.py): the default strategy with an FSDP mesh runs
accelerate's own FSDP2 (hybrid sharding through its ParallelismConfig on a 2-D mesh), trains, and
saves and resumes. Usage: accelerate_fsdp_gpu.py MODEL_DIR OUT_DIR DP_SIZE FSDP_SIZE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from twinkle import DeviceMesh
from twinkle.model import TransformersModel
from twinkle_core.model.strategies import AccelerateStrategy

model_dir, out = sys.argv[1], Path(sys.argv[2])
dp, fsdp = int(sys.argv[3]), int(sys.argv[4])


def build() -> TransformersModel:
    torch.manual_seed(0)
    model = TransformersModel(
        model_id=model_dir, device_mesh=DeviceMesh.from_sizes(dp_size=dp, fsdp_size=fsdp)
    )
    model.set_optimizer("adamw", lr=1e-3)
    return model


def batch(model: TransformersModel) -> dict[str, torch.Tensor]:
    encoded = model.tokenizer(["the cat likes small boats."] * 4, padding=True, return_tensors="pt")
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    return {**encoded, "labels": labels}


model = build()
assert isinstance(model.strategy, AccelerateStrategy), type(model.strategy)
losses = []
for _ in range(3):
    model.forward_backward(inputs=batch(model))
    result = model.clip_grad_and_step()
    assert result is not None
    losses.append(result["loss"])
sharded = all(isinstance(p, DTensor) for p in model.wrapped.parameters())
mesh_dims = next(iter(model.wrapped.parameters())).device_mesh.ndim  # type: ignore[attr-defined]
checkpoint = model.save("ckpt", output_dir=out, save_optimizer=True)
resumed = build()
progress = resumed.resume_from_checkpoint(checkpoint)
if int(os.environ["RANK"]) == 0:
    report = {
        "implementation": model.strategy.implementation,
        "losses": losses,
        "sharded": sharded,
        "mesh_dims": mesh_dims,
        "resumed_step": progress["cur_step"],
    }
    (out / "report.json").write_text(json.dumps(report))
