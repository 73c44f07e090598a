"""Generation with transformers: `model.generate` in a thread of the backend's pool, its tokens
streamed as text.

Plain `generate` does the decoding (greedy, KV cache, the model's own kernels), so serving runs
at its speed; only the first token comes from a forward pass of the host's own, which spares it
generate's set-up (first_token.py), and generate goes on from that pass's cache. The request's
knobs are a logits processor (`SeededSampler`: temperature, top_p and the seed) and a stopping
criterion (`ChoiceTracker`), which sees every new token of every choice the moment it exists: it
turns tokens into text, ends a choice at EOS, at a stop sequence or at max_tokens, hands the text
to the event loop, and ends the whole generation when the request is cancelled (a client that
went away), so that its slot frees within one token.

`n` choices of a prompt are one batch of n copies; the prompts of a completions request are
generated one after the other.

The generating thread and the event loop share one GIL, and `generate` takes it back between
every torch op, so a loop woken to send a token waited ~2.5 ms for it (measured in the host: the
first token reached the socket 2.7 ms after the thread had it, ~10% of a small model's time to
first token). After each delta the thread therefore waits, bounded by HANDOFF_WAIT_SECONDS, until
the loop has sent it on (its reader asks for the next one), instead of fighting the loop for the
GIL; the loop's work is under the GIL anyway, so the wait costs the decode little.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from serving.first_token import NO_FIRST_STEP, FirstStep, prefill
from serving.loading import LoadedModel, estimate_bytes, load_with_transformers
from serving.placement import DevicePlacer, visible_devices
from serving.sampling import ChoiceText, Delta, SamplingParams, SeededSampler, make_generator
from serving.targets import Target

log = logging.getLogger(__name__)

_END = object()

# The longest a generating thread waits for the event loop to take a delta (a loop busy with other
# requests, or an answer nobody reads any more, cannot stall generation for longer per token).
HANDOFF_WAIT_SECONDS = 0.005
# Above any host's generation slots: threads are made only when none is idle, and kept.
MAX_GENERATING_THREADS = 4096


class ThreadedGeneration:
    """A generation running in a thread: its deltas as an async iterator, `cancel()`, and
    `finished`, a future resolved when the thread has ended (and so the slot may be reused)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Each item with the event its thread waits on until the loop has sent it on.
        self._queue: asyncio.Queue[tuple[Any, threading.Event | None]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.finished: asyncio.Future[None] = loop.create_future()

    # -- the generating thread's side
    def emit(self, item: Any) -> None:
        taken = threading.Event() if isinstance(item, Delta) else None
        self._post(self._queue.put_nowait, (item, taken))
        if taken is not None:
            # Waiting releases the GIL to the loop (see the module's docstring).
            taken.wait(HANDOFF_WAIT_SECONDS)

    def done(self) -> None:
        def resolve(_: Any) -> None:
            if not self.finished.done():
                self.finished.set_result(None)

        self._post(resolve, None)

    def _post(self, callback: Callable[[Any], Any], item: Any) -> None:
        # A closed loop (the host shutting down) has nobody listening.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, item)

    # -- the event loop's side
    def cancel(self) -> None:
        self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while True:
            item, taken = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            if taken is not None:  # the caller is back for more: this delta is on its way
                taken.set()


class ChoiceTracker:
    """A stopping criterion over the n rows of one prompt's batch (one row per choice)."""

    def __init__(
        self,
        tokenizer: Any,
        params: SamplingParams,
        eos_ids: set[int],
        first_index: int,
        generation: ThreadedGeneration,
    ) -> None:
        self.params = params
        self.eos_ids = set() if params.ignore_eos else eos_ids
        self.first_index = first_index
        self.generation = generation
        self.texts = [ChoiceText(tokenizer, params.stop) for _ in range(params.n)]
        self.done = [False] * params.n
        self._flags: torch.Tensor | None = None  # `done` on the model's device, rebuilt on change

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.generation.cancelled.is_set():
            return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, token in enumerate(input_ids[:, -1].tolist()):
            if not self.done[row]:
                self._take(row, int(token))
        if self._flags is None:
            # Rebuilt only when a choice ends: no host-to-device copy per token on a GPU.
            self._flags = torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)
        return self._flags

    def _take(self, row: int, token: int) -> None:
        text = self.texts[row]
        if token in self.eos_ids:
            text.ids.append(token)  # counted, never shown
            self._finish(row, text.flush(), "stop")
            return
        chunk, stopped = text.add(token)
        if stopped:
            self._finish(row, chunk, "stop")
        elif len(text.ids) >= self.params.max_tokens:
            self._finish(row, chunk + text.flush(), "length")
        elif chunk:
            self.generation.emit(Delta(self.first_index + row, chunk))

    def _finish(self, row: int, chunk: str, reason: str) -> None:
        self.done[row] = True
        self._flags = None
        tokens = len(self.texts[row].ids)
        self.generation.emit(
            Delta(self.first_index + row, chunk, finish_reason=reason, completion_tokens=tokens)
        )

    def finish_open_choices(self) -> None:
        """Choices that `generate` ended without us (its own max length): they ran out of tokens."""
        for row, done in enumerate(self.done):
            if not done:
                self._finish(row, self.texts[row].flush(), "length")


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token that ends an answer: the generation config's (chat models often list several)
    and the tokenizer's."""
    found: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list):
            found.update(int(v) for v in value)
    return found


