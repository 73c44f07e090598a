"""Distributed checks of TransformersModel, launched by tests/integration/test_model_distributed.py.

`torchrun --nproc_per_node=N model_checks.py <phase> <work_dir> <model_dir> <data_file>` writes
`<work_dir>/<phase>-rank<R>.json` with what it measured; the test asserts on it. Phases:
- `train`: for every configuration, N straight steps saved as `straight`, N/2 steps saved as `half`;
  plus DDP vs FSDP2 and gradient-accumulation (4 x 1 vs 1 x 4) weight differences.
- `resume`: in a new process, every configuration resumes `half`, trains N/2 steps and compares
  its weights with `straight` bit for bit.
- `hsdp`: (4 ranks) hybrid sharding on a 2-D mesh and memory-efficient init against DDP.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from twinkle_core import DeviceMesh
from twinkle_core.checkpoint import hf_model_dir
from twinkle_core.dataloader import DataLoader
from twinkle_core.dataset import Dataset
from twinkle_core.model import TransformersModel, state_io
from twinkle_core.model.state_io import full_model_state_dict

STEPS = 4
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
CONFIGS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "accelerate", "mixed_precision": "no"},
    "fsdp2": {"strategy": "native_fsdp", "mixed_precision": "no", "fsdp": 2},
    "ddp_lora": {"strategy": "accelerate", "mixed_precision": "no", "lora": True},
    "fsdp2_lora": {"strategy": "native_fsdp", "mixed_precision": "no", "fsdp": 2, "lora": True},
    "ddp_bf16": {"strategy": "accelerate", "mixed_precision": "bf16"},
    "fsdp2_bf16": {"strategy": "native_fsdp", "mixed_precision": "bf16", "fsdp": 2},
    "ddp_fp16": {"strategy": "accelerate", "mixed_precision": "fp16"},
    "fsdp2_fp16": {"strategy": "native_fsdp", "mixed_precision": "fp16", "fsdp": 2},
    # FSDP2 checkpoints are sharded (DCP) by default; this one writes the HF weights instead.
    "fsdp2_hf": {"strategy": "native_fsdp", "mixed_precision": "no", "fsdp": 2, "hf_weights": True},
    # DDP whose `half` checkpoint holds the optimizer as checkpoints before optimizer.pt did (DCP).
    "ddp_dcp_optimizer": {"strategy": "accelerate", "mixed_precision": "no", "dcp_optimizer": True},
}


def build(model_dir: str, cfg: dict[str, Any], **extra: Any) -> TransformersModel:
    torch.manual_seed(0)
    world = int(os.environ["WORLD_SIZE"])
    fsdp = cfg.get("fsdp", 1)
    model = TransformersModel(
        model_id=model_dir,
        device_mesh=DeviceMesh.from_sizes(dp_size=world // fsdp, fsdp_size=fsdp),
        strategy=cfg["strategy"],
        mixed_precision=cfg["mixed_precision"],
        **extra,
    )
    adapter = None
    if cfg.get("lora"):
        adapter = "main"
        model.add_adapter_to_model("other", LORA)  # a second adapter that must stay untouched
        model.add_adapter_to_model(adapter, LORA)
    model.set_optimizer("adamw", adapter_name=adapter, lr=1e-3, weight_decay=0.01)
    model.set_lr_scheduler("linear", num_warmup_steps=1, num_training_steps=STEPS)
    return model


def loader(model: TransformersModel, data_file: str, batch_size: int = 4) -> DataLoader:
    dataset = Dataset(data_file, model.tokenizer, max_length=32)
    return DataLoader(dataset, batch_size=batch_size, device_mesh=model.device_mesh, seed=7)


def train(model: TransformersModel, data: DataLoader, steps: int, accumulation: int = 2) -> list[float]:
    losses: list[float] = []
    model.set_gradient_accumulation_steps(accumulation)
    while model.cur_step < steps:
        for batch in data:
            model.forward_backward(inputs=batch)
            result = model.clip_grad_and_step(max_grad_norm=1.0, gradient_accumulation_steps=accumulation)
            if result is not None:
                losses.append(result["loss"])
                if model.cur_step >= steps:
                    break
    return losses


def weights(model: TransformersModel) -> dict[str, torch.Tensor]:
    return full_model_state_dict(model.wrapped)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a)[:3], sorted(b)[:3])
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a) if a else 0.0


def bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def phase_train(work: Path, model_dir: str, data_file: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    finals: dict[str, dict[str, torch.Tensor]] = {}
    for name, cfg in CONFIGS.items():
        model = build(model_dir, cfg)
        data = loader(model, data_file)
        losses = train(model, data, STEPS)
        finals[name] = weights(model)
        model.save("straight", output_dir=work / name, save_optimizer=True, hf_weights=cfg.get("hf_weights"))
        model = build(model_dir, cfg)
        data = loader(model, data_file)
        train(model, data, STEPS // 2)
        consumed = data.get_state()["consumed_train_samples"]
        half = model.save(
            "half",
            output_dir=work / name,
            save_optimizer=True,
            consumed_train_samples=consumed,
            hf_weights=cfg.get("hf_weights"),
        )
        if cfg.get("dcp_optimizer"):
            to_dcp_optimizer(model, Path(half))
        out[name] = {"losses": losses}
        if cfg.get("lora"):
            state = finals[name]
            other = [k for k in state if ".lora_B.other." in k]
            main_b = [k for k in state if ".lora_B.main." in k]
            out[name]["main_adapter_trained"] = bool(main_b) and all(
                float(state[k].abs().max()) > 0.0 for k in main_b
            )
            out[name]["other_adapter_untouched"] = bool(other) and all(
                float(state[k].abs().max()) == 0.0 for k in other
            )
    if dist.get_rank() == 0:
        out["ddp_vs_fsdp2"] = max_diff(finals["ddp"], finals["fsdp2"])
        out["ddp_vs_fsdp2_lora"] = max_diff(finals["ddp_lora"], finals["fsdp2_lora"])
    # Gradient accumulation: 4 micro-batches of 1 sample per rank == 1 micro-batch of 4 per rank.
    for name in ("ddp", "fsdp2"):
        big = build(model_dir, CONFIGS[name])
        train(big, loader(big, data_file, batch_size=8), 2, accumulation=1)
        small = build(model_dir, CONFIGS[name])
        train(small, loader(small, data_file, batch_size=2), 2, accumulation=4)
        big_w, small_w = weights(big), weights(small)
        if dist.get_rank() == 0:
            out[f"accumulation_{name}"] = max_diff(big_w, small_w)
    return out


def to_dcp_optimizer(model: TransformersModel, checkpoint: Path) -> None:
    """Rewrite a DDP checkpoint's optimizer.pt as the DCP directory that held the optimizer before
    it (the same state: `model` has not stepped since the save). Every rank calls it."""
    assert model.optimizer is not None
    state_io.save_optimizer(model.wrapped, model.optimizer, checkpoint / state_io.OPTIMIZER_DIR)
    dist.barrier()
    if dist.get_rank() == 0:
        (checkpoint / state_io.OPTIMIZER_FILE).unlink()
    dist.barrier()


def phase_resume(work: Path, model_dir: str, data_file: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for name, cfg in CONFIGS.items():
        model = build(model_dir, cfg)
        data = loader(model, data_file)
        resumed = model.resume_from_checkpoint(work / name / "half")
        data.resume_from_checkpoint(resumed["consumed_train_samples"])
        train(model, data, STEPS)
        path = Path(model.save("resumed", output_dir=work / name, hf_weights=cfg.get("hf_weights")))
        weight_file = "adapter_model.safetensors" if cfg.get("lora") else "model.safetensors"
        # Every rank consolidates a sharded checkpoint at once: hf_model_dir must stand the race.
        straight = load_file(str(hf_model_dir(work / name / "straight") / weight_file))
        again = load_file(str(hf_model_dir(path) / weight_file))
        out[name] = {"resumed": resumed, "bitwise": bitwise(straight, again)}
    return out


def phase_hsdp(work: Path, model_dir: str, data_file: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    reference = build(model_dir, CONFIGS["ddp"])
    train(reference, loader(reference, data_file, batch_size=8), 2)
    ref_w = weights(reference)
    hsdp_cfg = {"strategy": "native_fsdp", "mixed_precision": "no", "fsdp": 2}
    hsdp = build(model_dir, hsdp_cfg)
    param = next(hsdp.wrapped.parameters())
    out["mesh_dims"] = list(param.device_mesh.mesh_dim_names)  # type: ignore[attr-defined]
    out["placements"] = [type(p).__name__ for p in param.placements]  # type: ignore[attr-defined]
    train(hsdp, loader(hsdp, data_file, batch_size=8), 2)
    hsdp_w = weights(hsdp)
    efficient = build(model_dir, hsdp_cfg, memory_efficient_init=True)
    eff_init = weights(efficient)
    plain_init = weights(build(model_dir, hsdp_cfg))
    # A 1-D mesh over all 4 ranks takes the direct-scatter path of memory-efficient init.
    flat_cfg = {"strategy": "native_fsdp", "mixed_precision": "no", "fsdp": 4}
    flat_eff_init = weights(build(model_dir, flat_cfg, memory_efficient_init=True))
    train(efficient, loader(efficient, data_file, batch_size=8), 2)
    eff_w = weights(efficient)
    inv_freq = dict(efficient.model.named_buffers())["model.rotary_emb.inv_freq"]
    gathered = [torch.empty_like(inv_freq) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, inv_freq.contiguous())
    out["inv_freq_equal_on_ranks"] = all(torch.equal(gathered[0], g) for g in gathered)
    if dist.get_rank() == 0:
        out["ddp_vs_hsdp"] = max_diff(ref_w, hsdp_w)
        out["efficient_init_bitwise"] = bitwise(eff_init, plain_init)
        out["flat_efficient_init_bitwise"] = bitwise(flat_eff_init, plain_init)
        out["ddp_vs_efficient"] = max_diff(ref_w, eff_w)
    return out


def main() -> None:
    phase, work, model_dir, data_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    phases = {"train": phase_train, "resume": phase_resume, "hsdp": phase_hsdp}
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    result = phases[phase](work, model_dir, data_file)
    rank = int(os.environ["RANK"])
    (work / f"{phase}-rank{rank}.json").write_text(json.dumps(result, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown, as twinkle_core.train's entry point does: under
    # load a rank aborted in C++ static destruction ("terminate called without an active
    # exception", SIGABRT) after its result was written (CI, 12-04, the four-rank HSDP phase).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
