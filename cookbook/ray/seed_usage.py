"""The seed's usage example (shared/seed/TransformersModel.md) as a Ray driver script.

    python cookbook/ray/seed_usage.py --max-steps 6                   # Ray: 2 actors, local Ray on CPU
    python cookbook/ray/seed_usage.py --max-steps 6 --stop-at 3       # ... "interrupted" after step 3
    python cookbook/ray/seed_usage.py --max-steps 6 --resume          # ... continues at step 4
    torchrun --nproc_per_node=2 cookbook/ray/seed_usage.py --mode local --max-steps 6   # same, torchrun

The training code is the seed's, with its `twinkle` imports and default strategy, a tiny local
model (built here when --model-id is not given) and the `...` filled in (LoRA r=4 on all linear
layers, AdamW lr=1e-3, max_grad_norm=1.0, 64-token samples in batches of 4). Deviations, all
listed in docs/ray.md: the mesh has 2 ranks (dp 1 x fsdp 2) instead of 4 (--world-size);
`gradient_accumulation_steps=2` instead of 16 (so that the 64 demo samples make several
optimizer steps); a cosine LR schedule is added; the loop runs over
several epochs up to --max-steps, with checkpoints and logging around it (`build`, `train`). In
Ray mode `remote_group='actor'` puts the model in one Ray actor per rank and the DataLoader runs
once, here, feeding both; under torchrun (`--mode local`) the very same calls run in each rank's
process. Both runs produce bitwise identical weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

import twinkle
from twinkle import DeviceMesh
from twinkle.checkpoint import is_complete
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset
from twinkle.model import TransformersModel
from twinkle.remote import shutdown

CHECKPOINT = "last-checkpoint"
ADAPTER = "actor-lora"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["ray", "local"], default="ray")
    parser.add_argument(
        "--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a new one)"
    )
    parser.add_argument("--world-size", type=int, default=2, help="ranks (Ray actors) of the model")
    parser.add_argument("--model-id", default=None, help="default: a tiny Llama built into the output dir")
    parser.add_argument("--data", default=None, help="default: demo sentences written into the output dir")
    parser.add_argument("--output-dir", type=Path, default=Path("output/ray-seed"))
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step (simulates a crash)")
    parser.add_argument("--resume", action="store_true", help=f"continue from <output-dir>/{CHECKPOINT}")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def demo_assets(output_dir: Path) -> tuple[str, str]:
    """A tiny local model and demo data, written once (by the driver, or torchrun's rank 0)."""
    from twinkle.assets import build_tiny_model, write_text_dataset

    model_dir, data_file = output_dir / "tiny-model", output_dir / "demo.jsonl"
    ready = output_dir / ".demo-assets-ready"
    if int(os.environ.get("RANK", "0")) == 0 and not ready.exists():
        build_tiny_model(model_dir)
        write_text_dataset(data_file, n=64)
        ready.touch()  # last, so other ranks never read half-written files
    while not ready.exists():
        time.sleep(0.2)
    return str(model_dir), str(data_file)


def main() -> None:
    args = parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    # A Ray instance this script starts itself gets no dashboard (an existing cluster keeps its own).
    ray_options: dict[str, Any] = {"include_dashboard": False} if args.address is None else {}
    twinkle.initialize(mode=args.mode, address=args.address, seed=args.seed, **ray_options)
    model_id, data_file = args.model_id, args.data
    if model_id is None or data_file is None:
        demo_model, demo_data = demo_assets(args.output_dir)
        model_id, data_file = model_id or demo_model, data_file or demo_data
    checkpoint = args.output_dir / CHECKPOINT
    model, dataloader = build(model_id, data_file, args.world_size, args.max_steps)
    if args.resume and is_complete(checkpoint):
        resume(model, dataloader, checkpoint)
    losses = train(model, dataloader, args.output_dir, args.max_steps, args.save_every, args.stop_at)
    if int(os.environ.get("RANK", "0")) == 0:
        (args.output_dir / f"losses-{args.mode}.json").write_text(json.dumps(losses))
    log(f"stopped at step {model.cur_step}")
    shutdown()  # Ray mode: stops the actors (and Ray, if this script started it)


def build(model_id: str, data_file: str, world_size: int, max_steps: int) -> tuple[Any, Any]:
    """The seed's set-up: the DataLoader and the model with its LoRA adapter and optimizer."""
    # In the Ray driver the sizes make the world (one actor each); under torchrun they must match it.
    mesh = DeviceMesh.from_sizes(dp_size=1, fsdp_size=world_size)
    # ---- the seed's example ----
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    dataloader = DataLoader(
        Dataset(data_file, tokenizer, max_length=64), batch_size=4, device_mesh=mesh, remote_group="actor"
    )
    model = TransformersModel(model_id=model_id, device_mesh=mesh, remote_group="actor")
    model.add_adapter_to_model(ADAPTER, {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    model.set_optimizer("adamw", adapter_name=ADAPTER, lr=1e-3)
    model.set_lr_scheduler("cosine", num_warmup_steps=1, num_training_steps=max_steps)
    return model, dataloader


def resume(model: Any, dataloader: Any, checkpoint: Path) -> int:
    """Continue from a checkpoint written by `train`: weights, optimizer, RNG and data position."""
    progress = model.resume_from_checkpoint(checkpoint, adapter_name=ADAPTER)
    dataloader.resume_from_checkpoint(progress["consumed_train_samples"])
    log(f"resumed from {checkpoint} at step {progress['cur_step']}")
    return int(progress["cur_step"])


def train(
    model: Any,
    dataloader: Any,
    output_dir: Path,
    max_steps: int,
    save_every: int,
    stop_at: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> dict[int, float]:
    """The seed's training loop, plus logging, checkpoints and the final save; the losses by step.

    `on_step(step)` runs after each optimizer step (and its checkpoint, if one is due)."""
    step = model.cur_step
    losses: dict[int, float] = {}
    while step < max_steps and step != stop_at:
        for data in dataloader:
            # ---- the seed's example ----
            model.forward_backward(inputs=data, adapter_name=ADAPTER)
            result = model.clip_grad_and_step(
                max_grad_norm=1.0, gradient_accumulation_steps=2, adapter_name=ADAPTER
            )
            # ---- end of the seed's example; logging and checkpoints below ----
            if result is None:
                continue  # inside an accumulation window
            step = result["step"]
            losses[step] = result["loss"]
            log(f"step {step}: loss {result['loss']:.6f}")
            if step % save_every == 0 or step in (max_steps, stop_at):
                model.save(
                    CHECKPOINT,
                    output_dir=output_dir,
                    adapter_name=ADAPTER,
                    save_optimizer=True,
                    consumed_train_samples=dataloader.get_state()["consumed_train_samples"],
                )
            if on_step is not None:
                on_step(step)
            if step >= max_steps or step == stop_at:
                break
    if step >= max_steps:
        model.save("final", output_dir=output_dir, adapter_name=ADAPTER)
    return losses


def log(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


if __name__ == "__main__":
    main()
