"""Serving speed: time to first token and decode tokens/s of our serving engine, in process and
through the HTTP host, against plain `model.generate` of the same checkpoint in the same run.

    python bench/bench_serving.py [--hidden 512 --layers 8] [--prompt-tokens 64 --max-tokens 128]
                                  [--rounds 5] [--threads 2] [--json-out FILE]

A Llama of `--hidden`/`--layers` with the tiny BPE tokenizer is built from a config (no download)
and saved as a complete checkpoint `<jobs root>/job-bench/checkpoints/step-1`. Three paths then
generate the same greedy completion of the same prompt (`max_tokens` tokens, EOS ignored so
every path writes exactly as many):

- plain: `AutoModelForCausalLM.from_pretrained(checkpoint)` + `model.generate` with a streamer
  that stamps each new token: the baseline;
- engine: `serving.engine.Engine` in this process, the object the host serves with (slots, the
  model cache, `ChoiceTracker`'s text and stop handling), its deltas read as they come;
- http: `twinkle-jobs serve` as a child process, `POST /v1/completions` with `stream: true`
  and the `twinkle` key, as the API server relays it, read as SSE through the standard
  library's `http.client` (the least client: the host's own time);
- http_httpx (with `--httpx`): the same request through httpx, the `openai` package's HTTP
  library, to a second host. Not in the default run: with two hosts each HTTP path's time
  depends on which path ran before it by more than the clients differ (`docs/benchmarks.md`).

Time to first token (TTFT) runs from the request to the first token's text; decode tokens/s is
(tokens - 1) / (last - first token). The paths alternate within each round, each right after
each other equally often over the rounds (`balanced_orders`); each figure is the median over
rounds, and each ratio the median of the per-round ratios (a path against the plain run of the
same round), so machine noise hits both sides alike.
Speed ratios are plain / ours for TTFT and ours / plain for tokens/s: 1.0 is as fast as plain
`generate`; the target is >= 0.9 for each.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TARGET = 0.9
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Run:
    """One generation, timed from the request: its first token's text, its end, its tokens."""

    first: float
    last: float
    tokens: int

    @property
    def ttft(self) -> float:
        return self.first

    @property
    def tokens_per_second(self) -> float:
        span = self.last - self.first
        return (self.tokens - 1) / span if span > 0 else float("inf")


# ------------------------------------------------------------------------------ the checkpoint
def build_checkpoint(jobs_root: Path, hidden: int, layers: int) -> Path:
    """A complete checkpoint (HF weights + tokenizer + marker) in the layout the worker writes."""
    from twinkle_core import checkpoint as ckpt
    from twinkle_core.assets import build_tiny_model

    final = ckpt.step_dir(jobs_root / "job-bench" / ckpt.CHECKPOINTS_DIR, 1)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = ckpt.temp_dir_for(final)
    build_tiny_model(temp, hidden_size=hidden, num_layers=layers)
    return ckpt.finalize(temp, final)


def prompt_ids(tokenizer: Any, count: int) -> list[int]:
    from twinkle_core.assets import demo_sentences

    ids: list[int] = tokenizer(" ".join(demo_sentences(200, seed=1)))["input_ids"]
    return ids[:count]


# ---------------------------------------------------------------------------------- plain
class StampingStreamer:
    """A transformers streamer that notes when each generated token exists (the first `put` is
    the prompt)."""

    def __init__(self, began: float) -> None:
        self.began = began
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter() - self.began
        self.stamps.extend([now] * int(value.numel()))

    def end(self) -> None:
        pass


def plain_path(checkpoint: Path, ids: list[int], max_tokens: int) -> Callable[[], Run]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()

    def run() -> Run:
        began = time.perf_counter()
        streamer = StampingStreamer(began)
        with torch.inference_mode():
            input_ids = torch.tensor([ids])
            model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,  # EOS ignored: every path writes max_tokens tokens
                do_sample=False,
                pad_token_id=0,
                streamer=streamer,
            )
        return Run(streamer.stamps[0], streamer.stamps[-1], len(streamer.stamps))

    return run


