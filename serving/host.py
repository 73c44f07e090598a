"""The serving host process (`twinkle-jobs serve`): the engine, its HTTP app on its own port,
and its registration in SQL, heartbeated until the process stops.

Before anything touches CUDA, the host leases its GPUs from the machine's pool like a training
job (`serving.gpus`) and sees only those. The backend is chosen once at start: vLLM when
`serving_engine` says so, or when it is `auto` and vLLM imports on a CUDA host; transformers
otherwise (any CPU or GPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from jobcore.db.migrate import wait_for_schema
from jobcore.settings import Settings
from serving.app import create_app
from serving.engine import Backend, Engine, Limits
from serving.fetch import fetcher
from serving.gpus import ServingGpus
from serving.registry import HostRegistry

log = logging.getLogger(__name__)


def vllm_usable() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def choose_backend(settings: Settings) -> Backend:
    choice = settings.serving_engine
    if choice == "vllm" or (choice == "auto" and vllm_usable()):
        from serving.vllm_backend import VllmBackend

        return VllmBackend(work_dir=settings.vllm_work_dir)
    from serving.generation import TransformersBackend

    return TransformersBackend()


def build_engine(settings: Settings, backend: Backend | None = None) -> Engine:
    backend = backend or choose_backend(settings)
    limits = Limits(
        memory_bytes=settings.serving_memory_bytes or backend.default_memory_bytes(),
        load_timeout=settings.serving_load_timeout,
        slots=settings.serving_slots,
        slot_timeout=settings.serving_slot_timeout,
    )
    return Engine(backend, limits, fetch=fetcher(settings))


def build_app(settings: Settings, engine: Engine, registry: HostRegistry | None) -> FastAPI:
    app = create_app(
        engine,
        secret=settings.serving_secret_value,
        jobs_root=settings.jobs_dir,
        allowed_roots=settings.allowed_root_paths,
        owned_dirs=settings.service_dirs,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        beat = None
        if registry is not None:
            await asyncio.to_thread(registry.register)
            beat = asyncio.create_task(_heartbeat(engine, registry, settings.serving_heartbeat_seconds))
        try:
            yield
        finally:
            if beat is not None:
                beat.cancel()
                await asyncio.to_thread(registry.deregister)  # type: ignore[union-attr]
            engine.close()

    app.router.lifespan_context = lifespan
    return app


async def _heartbeat(engine: Engine, registry: HostRegistry, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        health = engine.health()
        try:
            await asyncio.to_thread(registry.heartbeat, health["models"], health["loaded_bytes"])
        except Exception as exc:  # the database away for a while: the next beat tries again
            log.warning("serving host heartbeat failed: %s", exc)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the app starts, so that port 0 gives the real port to
    advertise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def advertised_host(bind_host: str) -> str:
    """The name other machines reach a host bound to `bind_host` at (TWINKLE_SERVING_URL wins)."""
    if bind_host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{bind_host}]" if ":" in bind_host else bind_host


def run_host(settings: Settings, **uvicorn_options: Any) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Each load has its line ("loaded ... on ..."); transformers' bar per load would add a dozen.
    # (Read when transformers is first imported, which the first load does.)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not wait_for_schema(settings.resolved_database_url):
        return
    sock = bind(settings.serving_host, settings.serving_port)
    port = sock.getsockname()[1]
    url = settings.serving_url or f"http://{advertised_host(settings.serving_host)}:{port}"
    # The GPUs first, before anything initialises CUDA: the engine sees only the leased ones.
    gpus = ServingGpus.from_settings(settings)
    leased = gpus.acquire()
    if leased:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(leased)
    try:
        engine = build_engine(settings)
        registry = HostRegistry(
            settings.resolved_database_url,
            url=url,
            engine=engine.backend.name,
            memory_bytes=engine.limits.memory_bytes,
            slots=engine.limits.slots,
            gpus=gpus,
        )
        app = build_app(settings, engine, registry)
        log.info(
            "serving host on %s: %s engine on %s, %d slots, %d MB for models",
            url,
            engine.backend.name,
            f"GPU(s) {','.join(leased)}" if leased else "the CPU",
            engine.limits.slots,
            engine.limits.memory_bytes // 2**20,
        )
        # No access log: its line was written as each answer started, on the way to its first
        # token; serving.answers logs each answer as it ends instead (the API server, which
        # relays every request here, keeps its own access log).
        config = uvicorn.Config(
            app, log_level="info", access_log=False, timeout_graceful_shutdown=10, **uvicorn_options
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        gpus.release()  # the lifespan's deregister did, unless the app never started
