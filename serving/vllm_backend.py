"""Generation with vLLM, on a CUDA host where `vllm` imports (chosen by serving/host.py).

One `AsyncLLMEngine` per loaded checkpoint, in the same LRU as the transformers backend. vLLM
loads a model from a directory, so a LoRA checkpoint is merged into its base once, on the CPU,
into `<data dir>/serving/merged/<digest of the checkpoint path>` (kept for the next load), and a
full checkpoint is served from its Hugging Face directory. vLLM reserves a fraction of the GPU
for weights and KV cache when an engine starts; each engine asks for its weights twice over
(weights + as much KV cache) so that several fit beside each other on one device, within the
bound of the cache. A host that leased several GPUs shards each engine over all of them (tensor
parallelism; fewer when the model's attention heads do not divide evenly).

vLLM does the sampling (temperature, top_p, seed, n), the stop sequences and EOS itself; a
request is aborted in the engine when its client goes away. Tested on a GPU host only
(tests/integration/test_serving_vllm.py, marker `gpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from serving.loading import (
    LoadedModel,
    context_length,
    estimate_bytes,
    is_adapter,
    load_base,
    load_tokenizer,
    safetensors_bytes,
    weights_dir,
)
from serving.sampling import Delta, SamplingParams
from serving.targets import Target

log = logging.getLogger(__name__)

_END = object()
MIN_UTILIZATION, MAX_UTILIZATION = 0.05, 0.9


class VllmGeneration:
    """A request (one per prompt, one after the other) running in the engine, consumed by a task
    of its own so that it ends (and frees its slot) whether or not anyone reads it."""

    def __init__(self, engine: Any, prompts: list[list[int]], params: SamplingParams) -> None:
        loop = asyncio.get_running_loop()
        self._engine = engine
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._request_id: str | None = None
        self.finished: asyncio.Future[None] = loop.create_future()
        self._task = loop.create_task(self._run(prompts, params))

    async def _run(self, prompts: list[list[int]], params: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt

        try:
            sampling = vllm_sampling(params)
            for number, prompt in enumerate(prompts):
                self._request_id = f"twinkle-{uuid.uuid4().hex}"
                sent = [0] * params.n
                stream = self._engine.generate(
                    TokensPrompt(prompt_token_ids=prompt), sampling, self._request_id
                )
                async for output in stream:
                    for choice in output.outputs:
                        text = choice.text[sent[choice.index] :]
                        sent[choice.index] = len(choice.text)
                        index = number * params.n + choice.index
                        if choice.finish_reason is not None:
                            reason = "length" if choice.finish_reason == "length" else "stop"
                            self._queue.put_nowait(Delta(index, text, reason, len(choice.token_ids)))
                        elif text:
                            self._queue.put_nowait(Delta(index, text))
            self._queue.put_nowait(_END)
        except asyncio.CancelledError:
            if self._request_id is not None:
                await self._engine.abort(self._request_id)
            self._queue.put_nowait(_END)
        except Exception as exc:
            log.exception("vLLM generation failed")
            self._queue.put_nowait(exc)
        finally:
            if not self.finished.done():
                self.finished.set_result(None)

    def cancel(self) -> None:
        if not self._task.done():
            self._task.cancel()

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def tensor_parallel_size(attention_heads: int | None, kv_heads: int | None, gpus: int) -> int:
    """How many of the host's GPUs one engine shards its model over: the largest power of two up
    to their number that vLLM can split the model by (the attention heads divide evenly, and the
    KV heads do too or are replicated evenly)."""
    if not attention_heads:
        return 1
    kv = kv_heads or attention_heads
    size = 1
    while size * 2 <= gpus:
        candidate = size * 2
        if attention_heads % candidate or (kv % candidate and candidate % kv):
            break
        size = candidate
    return size


def vllm_sampling(params: SamplingParams) -> Any:
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        max_tokens=params.max_tokens,
        stop=list(params.stop) or None,
        seed=params.seed,
        ignore_eos=params.ignore_eos,
    )


class VllmBackend:
    name = "vllm"

    def __init__(self, work_dir: Path) -> None:
        import torch

        self.merged_root = work_dir / "merged"
        self.device_bytes = int(torch.cuda.get_device_properties(0).total_memory)
        self.gpus = torch.cuda.device_count()  # the leased ones (CUDA_VISIBLE_DEVICES)

    def default_memory_bytes(self) -> int:
        # Parameter bytes over all the GPUs: each engine also reserves as much again for its KV cache.
        return int(self.device_bytes * self.gpus * MAX_UTILIZATION / 2)

    def estimate_bytes(self, target: Target) -> int:
        return estimate_bytes(target)

    def model_dir(self, target: Target) -> Path:
        """The directory vLLM loads: the checkpoint's HF weights, or the LoRA merged into its base."""
        weights = weights_dir(target.checkpoint)
        if not is_adapter(weights):
            return weights
        digest = hashlib.sha256(str(target.checkpoint).encode()).hexdigest()[:24]
        merged = self.merged_root / digest
        if (merged / "config.json").is_file():
            return merged
        import torch
        from peft import PeftModel

        base = load_base(target, torch.device("cpu"))  # merged on the CPU, as the note above says
        model = PeftModel.from_pretrained(base, str(weights)).merge_and_unload()
        partial = merged.with_name(f".{merged.name}.{uuid.uuid4().hex[:8]}")
        try:
            model.save_pretrained(str(partial))
            load_tokenizer(weights).save_pretrained(str(partial))
            with contextlib.suppress(OSError):  # another load merged it first: theirs is as good
                partial.rename(merged)
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # a copy that lost the race, or half a one
        return merged

    def load(self, target: Target) -> LoadedModel:
        from transformers import AutoConfig
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        directory = self.model_dir(target)
        tokenizer = load_tokenizer(directory)
        config = AutoConfig.from_pretrained(str(directory))
        heads = getattr(config, "num_attention_heads", None)
        shards = tensor_parallel_size(heads, getattr(config, "num_key_value_heads", None), self.gpus)
        size = safetensors_bytes(directory) or self.device_bytes // 10
        # The fraction of each GPU the engine reserves: its share of the weights, twice over.
        utilization = min(MAX_UTILIZATION, max(MIN_UTILIZATION, 2 * size / shards / self.device_bytes))
        args = AsyncEngineArgs(
            model=str(directory),
            gpu_memory_utilization=utilization,
            dtype="auto",
            tensor_parallel_size=shards,
        )
        engine = AsyncLLMEngine.from_engine_args(args)
        return LoadedModel(
            target=target,
            tokenizer=tokenizer,
            context_length=context_length(config, tokenizer),
            bytes=size,
            model=engine,
        )

    def release(self, loaded: LoadedModel) -> None:
        shutdown = getattr(loaded.model, "shutdown", None)
        if shutdown is not None:
            shutdown()
        loaded.model = None

    def start(self, loaded: LoadedModel, prompts: list[list[int]], params: SamplingParams) -> VllmGeneration:
        return VllmGeneration(loaded.model, prompts, params)
