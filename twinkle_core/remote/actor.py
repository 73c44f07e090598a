"""The body of one rank of a remote group: a Ray actor that joins torch.distributed and then hosts
the real objects (a TransformersModel, ...) built in local mode inside it.

Plain class here; `group.py` turns it into a Ray actor class with `ray.remote` so that this module
imports without Ray.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from twinkle_core.remote.context import seed_everything

# Environment the driver's objects depend on (offline hub, caches, job identity) travels to the ranks.
FORWARDED_ENV_PREFIXES = ("HF_", "TRANSFORMERS_", "TWINKLE_", "TOKENIZERS_")


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


class RankActor:
    def __init__(self) -> None:
        self._objects: dict[int, Any] = {}
        self._next_id = 0

    # -- placement --------------------------------------------------------------------------------

    def node_info(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
        }

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def setup(self, env: dict[str, str], seed: int | None, timeout_s: float) -> None:
        """Become a torchrun-like rank: the same environment variables, then the process group.

        Every rank of the group must call this at the same time (init_process_group rendezvous).
        """
        os.environ.update(env)
        import torch
        import torch.distributed as dist

        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        torch.set_num_threads(max(threads, 1))
        world_size = int(env["WORLD_SIZE"])
        if world_size > 1 and not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(env["LOCAL_RANK"]))
                backend = "nccl"
            else:
                backend = "gloo"
            dist.init_process_group(
                backend=backend,
                init_method="env://",
                rank=int(env["RANK"]),
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
            )
        if seed is not None:
            seed_everything(seed)

    # -- objects ----------------------------------------------------------------------------------

    def construct(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """Build `cls(*args, **kwargs)` here (local mode) and keep it under a new id."""
        obj = cls(*args, **kwargs)
        object_id = self._next_id
        self._next_id += 1
        self._objects[object_id] = obj
        return object_id

    def call(self, object_id: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self._objects[object_id], method)(*args, **kwargs)

    def get_attribute(self, object_id: int, name: str) -> Any:
        return getattr(self._objects[object_id], name)

    def release(self, object_id: int) -> None:
        self._objects.pop(object_id, None)
