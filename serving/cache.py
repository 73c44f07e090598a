"""The models a host keeps loaded: least recently used first out, bounded by parameter bytes.

Loads (a checkpoint kept in object storage is fetched first, as part of its load) run in a
thread of their own and outlive the request that started them: a request waits
for its model at most the load timeout, then gets a 503 with Retry-After while the load goes on,
and the next request for it finds it loaded (or joins the same load; a model is never loaded
twice at once). Room is made before a load, from its size on disk, so the old models and the new
one are never in memory together beyond the bound; the true size is counted once it is loaded.

A model larger than the whole bound is still served, alone: refusing it would make the
checkpoint unusable on this host, and the operator's bound is kept as well as it can be. All
bookkeeping runs on the event loop's thread; only the loads themselves run elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from serving.errors import LoadFailed, ServingError, Unavailable
from serving.loading import LoadedModel
from serving.targets import Target

log = logging.getLogger(__name__)

LOAD_RETRY_AFTER_SECONDS = 5


class ModelCache:
    def __init__(
        self,
        *,
        load: Callable[[Target], LoadedModel],
        estimate: Callable[[Target], int],
        release: Callable[[LoadedModel], None],
        memory_bytes: int,
        fetch: Callable[[Target], None] | None = None,
    ) -> None:
        self._fetch_fn = fetch  # brings a checkpoint of object storage onto this host first
        self._load_fn = load
        self._estimate_fn = estimate
        self._release_fn = release
        self.memory_bytes = memory_bytes
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._loads: dict[str, asyncio.Task[LoadedModel]] = {}
        self._reserved = 0  # bytes of the loads in flight
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="serving-load")

    @property
    def loaded_bytes(self) -> int:
        return sum(model.bytes for model in self._models.values())

    def loaded(self) -> list[dict[str, Any]]:
        """What is in memory, most recently used first (the heartbeat and /healthz report it)."""
        return [
            {"checkpoint": m.key, "model": m.target.model, "bytes": m.bytes}
            for m in reversed(self._models.values())
        ]

    def loading(self) -> list[str]:
        return sorted(self._loads)

    async def get(self, target: Target, timeout: float) -> LoadedModel:
        """The loaded model of `target`, loading it if needed; Unavailable after `timeout` s."""
        model = self._models.get(target.key)
        if model is not None:
            self._models.move_to_end(target.key)
            return model
        task = self._loads.get(target.key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(target))
            self._loads[target.key] = task
            task.add_done_callback(lambda done: self._load_done(target.key, done))
        try:
            # shield: a request that stops waiting does not stop the load.
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise Unavailable(
                f"model {target.model} is loading; retry shortly",
                code="model_loading",
                retry_after=LOAD_RETRY_AFTER_SECONDS,
            ) from None
        except ServingError:
            raise
        except Exception as exc:  # an unexpected failure of the loader: the request is told why
            raise LoadFailed(f"model {target.model} did not load: {exc}") from exc

    async def _load(self, target: Target) -> LoadedModel:
        loop = asyncio.get_running_loop()
        if self._fetch_fn is not None:
            await loop.run_in_executor(self._executor, self._fetch_fn, target)
        estimate = await loop.run_in_executor(self._executor, self._estimate_fn, target)
        self._make_room(estimate)
        self._reserved += estimate
        try:
            model = await loop.run_in_executor(self._executor, self._load_fn, target)
        finally:
            self._reserved -= estimate
        self._make_room(model.bytes)
        self._models[target.key] = model
        return model

    def _load_done(self, key: str, task: asyncio.Task[LoadedModel]) -> None:
        self._loads.pop(key, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Retrieved here so that a load whose requests all timed out still logs its failure;
            # the next request for the model tries again.
            log.warning("loading %s failed: %s", key, exc)

    def _make_room(self, incoming: int) -> None:
        while self._models and self.loaded_bytes + self._reserved + incoming > self.memory_bytes:
            key, evicted = self._models.popitem(last=False)
            log.info(
                "evicting %s (%d MB) for a model of %d MB", key, evicted.bytes // 2**20, incoming // 2**20
            )
            # A generation still running on it keeps its own reference; the memory is freed
            # when that generation ends.
            self._release_fn(evicted)

    def close(self) -> None:
        for key in list(self._models):
            self._release_fn(self._models.pop(key))
        self._executor.shutdown(wait=False, cancel_futures=True)
