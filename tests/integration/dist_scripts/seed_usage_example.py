"""The seed's usage example (shared/seed/TransformersModel.md), on a tiny model, as written there.

Differences, each forced by the test machine and stated here: the `ms://` id resolves from a
pre-filled hub cache (no network); `strategy="native_fsdp"` because accelerate cannot shard on CPU
(it would silently run DDP; TransformersModel refuses that); the `...` are filled in.
Writes `<out>/usage-rank<R>.json` with the losses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from twinkle_core import DeviceMesh
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset
from twinkle_core.model import TransformersModel

out, data_file = Path(sys.argv[1]), sys.argv[2]
model = TransformersModel(
    model_id="ms://Qwen/Qwen3.5-4B",
    device_mesh=DeviceMesh.from_sizes(dp_size=2, fsdp_size=2),
    remote_group="actor",
    strategy="native_fsdp",
)
dataloader = DataLoader(
    Dataset(data_file, model.tokenizer, max_length=32), batch_size=4, device_mesh=model.device_mesh
)
model.add_adapter_to_model("actor-lora", {"r": 4, "lora_alpha": 8})
model.set_optimizer("adamw", adapter_name="actor-lora", lr=1e-3)
losses = []
for data in dataloader:
    model.forward_backward(inputs=data, adapter_name="actor-lora")
    result = model.clip_grad_and_step(
        max_grad_norm=1.0, gradient_accumulation_steps=4, adapter_name="actor-lora"
    )
    if result is not None:
        losses.append(result["loss"])
rank = os.environ["RANK"]
(out / f"usage-rank{rank}.json").write_text(json.dumps({"losses": losses, "micro_batches": len(dataloader)}))
