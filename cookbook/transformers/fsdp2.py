"""Train a causal LM with FSDP2 and resume it exactly: the seed's end-to-end example.

    torchrun --nproc_per_node=2 cookbook/transformers/fsdp2.py --max-steps 10 --stop-at 5   # "interrupted"
    torchrun --nproc_per_node=2 cookbook/transformers/fsdp2.py --max-steps 10 --resume      # steps 6..10
    torchrun --nproc_per_node=4 cookbook/transformers/fsdp2.py --fsdp-size 2   # hybrid: dp 2 x fsdp 2

Without --model-id it builds a tiny local Llama and demo data (no hub access), so it runs on a
laptop CPU. It uses only the public API: TransformersModel, DeviceMesh, Dataset, DataLoader, with
the default strategy ('accelerate': its FSDP2 on GPU; on CPU, where accelerate cannot shard,
TransformersModel shards with native FSDP2 and logs that it does).

Resume, as the seed describes it: full-parameter weights come back by building the model from
the checkpoint (`model_id=<output>/last-checkpoint`), then `resume_from_checkpoint` restores the
optimizer, scheduler, RNG and progress, and the dataloader skips the consumed samples. (For LoRA
the base model is built as usual and `resume_from_checkpoint` loads the adapter weights too.)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from twinkle import DeviceMesh
from twinkle.checkpoint import is_complete
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset
from twinkle.model import TransformersModel

CHECKPOINT_NAME = "last-checkpoint"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-id", default=None, help="local dir, hf://org/name or ms://org/name")
    parser.add_argument(
        "--data", default=None, help="JSONL/JSON/CSV/Parquet file (chat, prompt/completion or text)"
    )
    parser.add_argument("--output-dir", type=Path, default=Path("output/fsdp2"))
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument(
        "--fsdp-size", type=int, default=None, help="ranks per shard group (default: all); the rest replicate"
    )
    parser.add_argument("--batch-size", type=int, default=4, help="global micro-batch size")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--mixed-precision", default="bf16", choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of all weights")
    parser.add_argument("--stop-at", type=int, default=None, help="stop after this step (simulates a crash)")
    parser.add_argument("--resume", action="store_true", help=f"continue from <output-dir>/{CHECKPOINT_NAME}")
    return parser.parse_args()


def demo_assets(output_dir: Path) -> tuple[str, str]:
    """A tiny local model and a demo dataset, built once by rank 0 (the others wait for it)."""
    import time

    from twinkle.assets import build_tiny_model, write_text_dataset

    model_dir, data_file = output_dir / "tiny-model", output_dir / "demo.jsonl"
    ready = output_dir / ".demo-assets-ready"
    if int(os.environ.get("RANK", "0")) == 0 and not ready.exists():
        build_tiny_model(model_dir)
        write_text_dataset(data_file, n=256)
        ready.touch()  # last, so the other ranks never read half-written files
    while not ready.exists():
        time.sleep(0.2)
    return str(model_dir), str(data_file)


def main() -> None:
    args = parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model_id, data = args.model_id, args.data
    if model_id is None or data is None:
        demo_model, demo_data = demo_assets(args.output_dir)
        model_id, data = model_id or demo_model, data or demo_data
    checkpoint = args.output_dir / CHECKPOINT_NAME
    resuming = args.resume and is_complete(checkpoint)

    # Every rank reads its own batches; the weights are sharded over --fsdp-size ranks (default:
    # all of them) and replicated over the rest (dp_size fills the world: hybrid sharding).
    mesh = DeviceMesh.from_sizes(fsdp_size=args.fsdp_size or int(os.environ.get("WORLD_SIZE", "1")))
    full_weights_from_checkpoint = resuming and not args.lora
    model = TransformersModel(
        model_id=str(checkpoint) if full_weights_from_checkpoint else model_id,
        device_mesh=mesh,
        mixed_precision=args.mixed_precision,
    )
    adapter = "default" if args.lora else None
    if adapter:
        model.add_adapter_to_model(adapter, {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"})

    dataset = Dataset(data, model.tokenizer, max_length=128)
    dataloader = DataLoader(dataset, batch_size=args.batch_size, device_mesh=mesh, seed=42)
    model.set_optimizer("adamw", adapter_name=adapter, lr=args.lr, weight_decay=0.01)
    model.set_lr_scheduler("cosine", num_warmup_steps=1, num_training_steps=args.max_steps)

    if resuming:
        progress = model.resume_from_checkpoint(checkpoint, adapter_name=adapter)
        dataloader.resume_from_checkpoint(progress["consumed_train_samples"])
        log(f"resumed from {checkpoint} at step {progress['cur_step']}")

    while model.cur_step < args.max_steps:
        for batch in dataloader:
            model.forward_backward(inputs=batch, adapter_name=adapter)
            result = model.clip_grad_and_step(
                max_grad_norm=1.0,
                gradient_accumulation_steps=args.gradient_accumulation_steps,
                adapter_name=adapter,
            )
            if result is None:
                continue  # inside an accumulation window
            log(f"step {result['step']}: loss {result['loss']:.4f} lr {result['lr']:.2e}")
            if result["step"] % args.save_every == 0 or result["step"] in (args.max_steps, args.stop_at):
                model.save(
                    CHECKPOINT_NAME,
                    output_dir=args.output_dir,
                    adapter_name=adapter,
                    save_optimizer=True,
                    consumed_train_samples=dataloader.get_state()["consumed_train_samples"],
                )
            if model.cur_step >= args.max_steps or model.cur_step == args.stop_at:
                break
        if model.cur_step == args.stop_at:
            log(f"stopped at step {model.cur_step}")
            return
    log(f"done: {checkpoint}")


def log(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


if __name__ == "__main__":
    main()