# ------------------------------------------------------------------------------------ http
class SseReader:
    """An OpenAI SSE stream read line by line: stamps the first chunk with text and the last
    chunk, and takes the completion tokens from the usage chunk (`stream_options.include_usage`)."""

    def __init__(self, began: float) -> None:
        self.began = began
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0

    def line(self, line: str) -> bool:
        """Takes one line; False once the stream is done."""
        if not line.startswith("data: "):
            return True
        data = line[len("data: ") :].strip()
        if data == "[DONE]":
            return False
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"the host failed mid-stream: {chunk['error']}")
        now = time.perf_counter() - self.began
        if chunk.get("usage"):
            self.tokens = int(chunk["usage"]["completion_tokens"])
        if chunk["choices"]:
            self.last = now
            if self.first is None and any(choice.get("text") for choice in chunk["choices"]):
                self.first = now
        return True

    def run(self) -> Run:
        assert self.first is not None and self.last is not None and self.tokens, "no text or no usage"
        return Run(self.first, self.last, self.tokens)


def completion_body(checkpoint: Path, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The streamed `POST /v1/completions` every HTTP path sends, with the `twinkle` key."""
    return {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "twinkle": {"checkpoint": str(checkpoint), "base_model": None, "model": "bench"},
    }


def http_path(port: int, secret: str, body: dict[str, Any]) -> Callable[[], Run]:
    """The request through the standard library's `http.client` on a kept-alive connection: the
    host's own time, with the least of a client's in it (~0.1 ms)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    payload = json.dumps(body).encode()

    def run() -> Run:
        # A connection idle past the host's keep-alive timeout (uvicorn's 5 s: a round of long
        # answers) has been closed by the host, and reads as readable: connect again first,
        # outside the timing, as a client that keeps its connections warm would have.
        if connection.sock is None or select.select([connection.sock], [], [], 0)[0]:
            connection.close()
            connection.connect()
        began = time.perf_counter()
        connection.request("POST", "/v1/completions", payload, headers)
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"host answered {response.status}: {response.read()[:300]!r}")
        reader = SseReader(began)
        for raw in iter(response.readline, b""):  # read to the end: the connection is reused
            reader.line(raw.decode())
        return reader.run()

    return run


def httpx_path(url: str, secret: str, body: dict[str, Any]) -> Callable[[], Run]:
    """The same request through httpx, the HTTP library of the `openai` package: what a Python
    client adds on top of the host's time."""
    import httpx

    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=600)

    def run() -> Run:
        began = time.perf_counter()
        with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"host answered {response.status_code}: {response.text[:300]}")
            reader = SseReader(began)
            for line in response.iter_lines():
                if not reader.line(line):
                    break
            return reader.run()

    return run


