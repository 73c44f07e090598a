"""Training throughput of TransformersModel against a hand-written PyTorch loop, side by side.

    torchrun --nproc_per_node=2 bench/bench_train_throughput.py --strategy ddp
    torchrun --nproc_per_node=2 bench/bench_train_throughput.py --strategy fsdp2

Both loops train the same freshly initialised Llama on the same synthetic token batches with the
same optimizer, gradient clipping and strategy (DDP, or FSDP2 `fully_shard` per decoder layer).
After a warm-up, `--repeats` blocks of `--steps` steps of each loop are timed (a barrier before and
after each block, none between its steps, as in real training); which loop goes first alternates
from one repeat to the next (ABBA), so machine noise and drift hit both alike. Rank 0 prints
tokens/s of each, the ratio twinkle / plain of each repeat, their median (the figure; target
>= 0.97) and the ratio of the median block times. It also prints the same ratio in CPU time (the
process time of both ranks, their threads included, summed): on a machine shared with other work
the wall-clock time of a block includes the time the ranks waited for a core, the CPU time only
what the loop itself computed, so it shows the loop's cost with far less noise (but not the time
a rank spends blocked in a collective, which the wall-clock figure includes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig

from twinkle_core import DeviceMesh
from twinkle_core.model import TransformersModel
from twinkle_core.model.strategies import decoder_layers


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--local-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks of each loop (>= 5)")
    parser.add_argument("--twinkle-first", action="store_true", help="build the TransformersModel first")
    return parser.parse_args()


def config(args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=args.seq_len,
        tie_word_embeddings=False,
    )


def batches(args: argparse.Namespace, count: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    out = []
    for _ in range(count):
        ids = torch.randint(0, 4096, (args.local_batch, args.seq_len), generator=generator)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def plain_loop(args: argparse.Namespace) -> Callable[[dict[str, torch.Tensor]], None]:
    """What a user would write by hand: HF loss, backward, clip, AdamW."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(args))
    if args.strategy == "ddp":
        wrapped: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_sizes(fsdp_size=dist.get_world_size()).to_torch("cpu")
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)

    def step(batch: dict[str, torch.Tensor]) -> None:
        loss = wrapped(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def twinkle_loop(args: argparse.Namespace) -> Callable[[dict[str, torch.Tensor]], None]:
    torch.manual_seed(0)
    fsdp = dist.get_world_size() if args.strategy == "fsdp2" else 1
    model = TransformersModel(
        config=config(args),
        device_mesh=DeviceMesh.from_sizes(fsdp_size=fsdp),
        strategy="native_fsdp" if args.strategy == "fsdp2" else "accelerate",
        mixed_precision="no",
    )
    model.set_optimizer("adamw", lr=1e-4)

    def step(batch: dict[str, torch.Tensor]) -> None:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step(max_grad_norm=1.0, gradient_accumulation_steps=1)

    return step


def timed_block(
    step: Callable[[dict[str, torch.Tensor]], None], data: list[dict[str, torch.Tensor]]
) -> tuple[float, float]:
    """Seconds for the slowest rank to run every batch of `data` through `step`, and the CPU
    seconds both ranks spent on it."""
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for batch in data:
        step(batch)
    dist.barrier()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu)
    return float(elapsed), float(cpu)


def main() -> None:
    args = parse_args()
    if args.repeats < 1 or args.steps < 1:
        raise ValueError("--repeats and --steps must be positive")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    data = batches(args, args.steps)
    builders = {"plain": plain_loop, "twinkle": twinkle_loop}
    order = ["twinkle", "plain"] if args.twinkle_first else ["plain", "twinkle"]
    loops = {name: builders[name](args) for name in order}
    for name in loops:  # warm-up: allocator, autograd graph, DDP buckets, optimizer state
        timed_block(loops[name], data[:3])
    seconds: dict[str, list[float]] = {"plain": [], "twinkle": []}
    cpu_seconds: dict[str, list[float]] = {"plain": [], "twinkle": []}
    for index in range(args.repeats):
        pair = ["plain", "twinkle"] if index % 2 == 0 else ["twinkle", "plain"]
        for name in pair:
            wall, cpu = timed_block(loops[name], data)
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    tokens_per_block = args.local_batch * args.seq_len * dist.get_world_size() * args.steps
    ratios = [p / t for p, t in zip(seconds["plain"], seconds["twinkle"], strict=True)]
    cpu_ratios = [p / t for p, t in zip(cpu_seconds["plain"], cpu_seconds["twinkle"], strict=True)]
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config(args)).parameters())
        print(f"strategy={args.strategy} world={dist.get_world_size()} params={params / 1e6:.1f}M")
        for name, values in seconds.items():
            rate = tokens_per_block / statistics.median(values)
            spread = ", ".join(f"{v:.2f}" for v in values)
            blocks = f"median of {len(values)} blocks of {args.steps} steps: {spread} s"
            print(f"{name:8s} {rate:10.1f} tokens/s ({blocks})")
        print("ratio twinkle/plain per repeat: " + ", ".join(f"{r:.3f}" for r in ratios))
        median_blocks = statistics.median(seconds["plain"]) / statistics.median(seconds["twinkle"])
        print(
            f"ratio twinkle/plain = {statistics.median(ratios):.3f} (median of {len(ratios)} alternated "
            f"repeats; min {min(ratios):.3f}, max {max(ratios):.3f}; "
            f"ratio of median blocks {median_blocks:.3f})"
        )
        print(
            f"CPU time: ratio twinkle/plain = {statistics.median(cpu_ratios):.3f} (median of "
            f"{len(cpu_ratios)}; min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f}; per repeat "
            + ", ".join(f"{r:.3f}" for r in cpu_ratios)
            + ")"
        )
    dist.destroy_process_group()
    # Leave without the interpreter's teardown, as twinkle_core.train does: there a DDP Reducer's
    # deallocation joins the gloo worker threads while holding the GIL, and a worker still
    # releasing its last collective's tensors waits for the GIL (seen twice: rank 1 hung in
    # ~ProcessGroupGloo after printing).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