class TransformersBackend:
    name = "transformers"

    def __init__(self, devices: list[torch.device] | None = None) -> None:
        # Every GPU the host leased (serving/placement.py puts each model on one, or spreads it).
        self.placer = DevicePlacer.for_devices(devices or visible_devices())
        # Per loaded model (by key): whether the host takes its first step (first_token.py).
        self._first_steps: dict[str, FirstStep] = {}
        # The generating threads, kept between answers: a thread started for each answer cost it
        # 0.9 ms of its time to first token (bench_serving_compare, 150 pairs, 95% CI 0.73-1.13
        # ms). `Thread.start()` also waits until the new thread runs, and held the event loop
        # 0.6-0.8 ms before it could send the answer's headers; handing the work to a kept
        # thread takes it 0.13 ms. The engine's slots bound how many generate at once; the pool
        # never makes one wait. (Its threads are not daemons: a generation still running at
        # exit is one whose answer was cancelled, and it stops within a token.)
        self._threads = ThreadPoolExecutor(
            max_workers=MAX_GENERATING_THREADS, thread_name_prefix="generation"
        )

    def default_memory_bytes(self) -> int:
        return sum(self.placer.capacity.values())

    def estimate_bytes(self, target: Target) -> int:
        return estimate_bytes(target)

    def load(self, target: Target) -> LoadedModel:
        placement = self.placer.choose(target.key, self.estimate_bytes(target))
        try:
            loaded = load_with_transformers(target, placement)
        except BaseException:
            self.placer.removed(target.key)
            raise
        self.placer.placed(target.key, loaded.model)
        first_step = FirstStep.of(loaded.model)
        if not first_step.own:
            log.info("%s: generate takes every step (%s)", target.key, first_step.reason)
        self._first_steps[target.key] = first_step
        return loaded

    def release(self, loaded: LoadedModel) -> None:
        loaded.model = None
        self._first_steps.pop(loaded.key, None)
        self.placer.removed(loaded.key)
        if any(device.type == "cuda" for device in self.placer.devices):
            torch.cuda.empty_cache()

    def start(
        self, loaded: LoadedModel, prompts: list[list[int]], params: SamplingParams
    ) -> ThreadedGeneration:
        generation = ThreadedGeneration(asyncio.get_running_loop())
        model, tokenizer = loaded.model, loaded.tokenizer
        first_step = self._first_steps.get(loaded.key, NO_FIRST_STEP)
        self._threads.submit(self._run, model, tokenizer, prompts, params, generation, first_step)
        return generation

    def _run(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[list[int]],
        params: SamplingParams,
        generation: ThreadedGeneration,
        first_step: FirstStep,
    ) -> None:
        try:
            with torch.inference_mode():
                # The inputs' device: the whole model's, or its first layers' (the logits come
                # back there too), so the sampler draws where the scores are.
                device = model.device
                generator = make_generator(params.seed, device)
                eos = eos_token_ids(model, tokenizer)
                for number, prompt in enumerate(prompts):
                    if generation.cancelled.is_set():
                        break
                    tracker = ChoiceTracker(tokenizer, params, eos, number * params.n, generation)
                    self._generate(model, device, prompt, params, generator, tracker, first_step)
                    if not generation.cancelled.is_set():
                        tracker.finish_open_choices()
            generation.emit(_END)
        except Exception as exc:
            log.exception("generation failed")
            generation.emit(exc)
        finally:
            generation.done()

    def _generate(
        self,
        model: Any,
        device: torch.device,
        prompt: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        tracker: ChoiceTracker,
        first_step: FirstStep,
    ) -> None:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        input_ids = torch.tensor([prompt] * params.n, dtype=torch.long, device=device)
        processors = LogitsProcessorList()
        if params.temperature > 0:
            processors.append(SeededSampler(params.temperature, params.top_p, generator))
        pad = model.generation_config.pad_token_id
        config = GenerationConfig(
            max_new_tokens=params.max_tokens,
            do_sample=False,  # the sampler above draws; greedy then takes its token
            num_beams=1,
            # The tracker's EOS tokens (none for ignore_eos). Not None: generate would take the
            # model's own then, and stop a choice at EOS that ignore_eos asked to go on.
            eos_token_id=sorted(tracker.eos_ids),
            pad_token_id=pad if pad is not None else 0,
        )
        cached: dict[str, Any] = {}
        if first_step.own:
            first = prefill(model, first_step, input_ids, processors)
            if bool(tracker(first.input_ids, first.scores).all()):
                return  # every choice ended at its first token (EOS, a stop, max_tokens 1)
            input_ids, cached = first.input_ids, first.cache
            config.max_new_tokens = params.max_tokens - 1
        model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            **cached,
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([tracker]),
        )