def check_answer_is_text(checkpoint: Path, tokenizer: Any, ids: list[int], max_tokens: int) -> None:
    """An untrained model's greedy answer may be a run of partial UTF-8 bytes, which a server
    rightly holds back until a character completes (all of it at the end): no stream to time.
    Refuse such a model/prompt pair instead of reporting nonsense."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    answer = out[0, len(ids) :].tolist()
    partial = [t for t in answer if "\ufffd" in tokenizer.decode([t])]
    if partial:
        raise SystemExit(
            f"the greedy answer has {len(partial)} partial-UTF-8 tokens (held back by any streaming "
            "server): pick another --prompt-tokens or model size"
        )


# ---------------------------------------------------------------------------------- engine
def engine_path(jobs_root: Path, checkpoint: Path, prompt: str, max_tokens: int) -> Callable[[], Run]:
    """The host's `Engine` (transformers backend) in this process, driven on an event loop of
    its own, as the host's app drives it."""
    import asyncio

    from serving.engine import Engine, Limits
    from serving.generation import TransformersBackend
    from serving.protocol import completion_prompt_ids
    from serving.sampling import SamplingParams
    from serving.targets import TwinkleKey, check_target

    loop = asyncio.new_event_loop()
    engine = Engine(TransformersBackend(), Limits(2**34, load_timeout=600, slots=1, slot_timeout=600))
    target = check_target(TwinkleKey(checkpoint=str(checkpoint), model="bench"), jobs_root, [])
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    loaded = loop.run_until_complete(engine.model(target))
    ids = completion_prompt_ids(loaded.tokenizer, prompt, 0, False)

    async def generate() -> Run:
        began = time.perf_counter()
        first = last = None
        tokens = 0
        generation = await engine.start(loaded, [ids], params)
        async for delta in generation:
            now = time.perf_counter() - began
            if first is None and delta.text:
                first = now
            if delta.finish_reason is not None:
                last, tokens = now, delta.completion_tokens
        await generation.finished
        assert first is not None and last is not None, "the engine wrote no text"
        return Run(first, last, tokens)

    return lambda: loop.run_until_complete(generate())


