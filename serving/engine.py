"""The engine of a host: a backend (transformers or vLLM), the cache of loaded models, and the
generation slots, with the timeouts that turn waiting into a 503 a client can retry.

A slot is taken before an answer starts and given back when the backend's generation has
really ended (its thread or request finished), not when the HTTP answer ends: a cancelled
stream's generation stops within a token, and only then does the next request get its slot, so
the number of generations running never exceeds `slots`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from serving.cache import ModelCache
from serving.errors import Unavailable
from serving.loading import LoadedModel
from serving.sampling import Delta, SamplingParams
from serving.targets import Target

log = logging.getLogger(__name__)

SLOT_RETRY_AFTER_SECONDS = 1


class Generation(Protocol):
    finished: asyncio.Future[None]

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[Delta]: ...


class Backend(Protocol):
    name: str

    def default_memory_bytes(self) -> int: ...

    def estimate_bytes(self, target: Target) -> int: ...

    def load(self, target: Target) -> LoadedModel: ...

    def release(self, loaded: LoadedModel) -> None: ...

    def start(self, loaded: LoadedModel, prompts: list[list[int]], params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    load_timeout: float
    slots: int
    slot_timeout: float


class Engine:
    def __init__(
        self, backend: Backend, limits: Limits, fetch: Callable[[Target], None] | None = None
    ) -> None:
        self.backend = backend
        self.limits = limits
        self.cache = ModelCache(
            load=backend.load,
            estimate=backend.estimate_bytes,
            release=backend.release,
            memory_bytes=limits.memory_bytes,
            fetch=fetch,
        )
        self._slots = asyncio.Semaphore(limits.slots)
        self.busy = 0

    async def model(self, target: Target) -> LoadedModel:
        return await self.cache.get(target, self.limits.load_timeout)

    async def start(
        self, loaded: LoadedModel, prompts: list[list[int]], params: SamplingParams
    ) -> Generation:
        """Start generating once a slot is free (503 after the slot timeout). The caller iterates
        the deltas and calls `cancel()` when it stops listening."""
        try:
            if self._slots.locked():
                await asyncio.wait_for(self._slots.acquire(), self.limits.slot_timeout)
            else:
                # A free slot is taken at once. wait_for would wrap the acquire in a task and a
                # timer and take two turns of the event loop, on every request's way to its
                # first token.
                await self._slots.acquire()
        except TimeoutError:
            raise Unavailable(
                f"all {self.limits.slots} generation slots are busy; retry shortly",
                code="no_free_slot",
                retry_after=SLOT_RETRY_AFTER_SECONDS,
            ) from None
        self.busy += 1
        try:
            generation = self.backend.start(loaded, prompts, params)
        except BaseException:
            self._release()
            raise
        generation.finished.add_done_callback(lambda _: self._release())
        return generation

    def _release(self) -> None:
        self.busy -= 1
        self._slots.release()

    def health(self) -> dict[str, Any]:
        return {
            "engine": self.backend.name,
            "models": self.cache.loaded(),
            "loading": self.cache.loading(),
            "loaded_bytes": self.cache.loaded_bytes,
            "memory_bytes": self.cache.memory_bytes,
            "slots": {"total": self.limits.slots, "busy": self.busy},
        }

    def close(self) -> None:
        self.cache.close()
