"""A serving host that leased two GPUs uses both (run by bench/gpu.sh on a machine with two):
two models go to different GPUs, and a model no GPU holds alone is spread over both and answers
as it does on one. The choices themselves are tested without CUDA in
tests/unit/test_serving_placement.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from serving_host import copied_checkpoint

from serving.generation import TransformersBackend
from serving.loading import LoadedModel
from serving.sampling import SamplingParams
from serving.targets import Target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]

GPU0, GPU1 = torch.device("cuda", 0), torch.device("cuda", 1)


def _greedy(backend: TransformersBackend, loaded: LoadedModel, prompt: list[int]) -> str:
    async def run() -> str:
        generation = backend.start(loaded, [prompt], SamplingParams(max_tokens=12, temperature=0.0))
        text = "".join([delta.text async for delta in generation])
        await generation.finished
        return text

    return asyncio.run(run())


def test_models_go_to_different_gpus_and_a_spread_model_answers_as_on_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    checkpoint = copied_checkpoint(tiny_model_dir, tmp_path)
    backend = TransformersBackend([GPU0, GPU1])
    first = backend.load(Target("first", checkpoint, None, "m"))
    second = backend.load(Target("second", checkpoint, None, "m"))
    assert {p.device for p in first.model.parameters()} == {GPU0}
    assert {p.device for p in second.model.parameters()} == {GPU1}
    prompt = first.tokenizer("the cat sat on")["input_ids"]
    on_one = _greedy(backend, first, prompt)
    assert on_one and _greedy(backend, second, prompt) == on_one

    # A host whose GPUs each hold 90% of the model: it is spread over both.
    narrow = TransformersBackend([GPU0, GPU1])
    narrow.placer.capacity = {GPU0: int(first.bytes * 0.9), GPU1: int(first.bytes * 0.9)}
    spread = narrow.load(Target("spread", checkpoint, None, "m"))
    assert set(spread.model.hf_device_map.values()) == {0, 1}
    assert _greedy(narrow, spread, prompt) == on_one
