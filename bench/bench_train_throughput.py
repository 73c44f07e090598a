"""Training throughput of TransformersModel against a hand-written PyTorch loop, side by side.

    torchrun --nproc_per_node=2 bench/bench_train_throughput.py --strategy ddp
    torchrun --nproc_per_node=2 bench/bench_train_throughput.py --strategy fsdp2

Both loops train the same freshly initialised Llama on the same synthetic token batches with the
same optimizer, gradient clipping and strategy (DDP, or FSDP2 `fully_shard` per decoder layer);
they alternate in rounds so that machine noise hits both alike. Rank 0 prints tokens/s of each and
the ratio twinkle / plain (target >= 0.97).
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
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


def timed_step(step: Callable[[dict[str, torch.Tensor]], None], batch: dict[str, torch.Tensor]) -> float:
    dist.barrier()
    start = time.perf_counter()
    step(batch)
    dist.barrier()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    data = batches(args, args.steps)
    builders = {"plain": plain_loop, "twinkle": twinkle_loop}
    order = ["twinkle", "plain"] if args.twinkle_first else ["plain", "twinkle"]
    loops = {name: builders[name](args) for name in order}
    for name in loops:
        for batch in data[:2]:  # warm-up: allocator, autograd graph, DDP buckets, optimizer state
            timed_step(loops[name], batch)
    # Steps alternate between the loops (ABBA order), so load from other processes on a shared
    # machine falls on both alike; each loop's time is the sum of its own steps.
    seconds: dict[str, list[float]] = {"plain": [], "twinkle": []}
    for round_index in range(args.rounds):
        for index, batch in enumerate(data):
            pair = ["plain", "twinkle"] if (round_index + index) % 2 == 0 else ["twinkle", "plain"]
            for name in pair:
                seconds[name].append(timed_step(loops[name], batch))
    tokens_per_step = args.local_batch * args.seq_len * dist.get_world_size()
    rate = {name: tokens_per_step * len(values) / sum(values) for name, values in seconds.items()}
    median_ratio = statistics.median(p / t for p, t in zip(seconds["plain"], seconds["twinkle"], strict=True))
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config(args)).parameters())
        print(f"strategy={args.strategy} world={dist.get_world_size()} params={params / 1e6:.1f}M")
        for name, values in seconds.items():
            print(f"{name:8s} {rate[name]:10.1f} tokens/s  ({len(values)} steps, {sum(values):.2f} s)")
        print(
            f"ratio twinkle/plain = {rate['twinkle'] / rate['plain']:.3f} "
            f"(median of per-step ratios {median_ratio:.3f})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