# ------------------------------------------------------------------------------ the host
class Host:
    """`twinkle-jobs serve` as a child process on a data dir of its own (SQLite, migrated first)."""

    def __init__(self, data_dir: Path, jobs_root: Path, threads: int, code: Path = common.REPO_ROOT) -> None:
        assert jobs_root == data_dir / "jobs", "the host serves checkpoints under <data dir>/jobs"
        self.data_dir = data_dir
        self.code = code  # the checkout whose code the host runs (bench_serving_compare: a worktree)
        self.port = common.free_port()
        self.secret = "bench-" + os.urandom(8).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "TWINKLE_DATA_DIR": str(data_dir),
            "TWINKLE_SERVING_PORT": str(self.port),
            "TWINKLE_SERVING_SECRET": self.secret,
            "TWINKLE_SERVING_ENGINE": "transformers",
            "TWINKLE_SERVING_SLOTS": "1",
            "OMP_NUM_THREADS": str(threads),
            "PYTHONPATH": str(code),
        }
        for name in ("TWINKLE_DATABASE_URL", "TWINKLE_BROKER_URL"):
            self.env.pop(name, None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The module form from the checkout itself: its own code, not the installed project's.
        command = [sys.executable, "-m", "twinkle_cli.main"]
        subprocess.run([*command, "migrate"], env=self.env, cwd=self.code, check=True, capture_output=True)
        log = open(self.data_dir / "serve.log", "ab")  # noqa: SIM115 (the child keeps it open)
        self.proc = subprocess.Popen(
            [*command, "serve"], env=self.env, cwd=self.code, stdout=log, stderr=subprocess.STDOUT
        )
        common.wait_http_ok(f"{self.url}/healthz", 120, [self.proc])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -------------------------------------------------------------------------------- the run
def median_of(runs: list[Run]) -> dict[str, Any]:
    ttft = [1000 * r.ttft for r in runs]
    rate = [r.tokens_per_second for r in runs]
    return {
        "ttft_ms": round(common.median(ttft), 2),
        "ttft_ms_range": [round(min(ttft), 1), round(max(ttft), 1)],
        "tokens_per_second": round(common.median(rate), 1),
        "tokens_per_second_range": [round(min(rate), 1), round(max(rate), 1)],
        "tokens": runs[0].tokens,
    }


def balanced_orders(count: int) -> list[list[int]]:
    """Orders of `count` paths in which each path comes right after each other path equally
    often within a round (a Williams design): a path's time depends on what ran just before it,
    and a plain rotation puts each path after the same neighbour in most rounds."""
    first, low, high = [0], 1, count - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    orders = [[(position + shift) % count for position in first] for shift in range(count)]
    if count % 2:  # an odd count needs the mirrored orders too
        orders += [order[::-1] for order in orders]
    return orders


def ratios_to_plain(runs: dict[str, list[Run]]) -> dict[str, Any]:
    """Each path's speed against the `plain` path, with its verdict against TARGET."""
    ratios: dict[str, Any] = {}
    for name in (n for n in runs if n != "plain"):
        # Paired by round (the two ran back to back), then the median: a burst of load on the
        # machine moves both sides of a pair alike, where medians taken apart would not cancel it.
        pairs = list(zip(runs["plain"], runs[name], strict=True))
        ttft = common.median([plain.ttft / ours.ttft for plain, ours in pairs])
        tps = common.median([ours.tokens_per_second / plain.tokens_per_second for plain, ours in pairs])
        ratios[name] = {
            "ttft_speed_vs_plain": round(ttft, 3),
            "ttft_verdict": common.verdict(ttft, TARGET, lower_is_better=False),
            "tokens_per_second_vs_plain": round(tps, 3),
            "tokens_per_second_verdict": common.verdict(tps, TARGET, lower_is_better=False),
        }
    return ratios


def add_model_arguments(parser: argparse.ArgumentParser, max_tokens: int, rounds: int) -> None:
    """The model, prompt and round options every serving benchmark takes."""
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json-out", default=None)


def measure(paths: dict[str, Callable[[], Run]], rounds: int, warmup: int) -> dict[str, list[Run]]:
    names = list(paths)
    for _ in range(warmup):  # first calls pay for lazy initialisation everywhere
        for name in names:
            paths[name]()
    runs: dict[str, list[Run]] = {name: [] for name in names}
    orders = balanced_orders(len(names))
    for round_no in range(rounds):
        for index in orders[round_no % len(orders)]:
            runs[names[index]].append(paths[names[index]]())
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser, max_tokens=128, rounds=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every path")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP host")
    parser.add_argument(
        "--httpx", action="store_true", help="also the http_httpx path (a second host, read through httpx)"
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    machine = common.machine_description()  # the load before the run, not after it
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    hosts: list[Host] = []
    try:
        jobs_root = work / "jobs"  # the host's jobs root: <data dir>/jobs
        checkpoint = build_checkpoint(jobs_root, args.hidden, args.layers)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        ids = prompt_ids(tokenizer, args.prompt_tokens)
        prompt = tokenizer.decode(ids)
        assert tokenizer(prompt)["input_ids"] == ids, "the prompt must tokenize back to the same ids"
        check_answer_is_text(checkpoint, tokenizer, ids, args.max_tokens)

        paths: dict[str, Callable[[], Run]] = {
            "plain": plain_path(checkpoint, ids, args.max_tokens),
            "engine": engine_path(jobs_root, checkpoint, prompt, args.max_tokens),
        }
        if not args.no_http:
            hosts.append(Host(work, jobs_root, args.threads))
            hosts[0].start()
            body = completion_body(checkpoint, prompt, args.max_tokens)
            paths["http"] = http_path(hosts[0].port, hosts[0].secret, body)
        if args.httpx:
            # A host of its own: requests to one host back to back find its caches warm (~3 ms
            # less to the first token here) where every other path follows another's.
            second = work / "second"
            shutil.copytree(checkpoint, second / checkpoint.relative_to(work))
            hosts.append(Host(second, second / "jobs", args.threads))
            hosts[-1].start()
            body = completion_body(second / checkpoint.relative_to(work), prompt, args.max_tokens)
            paths["http_httpx"] = httpx_path(hosts[-1].url, hosts[-1].secret, body)
        runs = measure(paths, args.rounds, args.warmup)
    finally:
        for host in hosts:
            host.stop()
        shutil.rmtree(work, ignore_errors=True)

    common.report(
        "serving",
        {
            "machine": machine,
            "settings": vars(args),
            "figures": {name: median_of(r) for name, r in runs.items()},
            "ratios": ratios_to_plain(runs),
            "target": f">= {TARGET} of plain model.generate, TTFT and tokens/s",
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
