"""Serving as a user meets it: time to first token through the API server, which relays to the
host, against the host called directly and plain `model.generate`, in one run.

    python bench/bench_serving_api.py [--max-tokens 64 --rounds 24] [--json-out FILE]

`bench_serving.py` times the serving host; a user calls the API server, which authenticates the
token, resolves the model name to a checkpoint, picks a live host and relays the stream. This
script starts the whole stack as a user does (`twinkle-jobs server`, `worker` and `serve` on one
data dir, a scratch PostgreSQL database and the embedded broker), fine-tunes the 19M Llama of
`bench_serving.py` for one step through the API, and then times, in balanced orders per round:

- plain: `model.generate` of the job's checkpoint in this process (the baseline);
- host: `POST /v1/completions` with the `twinkle` key, as the relay sends it, to a second host
  of its own (its own data dir and SQLite database, a copy of the checkpoint), which the API
  server does not know;
- api: `POST /v1/completions` to the API server with `model` = `JOB_ID:ckpt-1` and the user's
  token, the request a user's client sends.

Each path has its own process and its own copy of the weights. A path that runs right after
another in the same process finds the weights in the CPU's caches; with the stack's own host
called directly (`--shared-host`, how this script measured before 12-05 12:13), the host and API
paths found them so after each other, and plain `generate` never, which favoured both against
the baseline.

All three read the same greedy answer (EOS ignored) through `http.client` or the streamer of
`bench_serving.py`. Ratios are per round, then the median, as there; the target (>= 0.9 of plain
`generate`) is `bench_serving.py`'s, and this script reports it for the API path too.

`--idle-gaps 0,1.5,3,6` adds a probe of how much of a difference is the machine's: after each
gap of idle seconds, a one-token request to the API and one to the host, back to back, in
alternating order; per gap, the median of (API - host) with each one first. A request that
follows an idle moment is slower whichever path it takes, so the two orders differ by that, and
their mean is the relay's own cost. `--idle-tokens 64` makes the probe's answers as long as the
rounds' (the relay's cost while the host goes on decoding behind the first token).

`cpu_ms_per_request` is the CPU time (user + system) of the API server and of each host over the
timed rounds, per request: what the relay costs as work, which the machine's state moves far
less than it moves a latency.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_serving
import common

TARGET = bench_serving.TARGET


def train_one_step(service: common.Service, base: Path, dataset: Path) -> str:
    """A one-step full fine-tune of `base` through the API; its job id once it succeeded."""
    spec = {
        "model": {"model_id": str(base), "mixed_precision": "no"},
        "data": {"train_file": str(dataset), "max_length": 32},
        "training": {"max_steps": 1, "batch_size": 4},
        "optimizer": {"lr": 1e-5},
    }
    with service.client() as client:
        answer = client.post("/v1/jobs", json={"name": "bench-serving-api", "spec": spec, "max_retries": 0})
        answer.raise_for_status()
        job_id = str(answer.json()["id"])
        deadline = time.monotonic() + 300
        while (job := client.get(f"/v1/jobs/{job_id}").json())["status"] != "succeeded":
            if job["status"] in ("failed", "cancelled") or time.monotonic() > deadline:
                raise RuntimeError(f"the fine-tune did not succeed: {job}")
            time.sleep(0.5)
    return job_id


@dataclass
class DirectHost:
    """The host the `host` path calls: a second one of its own (see above), or the stack's."""

    port: int
    secret: str
    checkpoint: Path  # the job's checkpoint, or its copy under the second host's jobs root
    own: bench_serving.Host | None = None

    def stop(self) -> None:
        if self.own is not None:
            self.own.stop()


def direct_host(work: Path, data_dir: Path, checkpoint: Path, stack_port: int, shared: bool) -> DirectHost:
    if shared:
        return DirectHost(stack_port, (data_dir / "serving-secret").read_text().strip(), checkpoint)
    own_dir = work / "direct"
    copy = own_dir / checkpoint.relative_to(data_dir)  # <data dir>/jobs/...: under its jobs root
    shutil.copytree(checkpoint, copy)
    host = bench_serving.Host(own_dir, own_dir / "jobs", threads=1)
    host.start()
    return DirectHost(host.port, host.secret, copy, host)


def idle_probe(
    api: Callable[[], bench_serving.Run], host: Callable[[], bench_serving.Run], gaps: list[float], pairs: int
) -> dict[str, dict[str, float]]:
    """Per idle gap: the median TTFT of API minus host, with the API first and with the host
    first after the gap, and the mean of the two (the relay without the idle moment's cost)."""
    result: dict[str, dict[str, float]] = {}
    for gap in gaps:
        differences: dict[str, list[float]] = {"api_first": [], "host_first": []}
        for pair in range(2 * pairs):
            time.sleep(gap)
            if pair % 2 == 0:
                first_api = api().ttft
                differences["api_first"].append(1000 * (first_api - host().ttft))
            else:
                first_host = host().ttft
                differences["host_first"].append(1000 * (api().ttft - first_host))
        medians = {order: round(common.median(values), 2) for order, values in differences.items()}
        mean = (medians["api_first"] + medians["host_first"]) / 2
        result[f"{gap:g}s"] = {**medians, "mean": round(mean, 2)}
    return result


