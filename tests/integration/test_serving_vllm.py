"""The serving host on vLLM (CUDA with `vllm` installed; run by bench/gpu.sh on a GPU machine):
the same OpenAI answers as with transformers, LoRA merged for vLLM once, seeds, stop sequences,
and a cancelled stream aborting its request in the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serving_host import SECRET, make_checkpoint, running_host, twinkle_key

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
# vllm is imported by the fixture, not here: a module skipped at import is a failure under
# TWINKLE_TEST_STRICT=1, while a gpu-marked test's skip is not.


def _vllm_sized_model(out_dir: Path, tokenizer_dir: Path) -> Path:
    """The tiny Llama with a head size vLLM's attention kernels take (64)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle_core.assets import tiny_llama_config

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.save_pretrained(str(out_dir))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_llama_config(len(tokenizer), hidden_size=256)).save_pretrained(
        str(out_dir)
    )
    return out_dir


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    pytest.importorskip("vllm")
    import openai

    from serving.app import create_app
    from serving.engine import Engine, Limits
    from serving.vllm_backend import VllmBackend

    root = tmp_path_factory.mktemp("vllm")
    base = _vllm_sized_model(root / "models" / "base", tiny_model_dir)
    jobs = root / "jobs"
    full = make_checkpoint(base, jobs, "job-full", lora=False)
    lora = make_checkpoint(base, jobs, "job-lora", lora=True)
    backend = VllmBackend(work_dir=root / "serving")
    engine = Engine(backend, Limits(memory_bytes=2**33, load_timeout=600, slots=2, slot_timeout=30))
    app = create_app(engine, secret=SECRET, jobs_root=jobs, allowed_roots=[root / "models"])
    with running_host(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRET, max_retries=0, timeout=600)
        yield {
            "url": url,
            "client": client,
            "engine": engine,
            "full": {"twinkle": twinkle_key(full, "ft:full")},
            "lora": {"twinkle": twinkle_key(lora, "ft:lora", base)},
        }


@pytest.mark.parametrize("which", ["full", "lora"])
def test_vllm_answers_chat_plain_and_streamed(host: dict[str, Any], which: str) -> None:
    client = host["client"]
    args: dict[str, Any] = {
        "model": f"ft:{which}",
        "messages": [{"role": "user", "content": "Who builds things?"}],
        "max_tokens": 12,
        "seed": 5,
        "n": 2,
    }
    answer = client.chat.completions.create(**args, extra_body=host[which])
    assert answer.object == "chat.completion" and len(answer.choices) == 2
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    again = client.chat.completions.create(**args, extra_body=host[which])
    assert [c.message.content for c in again.choices] == [c.message.content for c in answer.choices]
    streamed = ["", ""]
    for chunk in client.chat.completions.create(**args, stream=True, extra_body=host[which]):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == [c.message.content for c in answer.choices]
    assert host["engine"].backend.name == "vllm"


def test_vllm_stop_and_cancel(host: dict[str, Any]) -> None:
    client = host["client"]
    common: dict[str, Any] = {"model": "ft:full", "prompt": "the cat", "temperature": 0}
    extra = {**host["full"], "ignore_eos": True}
    text = client.completions.create(**common, max_tokens=10, extra_body=extra).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = client.completions.create(**common, max_tokens=10, stop=[stop], extra_body=extra)
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == text[: text.index(stop)]
    body = {**common, "max_tokens": 200, "stream": True, **extra}
    headers = {"Authorization": f"Bearer {SECRET}"}
    with httpx.stream("POST", f"{host['url']}/v1/completions", json=body, headers=headers, timeout=60) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    health = httpx.get(f"{host['url']}/healthz", headers=headers).json()
    for _ in range(50):
        if health["slots"]["busy"] == 0:
            break
        health = httpx.get(f"{host['url']}/healthz", headers=headers).json()
    assert health["slots"]["busy"] == 0
