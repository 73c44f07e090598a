"""Checkpoint save and resume time: `TransformersModel.save` / `resume_from_checkpoint` against
plain `torch.save`/`torch.load` (DDP) and DCP (FSDP2) of the same state.

    python bench/bench_checkpoint.py [--hidden 512 --layers 4 --vocab 8192] [--repeats 3]

A Llama is built from a config (no download) and saved once; then, for each strategy, one
`torchrun --standalone --nproc_per_node 2` launch of this script (`--rank` mode) builds
`TransformersModel(strategy=...)` with AdamW and a constant schedule, takes one optimizer step (so
the optimizer has state), and times, alternating, `--repeats` times:

- ours: `model.save(name, save_optimizer=True)` and `model.resume_from_checkpoint(path)`, in the
  layout the strategy writes by default: under DDP HF safetensors weights + tokenizer (rank 0)
  and the optimizer in one `torch.save` (the last rank); under FSDP2 the sharded layout (model
  and optimizer shards in one DCP save, config + tokenizer beside them); both with scheduler,
  per-rank RNG, trainer_state.json, fsync and the completion marker;
- baseline, DDP (`strategy="accelerate"`): rank 0 `torch.save({"model", "optimizer", "scheduler"})`
  + per-rank RNG `torch.save`; resume: `torch.load` + `load_state_dict` on every rank;
- baseline, FSDP2 (`strategy="native_fsdp"`, fsdp_size=2): `dcp.save` of the sharded model and
  optimizer state dicts (`get_state_dict`) + scheduler and RNG files; resume: `dcp.load` +
  `set_state_dict`.

Each time is the slowest rank's, between barriers. Target: ours <= 1.2x the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TARGET_RATIO = 1.2
STRATEGIES = {"ddp": "accelerate", "fsdp2": "native_fsdp"}


# --------------------------------------------------------------------- inside each rank
def _timed(fn: Any) -> float:
    import torch
    import torch.distributed as dist

    dist.barrier()
    began = time.perf_counter()
    fn()
    dist.barrier()
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _time_ours(model: Any, out_dir: Path, name: str) -> tuple[float, float]:
    saved: list[str] = []
    save_s = _timed(lambda: saved.append(model.save(name, str(out_dir), save_optimizer=True)))
    resume_s = _timed(lambda: model.resume_from_checkpoint(saved[0]))
    return save_s, resume_s


def _baseline_ddp(model: Any, directory: Path, rank: int) -> tuple[Any, Any]:
    import torch

    from twinkle_core.model import state_io

    module = model.wrapped.module if hasattr(model.wrapped, "module") else model.wrapped
    file = directory / "checkpoint.pt"

    def save() -> None:
        if rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            state = {
                "model": module.state_dict(),
                "optimizer": model.optimizer.state_dict(),
                "scheduler": model.lr_scheduler.state_dict(),
            }
            torch.save(state, file)
        torch.distributed.barrier()
        torch.save(state_io.rng_state(), directory / f"rng_{rank}.pt")

    def load() -> None:
        state = torch.load(file, map_location="cpu", weights_only=False)
        module.load_state_dict(state["model"])
        model.optimizer.load_state_dict(state["optimizer"])
        model.lr_scheduler.load_state_dict(state["scheduler"])
        state_io.set_rng_state(torch.load(directory / f"rng_{rank}.pt", weights_only=False))

    return save, load


def _baseline_dcp(model: Any, directory: Path, rank: int) -> tuple[Any, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from twinkle_core.model import state_io

    def save() -> None:
        model_state, optim_state = get_state_dict(model.wrapped, model.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory))
        if rank == 0:
            torch.save(model.lr_scheduler.state_dict(), directory / "scheduler.pt")
        torch.save(state_io.rng_state(), directory / f"rng_{rank}.pt")

    def load() -> None:
        model_state: Any
        optim_state: Any
        model_state, optim_state = get_state_dict(model.wrapped, model.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(
            model.wrapped,
            model.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        model.lr_scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
        state_io.set_rng_state(torch.load(directory / f"rng_{rank}.pt", weights_only=False))

    return save, load


def rank_main(model_dir: str, strategy: str, out_dir: Path, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    from twinkle_core import DeviceMesh
    from twinkle_core.model import TransformersModel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    mesh = DeviceMesh.from_sizes(fsdp_size=world) if strategy == "fsdp2" else None
    model = TransformersModel(
        model_id=model_dir, device_mesh=mesh, strategy=STRATEGIES[strategy], mixed_precision="no"
    )
    model.set_optimizer("adamw", lr=1e-4)
    model.set_lr_scheduler("constant")
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(rank))
    model.forward_backward({"input_ids": ids, "labels": ids})
    model.clip_grad_and_step()

    times: dict[str, list[float]] = {"ours_save": [], "ours_resume": [], "base_save": [], "base_resume": []}
    for index in range(repeats):
        ours_dir = out_dir / f"ours-{index}"
        base_dir = out_dir / f"base-{index}"
        base_save, base_load = (_baseline_dcp if strategy == "fsdp2" else _baseline_ddp)(
            model, base_dir, rank
        )
        # Alternate which goes first so that a warming page cache favours neither.
        order = ["ours", "base"] if index % 2 == 0 else ["base", "ours"]
        for which in order:
            if which == "ours":
                save_s, resume_s = _time_ours(model, out_dir, ours_dir.name)
                times["ours_save"].append(save_s)
                times["ours_resume"].append(resume_s)
            else:
                times["base_save"].append(_timed(base_save))
                times["base_resume"].append(_timed(base_load))
        dist.barrier()
        if rank == 0:
            sizes = {name: _dir_bytes(d) for name, d in (("ours", ours_dir), ("base", base_dir))}
            shutil.rmtree(ours_dir)
            shutil.rmtree(base_dir)
        dist.barrier()
    if rank == 0:
        params = sum(p.numel() for p in model.model.parameters())
        (out_dir / "result.json").write_text(
            json.dumps({"times": times, "bytes": sizes, "parameters": params})
        )
    dist.barrier()
    dist.destroy_process_group()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ------------------------------------------------------------------------------ launcher
def build_model(directory: Path, hidden: int, layers: int, vocab: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from twinkle_core.assets import build_tokenizer

    build_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))


def launch(strategy: str, model_dir: Path, out_dir: Path, repeats: int) -> dict[str, Any]:
    out_dir.mkdir(parents=True)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(common.REPO_ROOT)}
    argv = [torchrun, "--standalone", "--nproc_per_node", "2", __file__, "--rank", "--strategy", strategy]
    argv += ["--model-dir", str(model_dir), "--out", str(out_dir), "--repeats", str(repeats)]
    subprocess.run(argv, env=env, check=True)
    raw = json.loads((out_dir / "result.json").read_text())
    med = {name: common.median(values) for name, values in raw["times"].items()}
    return {
        "parameters": raw["parameters"],
        "checkpoint_bytes": raw["bytes"],
        "seconds": {name: [round(v, 3) for v in values] for name, values in raw["times"].items()},
        "median_s": {name: round(v, 3) for name, v in med.items()},
        "ratio_save": round(med["ours_save"] / med["base_save"], 3),
        "ratio_resume": round(med["ours_resume"] / med["base_resume"], 3),
        # Ours and the baseline run back to back in each repeat: their ratio there is less exposed
        # to load drift than the ratio of medians.
        "paired_ratio_median": {
            kind: round(
                common.median(
                    [
                        o / b
                        for o, b in zip(
                            raw["times"][f"ours_{kind}"], raw["times"][f"base_{kind}"], strict=True
                        )
                    ]
                ),
                3,
            )
            for kind in ("save", "resume")
        },
        "baseline": "torch.save/torch.load" if strategy == "ddp" else "DCP (dcp.save/dcp.load)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", default="ddp,fsdp2", help="comma-separated: ddp, fsdp2")
    parser.add_argument("--json-out", default=None, help="also write the result here")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.model_dir, args.strategy, Path(args.out), args.repeats)
        return
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies or set(strategies) - set(STRATEGIES):
        raise ValueError(f"--strategies: choose from {sorted(STRATEGIES)}")
    if args.repeats < 1 or args.hidden % 64 or args.layers < 1:
        raise ValueError("--repeats must be >= 1, --hidden a multiple of 64, --layers >= 1")
    machine = common.machine_description()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, args.hidden, args.layers, args.vocab)
        for strategy in strategies:
            results[strategy] = launch(strategy, model_dir, Path(tmp) / strategy, args.repeats)
            print(f"{strategy}: {results[strategy]['median_s']}", file=sys.stderr)
    worst = max(max(r["ratio_save"], r["ratio_resume"]) for r in results.values())
    out = {
        "machine": machine,
        "model": f"Llama hidden={args.hidden} layers={args.layers} vocab={args.vocab}, fp32, AdamW",
        "ranks": "2 (torchrun, gloo)",
        "results": results,
        "target": f"ours <= {TARGET_RATIO}x the baseline (save and resume)",
        "verdict": {
            f"{name}_{kind}": common.verdict(r[f"ratio_{kind}"], TARGET_RATIO)
            for name, r in results.items()
            for kind in ("save", "resume")
        },
        "worst_ratio": worst,
    }
    common.report("checkpoint", out, args.json_out)


if __name__ == "__main__":
    main()