def _gaps(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_serving.add_model_arguments(parser, max_tokens=64, rounds=24)
    parser.add_argument("--idle-gaps", type=_gaps, default=[], help="seconds, comma-separated (see above)")
    parser.add_argument("--idle-pairs", type=int, default=8, help="pairs per gap and order")
    parser.add_argument(
        "--idle-tokens", type=int, default=1, help="max_tokens of the probe's requests (see above)"
    )
    parser.add_argument(
        "--shared-host", action="store_true", help="call the stack's own host directly (see above)"
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    machine = common.machine_description()
    with (
        tempfile.TemporaryDirectory(prefix="bench-serving-api-") as tmp,
        common.scratch_postgres("srvapi") as db,
    ):
        from transformers import AutoTokenizer

        from twinkle_core.assets import build_tiny_model, write_text_dataset
        from twinkle_core.checkpoint import hf_model_dir

        data_dir = Path(tmp) / "data"  # the default allowed root: the base and dataset go inside
        base = build_tiny_model(
            data_dir / "models" / "bench-llama", hidden_size=args.hidden, num_layers=args.layers
        )
        dataset = write_text_dataset(data_dir / "train.jsonl", n=16)
        host_port = common.free_port()
        service = common.Service(
            data_dir,
            db,
            None,
            extra_env={
                "TWINKLE_SERVING_PORT": str(host_port),
                "TWINKLE_SERVING_SLOTS": "1",
                "TWINKLE_SERVING_ENGINE": "transformers",
                "OMP_NUM_THREADS": "1",
            },
        )
        with service:
            serve = service._spawn(["serve"], "serve.log")
            common.wait_http_ok(f"http://127.0.0.1:{host_port}/healthz", 120, service.procs)
            job_id = train_one_step(service, base, dataset)
            checkpoint = data_dir / "jobs" / job_id / "checkpoints" / "step-1"
            weights = hf_model_dir(checkpoint)  # the checkpoint's plain Hugging Face files
            tokenizer = AutoTokenizer.from_pretrained(str(weights))
            ids = bench_serving.prompt_ids(tokenizer, args.prompt_tokens)
            prompt = tokenizer.decode(ids)
            bench_serving.check_answer_is_text(weights, tokenizer, ids, args.max_tokens)
            user_body: dict[str, Any] = bench_serving.completion_body(checkpoint, prompt, args.max_tokens)
            user_body["model"] = f"{job_id}:ckpt-1"
            del user_body["twinkle"]
            direct = direct_host(Path(tmp), data_dir, checkpoint, host_port, shared=args.shared_host)
            try:
                body = bench_serving.completion_body(direct.checkpoint, prompt, args.max_tokens)
                paths: dict[str, Callable[[], bench_serving.Run]] = {
                    "plain": bench_serving.plain_path(weights, ids, args.max_tokens),
                    "host": bench_serving.http_path(direct.port, direct.secret, body),
                    "api": bench_serving.http_path(service.port, service.token, user_body),
                }
                # Each process serves one request a round; the warm-up stays out of the count.
                watched = {"api_server": service.procs[0].pid, "stack_host": serve.pid}
                if direct.own is not None and direct.own.proc is not None:
                    watched["direct_host"] = direct.own.proc.pid
                bench_serving.measure(paths, 0, args.warmup)

                def cpu_now() -> dict[str, float]:
                    return {name: common.cpu_seconds(pid, children=True) for name, pid in watched.items()}

                before = cpu_now()
                runs = bench_serving.measure(paths, args.rounds, 0)
                cpu_ms = {
                    name: round(1000 * (spent - before[name]) / args.rounds, 3)
                    for name, spent in cpu_now().items()
                }
                idle = idle_probe(
                    bench_serving.http_path(
                        service.port, service.token, {**user_body, "max_tokens": args.idle_tokens}
                    ),
                    bench_serving.http_path(
                        direct.port, direct.secret, {**body, "max_tokens": args.idle_tokens}
                    ),
                    args.idle_gaps,
                    args.idle_pairs,
                )
            finally:
                direct.stop()

    relay = [1000 * (api.ttft - host.ttft) for api, host in zip(runs["api"], runs["host"], strict=True)]
    common.report(
        "serving_api",
        {
            "machine": machine,
            "settings": vars(args),
            "figures": {name: bench_serving.median_of(r) for name, r in runs.items()},
            "ratios": bench_serving.ratios_to_plain(runs),
            "relay_adds_ttft_ms_median": round(common.median(relay), 2),
            "cpu_ms_per_request": cpu_ms,
            "idle_probe_api_minus_host_ms": idle,
            "target": f">= {TARGET} of plain model.generate, TTFT and tokens/s",
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
