"""Peak memory per rank while initialising an FSDP2 model, with and without memory_efficient_init.

    python bench/bench_memory_init.py            # builds a ~110M-parameter Llama, runs both modes

Each mode runs in its own `torchrun --nproc_per_node=2` launch (peak RSS is per process): every
rank records its resident memory after the imports, builds
`TransformersModel(model_id=..., strategy="native_fsdp", fsdp_size=2, memory_efficient_init=...)`
and wraps it, then reports the growth of its peak RSS (ru_maxrss) over that baseline. The script
prints both and the ratio for rank 1 (target <= 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(model_dir: str, efficient: bool, out: Path) -> None:
    """Runs inside each torchrun rank."""
    import torch

    from twinkle_core import DeviceMesh
    from twinkle_core.model import TransformersModel

    rank = int(os.environ["RANK"])
    # Import the model's code first (transformers imports it lazily, ~100 MiB of Python modules) so
    # that the measurement is the memory of the weights, not of code both modes load alike.
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    baseline = peak_rss_mb()
    torch.manual_seed(0)
    model = TransformersModel(
        model_id=model_dir,
        device_mesh=DeviceMesh.from_sizes(fsdp_size=int(os.environ["WORLD_SIZE"])),
        strategy="native_fsdp",
        mixed_precision="no",
        memory_efficient_init=efficient,
    )
    model.wrapped  # noqa: B018 - sharding (and the broadcast) happens when the model is first wrapped
    result = {"baseline_mb": baseline, "peak_mb": peak_rss_mb(), "after_mb": current_rss_mb()}
    result["growth_mb"] = result["peak_mb"] - baseline
    (out / f"{'efficient' if efficient else 'plain'}-rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def build_model(directory: Path, hidden: int, layers: int) -> int:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from twinkle_core.assets import build_tokenizer

    build_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(directory))
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--_measure", nargs=3, metavar=("MODEL_DIR", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        model_dir, mode, out = args._measure
        measure(model_dir, mode == "efficient", Path(out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        params = build_model(work / "model", args.hidden, args.layers)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")])
        )
        for mode in ("plain", "efficient"):
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.nproc}",
            ]
            command += [__file__, "--_measure", str(work / "model"), mode, str(work)]
            subprocess.run(command, env=env, check=True, capture_output=True)
        results = {
            (mode, rank): json.loads((work / f"{mode}-rank{rank}.json").read_text())
            for mode in ("plain", "efficient")
            for rank in range(args.nproc)
        }
    print(
        f"model: {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB in fp32), "
        f"{args.nproc} ranks, FSDP2"
    )
    for (mode, rank), result in sorted(results.items()):
        print(
            f"{mode:9s} rank {rank}: peak RSS growth during init {result['growth_mb']:7.1f} MiB "
            f"(baseline {result['baseline_mb']:.0f} MiB, resident after init {result['after_mb']:.0f} MiB)"
        )
    ratio = results[("efficient", 1)]["growth_mb"] / results[("plain", 1)]["growth_mb"]
    print(f"rank 1 peak-growth ratio efficient/plain = {ratio:.3f}")


if __name__ == "__main__":
    main()
