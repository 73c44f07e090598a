"""FSDP2 bf16 on a ~1B-parameter Llama: tokens/s, MFU, peak memory and exact-resume equality.

Run by `bench/gpu.sh` under torchrun (one rank per GPU, one FSDP shard group over all of them);
`--cpu-smoke` runs the same logic on CPU (gloo) with a tiny config, to test the script itself.

1. Throughput: `TransformersModel(config=<1B Llama>, strategy="native_fsdp", mixed_precision="bf16")`
   with AdamW trains `--warmup` + `--steps` steps of `--micro-batch` x `--seq-len` random tokens;
   the timed steps give tokens/s, MFU = achieved FLOP/s / (GPUs x the GPU's dense bf16 peak), and
   the peak of `torch.cuda.max_memory_allocated` (reserved too).
   FLOPs per token: 6 x (parameters - input embedding) + 12 x layers x hidden x seq_len
   (the matmuls of forward + backward, and attention scores).
2. Exact resume: `--resume-steps` N steps straight (model A) vs N/2 steps, `save(save_optimizer=True)`,
   a fresh model, `resume_from_checkpoint`, N/2 more (model B); the final weights must be
   bitwise equal. The batches depend only on the step index; deterministic algorithms are on and
   attention is `eager` in this part, because flash/efficient SDPA backward kernels are not
   deterministic (the throughput part uses SDPA).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a name fragment of
# torch.cuda.get_device_name. Most specific first: "H100 PCIe" before "H100".
BF16_PEAK_FLOPS: list[tuple[str, float]] = [
    ("H200", 989.4e12),
    ("GH200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),
    ("A100", 312.0e12),
]

# About 1.1B parameters (the TinyLlama shape); the smoke config is tiny.
LLAMA_1B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
LLAMA_SMOKE: dict[str, Any] = {
    **LLAMA_1B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def bf16_peak(device_name: str) -> float | None:
    for fragment, peak in BF16_PEAK_FLOPS:
        if fragment.lower() in device_name.lower():
            return peak
    return None


def flops_per_token(config: dict[str, Any], parameters: int, seq_len: int) -> float:
    embedding = config["vocab_size"] * config["hidden_size"]  # a lookup: no FLOPs
    attention = 12 * config["num_hidden_layers"] * config["hidden_size"] * seq_len
    return 6.0 * (parameters - embedding) + attention


def batch(step: int, micro_batch: int, seq_len: int, vocab: int) -> dict[str, Any]:
    """The batch of a given step: a function of the step alone, so a resumed run sees the same data."""
    import torch

    generator = torch.Generator().manual_seed(10_000 + step)
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


def build(config: dict[str, Any], tokenizer_dir: Path, attn: str) -> Any:
    import torch

    from twinkle_core import DeviceMesh
    from twinkle_core.model import TransformersModel

    torch.manual_seed(1234)  # the same initial weights on every build (and every rank)
    model = TransformersModel(
        config=config,
        device_mesh=DeviceMesh.from_sizes(fsdp_size=int(os.environ.get("WORLD_SIZE", "1"))),
        strategy="native_fsdp",
        mixed_precision="bf16",
        attn_implementation=attn,
    )
    model.set_tokenizer(str(tokenizer_dir))
    model.set_optimizer("adamw", lr=1e-4, weight_decay=0.0)
    model.set_lr_scheduler("constant")
    return model


def train(model: Any, steps: range, micro_batch: int, seq_len: int, vocab: int) -> None:
    for step in steps:
        model.forward_backward(batch(step, micro_batch, seq_len, vocab))
        model.clip_grad_and_step(max_grad_norm=1.0)


def full_weights(model: Any) -> dict[str, Any]:
    from twinkle_core.model import state_io

    return state_io.full_model_state_dict(model.wrapped)  # on rank 0; collective


def release(model: Any) -> None:
    import torch

    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def throughput(config: dict[str, Any], tok_dir: Path, args: argparse.Namespace, world: int) -> dict[str, Any]:
    import torch

    model = build(config, tok_dir, "sdpa")
    parameters = sum(p.numel() for p in model.model.parameters())  # sharded DTensors report global sizes
    vocab = config["vocab_size"]
    train(model, range(args.warmup), args.micro_batch, args.seq_len, vocab)
    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    train(model, range(args.warmup, args.warmup + args.steps), args.micro_batch, args.seq_len, vocab)
    sync()
    elapsed = time.perf_counter() - began
    tokens = args.steps * args.micro_batch * args.seq_len * world
    tokens_per_s = tokens / elapsed
    achieved = tokens_per_s * flops_per_token(config, parameters, args.seq_len)
    result: dict[str, Any] = {
        "parameters": parameters,
        "timed_steps": args.steps,
        "tokens_per_step": args.micro_batch * args.seq_len * world,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "achieved_tflops": round(achieved / 1e12, 2),
    }
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = args.peak_tflops * 1e12 if args.peak_tflops else bf16_peak(name)
        result["gpu"] = name
        result["peak_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        result["peak_memory_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        result["bf16_peak_tflops_per_gpu"] = peak / 1e12 if peak else None
        result["mfu"] = round(achieved / (peak * world), 4) if peak else None
        if peak is None:
            result["mfu_note"] = f"no bf16 peak known for {name!r}: pass --peak-tflops"
    else:
        result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        result["mfu"] = None
        result["mfu_note"] = "CPU smoke run: no bf16 peak"
    release(model)
    return result


def exact_resume(
    config: dict[str, Any], tok_dir: Path, args: argparse.Namespace, ckpt_root: Path
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.use_deterministic_algorithms(True, warn_only=True)
    n, half, vocab = args.resume_steps, args.resume_steps // 2, config["vocab_size"]
    mb, seq = args.resume_micro_batch, args.resume_seq_len

    straight = build(config, tok_dir, "eager")
    train(straight, range(n), mb, seq, vocab)
    reference = full_weights(straight)
    release(straight)

    first = build(config, tok_dir, "eager")
    train(first, range(half), mb, seq, vocab)
    sync()
    began = time.perf_counter()
    path = first.save("step-half", str(ckpt_root), save_optimizer=True)
    save_s = time.perf_counter() - began
    release(first)

    resumed = build(config, tok_dir, "eager")
    began = time.perf_counter()
    progress = resumed.resume_from_checkpoint(path)
    resume_s = time.perf_counter() - began
    assert progress["cur_step"] == half, progress
    train(resumed, range(half, n), mb, seq, vocab)
    final = full_weights(resumed)
    release(resumed)

    mismatched: list[str] = []
    if dist.get_rank() == 0:
        if set(final) != set(reference):
            mismatched = sorted(set(final) ^ set(reference))
        else:
            mismatched = [k for k in reference if not torch.equal(reference[k], final[k])]
    return {
        "steps": n,
        "resumed_at": half,
        "save_s": round(save_s, 2),
        "resume_s": round(resume_s, 2),
        "tensors_compared": len(reference),
        "mismatched_tensors": mismatched[:10],
        "bitwise_equal": not mismatched,
    }


def join_process_group() -> None:
    """NCCL on CUDA (also for one GPU: FSDP2's collectives on CUDA tensors need it), gloo on CPU."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("RANK", "0")  # plain `python bench/gpu_fsdp.py`: a world of one
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny config on CPU (gloo): tests the script"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; smoke 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3; smoke 1)")
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="sequences per rank (default 8; smoke 2)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=None, help="tokens per sequence (default 2048; smoke 32)"
    )
    parser.add_argument("--resume-steps", type=int, default=None, help="default 6; smoke 4")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="bf16 peak per GPU if not in the table"
    )
    parser.add_argument("--json-out", default=None, help="also write the result here (rank 0)")
    args = parser.parse_args()
    smoke = args.cpu_smoke
    defaults = {
        "steps": (20, 3),
        "warmup": (3, 1),
        "micro_batch": (8, 2),
        "seq_len": (2048, 32),
        "resume_steps": (6, 4),
    }
    for name, (full, tiny) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if smoke else full)
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if args.resume_steps < 2 or args.resume_steps % 2:
        raise ValueError("--resume-steps must be an even number >= 2 (it is split in two halves)")
    # The resume check needs exactness, not scale: shorter sequences keep eager attention cheap.
    args.resume_micro_batch = min(args.micro_batch, 2)
    args.resume_seq_len = min(args.seq_len, 1024)

    import torch

    if not smoke and not torch.cuda.is_available():
        print(
            "gpu_fsdp.py: no CUDA device (torch.cuda.is_available() is False); use --cpu-smoke",
            file=sys.stderr,
        )
        return 2
    import torch.distributed as dist

    from twinkle_core.assets import build_tokenizer

    config = LLAMA_SMOKE if smoke else LLAMA_1B
    join_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    # Every rank makes a temp dir; they agree on rank 0's (one node, one disk).
    work = Path(tempfile.mkdtemp(prefix="twinkle-gpu-bench-"))
    tok_dir = work / "tokenizer"
    if rank == 0:
        build_tokenizer(tok_dir, vocab_size=min(config["vocab_size"], 2048))
    try:
        result: dict[str, Any] = {"mode": "cpu-smoke" if smoke else "cuda", "world_size": world}
        result["config"] = {k: v for k, v in config.items() if k != "model_type"}
        shared = [str(work)]
        dist.broadcast_object_list(shared, src=0)
        tok_dir = Path(shared[0]) / "tokenizer"
        result["throughput"] = throughput(config, tok_dir, args, world)
        result["exact_resume"] = exact_resume(config, tok_dir, args, Path(shared[0]) / "checkpoints")
        if rank == 0:
            text = json.dumps(result, indent=2)
            print(text)
            if args.json_out:
                Path(args.json_out).write_text(text + "\n")
        ok = result["exact_resume"]["bitwise_equal"]
        return 0 if ok else 1
    finally:
        dist.barrier()
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
