"""The transformers backend's way to an answer's first token. Its own first step
(serving/first_token.py): the answers are token for token those of `generate` taking every step
(greedy and seeded, n choices, stop at the first token), `generate` goes on from the first
pass's cache, and a model whose generation config would change the first step, or whose forward
pass cannot keep only the last logits, is left to `generate`. Its threads: kept between answers."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from serving.first_token import NO_FIRST_STEP, FirstStep
from serving.generation import ThreadedGeneration, TransformersBackend
from serving.loading import LoadedModel
from serving.sampling import SamplingParams
from serving.targets import Target


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


def answer(model: Any, tokenizer: Any, params: SamplingParams, own_first_step: bool) -> list[tuple[str, str]]:
    step = FirstStep.of(model) if own_first_step else NO_FIRST_STEP
    """Each choice's (text, finish reason) from the backend's generating thread."""

    async def run() -> list[tuple[str, str]]:
        generation = ThreadedGeneration(asyncio.get_running_loop())
        prompt = tokenizer("the cat sat")["input_ids"]
        thread = threading.Thread(
            target=TransformersBackend()._run,
            args=(model, tokenizer, [prompt], params, generation, step),
        )
        thread.start()
        texts = [""] * params.n
        reasons = [""] * params.n
        async for delta in generation:
            texts[delta.index] += delta.text
            reasons[delta.index] = delta.finish_reason or reasons[delta.index]
        await asyncio.to_thread(thread.join)
        return list(zip(texts, reasons, strict=True))

    return asyncio.run(run())


class GenerateSpy:
    """Wraps `model.generate`, recording whether each call was given a filled cache."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.caches: list[int | None] = []
        original = model.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            self.caches.append(None if cache is None else cache.get_seq_length())
            return original(*args, **kwargs)

        monkeypatch.setattr(model, "generate", generate)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, n=3, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=1.0, n=4, seed=1),  # some choices end at EOS
    ],
    ids=["greedy", "seeded-n3", "seeded-eos"],
)
def test_answers_are_those_of_generate_taking_every_step(
    tiny: tuple[Any, Any], params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny
    assert FirstStep.of(model).own, "the tiny Llama is one whose first step the host takes"
    spy = GenerateSpy(model, monkeypatch)
    expected = answer(model, tokenizer, params, own_first_step=False)
    assert spy.caches == [None]
    got = answer(model, tokenizer, params, own_first_step=True)
    assert got == expected
    prompt_length = len(tokenizer("the cat sat")["input_ids"])
    assert spy.caches[1:] == [prompt_length], "generate went on from the first pass's cache"
    assert all(text for text, _ in got)


def test_an_answer_of_one_token_needs_no_generate(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny
    spy = GenerateSpy(model, monkeypatch)
    params = SamplingParams(max_tokens=1, temperature=0, n=2, ignore_eos=True)
    got = answer(model, tokenizer, params, own_first_step=True)
    assert spy.caches == []
    assert got == answer(model, tokenizer, params, own_first_step=False)
    assert [reason for _, reason in got] == ["length", "length"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("repetition_penalty", 1.3),
        ("min_new_tokens", 2),
        ("suppress_tokens", [3]),
        ("bad_words_ids", [[4]]),
        ("forced_bos_token_id", 1),
        ("cache_implementation", "static"),
    ],
)
def test_a_generation_config_that_changes_the_first_step_leaves_it_to_generate(
    tiny_model_dir: Path, setting: str, value: Any
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    setattr(model.generation_config, setting, value)
    step = FirstStep.of(model)
    assert not step.own and setting in step.reason


def test_a_penalised_model_answers_as_plain_generate(tiny_model_dir: Path) -> None:
    # What FirstStep.of leaves to generate still answers as generate does, penalty and all.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    model.generation_config.repetition_penalty = 2.0
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ids = torch.tensor([tokenizer("the cat sat")["input_ids"]])
    plain = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=[], pad_token_id=0)
    expected = tokenizer.decode(plain[0, ids.shape[1] :], skip_special_tokens=True)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    assert not FirstStep.of(model).own
    assert answer(model, tokenizer, params, own_first_step=False) == [(expected, "length")]


def test_a_forward_pass_without_logits_to_keep_leaves_it_to_generate() -> None:
    class Plain(torch.nn.Module):
        config = type("Config", (), {"is_encoder_decoder": False})()

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return input_ids

    step = FirstStep.of(Plain())
    assert not step.own and "logits_to_keep" in step.reason


def test_answers_one_after_another_run_on_one_kept_thread(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = tiny
    backend = TransformersBackend()
    threads: list[int] = []
    run = backend._run

    def recording_run(*args: Any) -> None:
        threads.append(threading.get_ident())
        run(*args)

    monkeypatch.setattr(backend, "_run", recording_run)
    target = Target(key="tiny", checkpoint=Path("/unused"), base_model=None, model="tiny")
    loaded = LoadedModel(target=target, tokenizer=tokenizer, context_length=512, bytes=0, model=model)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)

    async def two_answers() -> None:
        for _ in range(2):
            generation = backend.start(loaded, [tokenizer("the cat")["input_ids"]], params)
            assert [delta.text async for delta in generation]
            await generation.finished
            # The thread is back in the pool microseconds after it resolved `finished`; a new
            # request that came sooner would rightly get a thread of its own.
            await asyncio.sleep(0.5)

    asyncio.run(two_answers())
    assert len(threads) == 2 and threads[0] == threads[1] != threading.get_ident()
