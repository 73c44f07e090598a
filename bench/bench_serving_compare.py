"""The serving host's time to first token at two revisions, side by side, request by request.

    python bench/bench_serving_compare.py BEFORE_COMMIT [--after HEAD | --after .] [--pairs 150]
        [--max-tokens 2] [--no-plain-between] [--json-out FILE]

`bench_serving.py` times the host against plain `generate`; a change worth a few tenths of a
millisecond on a ~30 ms time to first token is lost in its round-to-round spread. This script
serves the checkpoint from two hosts at once, `BEFORE_COMMIT` and `--after` (a commit checked
out into a temporary worktree, or `.` for this checkout as it is, uncommitted changes included),
each `twinkle-jobs serve` on a data dir of its own holding a copy of the same checkpoint, and
sends them the same streamed `POST /v1/completions` in alternation (which goes first flips every
pair). Between two requests the benchmark process runs plain `model.generate` of the same
checkpoint (as `bench_serving.py`'s rounds do, so that each request finds the host's caches as
cold as it would there; `--no-plain-between` to skip).

The client is `bench_serving`'s: the standard library's `http.client` on a kept-alive
connection, the same for both sides. It reports each side's median time to first token, and
the median of the paired differences (after - before) with its 95% confidence interval (order
statistics of the differences: no assumption on their distribution).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_serving
import common
from bench_api_compare import _remove_worktree, _worktree

SIDES = ("before", "after")


def median_ci(differences: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics d(k), d(n-k+1) with k
    the largest rank such that a Binomial(n, 1/2) falls below it with probability <= alpha/2."""
    ordered = sorted(differences)
    n = len(ordered)
    alpha = 1 - confidence
    below, k = 0.0, 0
    while True:
        below += math.comb(n, k) / 2**n
        if below > alpha / 2:
            break
        k += 1
    if k == 0:
        raise ValueError(f"{n} pairs are too few for a {confidence:.0%} interval")
    return ordered[k - 1], ordered[n - k]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", help="the commit to compare against")
    parser.add_argument(
        "--after", default="HEAD", help="a commit, or . for this checkout as it is (default HEAD)"
    )
    parser.add_argument("--pairs", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured pairs first")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--no-plain-between", action="store_true")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    machine = common.machine_description()
    work = Path(tempfile.mkdtemp(prefix="bench-serving-compare-"))
    hosts: dict[str, bench_serving.Host] = {}
    trees: list[Path] = []
    try:
        code: dict[str, Path] = {}
        for side, revision in (("before", args.before), ("after", args.after)):
            if revision == ".":
                code[side] = common.REPO_ROOT
            else:
                code[side] = work / f"tree-{side}"
                _worktree(revision, code[side])
                trees.append(code[side])
        checkpoint = bench_serving.build_checkpoint(work / "built" / "jobs", args.hidden, args.layers)
        relative = checkpoint.relative_to(work / "built" / "jobs")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        ids = bench_serving.prompt_ids(tokenizer, args.prompt_tokens)
        prompt = tokenizer.decode(ids)
        bench_serving.check_answer_is_text(checkpoint, tokenizer, ids, args.max_tokens)
        runs: dict[str, Callable[[], bench_serving.Run]] = {}
        for side in SIDES:
            data = work / f"data-{side}"
            shutil.copytree(checkpoint, data / "jobs" / relative)
            hosts[side] = bench_serving.Host(data, data / "jobs", 1, code=code[side])
            hosts[side].start()
            body = bench_serving.completion_body(data / "jobs" / relative, prompt, args.max_tokens)
            runs[side] = bench_serving.http_path(hosts[side].port, hosts[side].secret, body)
        plain = bench_serving.plain_path(checkpoint, ids, args.max_tokens)

        ttft: dict[str, list[float]] = {side: [] for side in SIDES}
        for number in range(args.warmup + args.pairs):
            order = SIDES if number % 2 == 0 else SIDES[::-1]
            measured = {}
            for side in order:
                if not args.no_plain_between:
                    plain()
                measured[side] = runs[side]().ttft
            if number >= args.warmup:
                for side in SIDES:
                    ttft[side].append(measured[side])
    finally:
        for host in hosts.values():
            host.stop()
        for tree in trees:
            _remove_worktree(tree)
        shutil.rmtree(work, ignore_errors=True)

    differences = [1000 * (a - b) for a, b in zip(ttft["after"], ttft["before"], strict=True)]
    low, high = median_ci(differences)
    common.report(
        "serving_compare",
        {
            "machine": machine,
            "settings": vars(args),
            "ttft_ms": {side: round(1000 * common.median(ttft[side]), 3) for side in SIDES},
            "after_minus_before_ms": {
                "median": round(common.median(differences), 3),
                "ci95": [round(low, 3), round(high, 3)],
                "after_faster_in": f"{sum(d < 0 for d in differences)} of {len(differences)} pairs",
            },
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
