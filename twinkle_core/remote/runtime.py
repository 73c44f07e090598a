"""Process-wide execution mode: `local` (the default, and always under torchrun) or `ray`.

`initialize(mode='ray')` connects this process (the driver) to a Ray cluster; from then on a class
decorated with `remote_class` and constructed with `remote_group='<name>'` runs in a group of Ray
actors, one per rank. Ray actors themselves stay in local mode: they build the real objects.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from twinkle_core.remote.group import RankGroup

logger = logging.getLogger(__name__)

Mode = Literal["local", "ray"]
_MODES = ("local", "ray")
RAY_MISSING = "Ray mode needs the optional dependency group 'ray': pip install 'twinkle-jobs[ray]'"


@dataclass(frozen=True)
class GroupResources:
    """What one rank of a remote group reserves in its placement-group bundle."""

    num_cpus: float = 1.0
    num_gpus: float | None = None  # None: 1 per rank when the cluster has GPUs, else 0

    def __post_init__(self) -> None:
        if self.num_cpus < 0:
            raise ValueError(f"groups.num_cpus must be >= 0, got {self.num_cpus}")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise ValueError(f"groups.num_gpus must be >= 0, got {self.num_gpus}")


@dataclass
class RuntimeState:
    mode: Mode = "local"
    seed: int | None = None
    call_timeout_s: float | None = None
    groups_resources: dict[str, GroupResources] = field(default_factory=dict)
    groups: dict[str, RankGroup] = field(default_factory=dict)
    owns_ray: bool = False  # this process started the Ray instance (so shutdown() stops it)


_state = RuntimeState()


def state() -> RuntimeState:
    return _state


def is_ray_mode() -> bool:
    return _state.mode == "ray"


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def seed_everything(seed: int) -> None:
    """The same seed on every rank before a model exists: identical init, reproducible runs."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def initialize(
    mode: Mode = "local",
    address: str | None = None,
    *,
    seed: int | None = None,
    groups: dict[str, dict[str, float]] | None = None,
    call_timeout_s: float | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
    **ray_init_kwargs: Any,
) -> None:
    """Choose how `remote_class` objects run in this process.

    Args:
        mode: 'local' builds every object in this process (under torchrun each rank is one);
            'ray' makes objects constructed with `remote_group=` run in Ray actors.
        address: the Ray cluster ('auto', 'ray://host:10001', 'host:6379'); None starts a local
            Ray instance (or uses one this process already joined, or RAY_ADDRESS).
        seed: seeds python/numpy/torch here (local) or in every actor before it builds anything
            (ray), so that runs are reproducible and identical across the two modes.
        groups: per-group resources of one rank, e.g. {'actor': {'num_cpus': 1, 'num_gpus': 1}}.
        call_timeout_s: a remote call that takes longer raises instead of waiting (default: no
            limit; a dead actor is detected without it).
        num_cpus, num_gpus, object_store_memory, ray_init_kwargs: passed to `ray.init` when this
            call starts Ray.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if call_timeout_s is not None and call_timeout_s <= 0:
        raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s}")
    resources = {name: GroupResources(**values) for name, values in (groups or {}).items()}
    if mode == "ray":
        if under_torchrun():
            raise ValueError(
                "mode='ray' inside a torchrun rank: run the script as a plain driver (python script.py) "
                "or use mode='local' under torchrun"
            )
        try:
            import ray
        except ImportError as exc:
            raise ImportError(RAY_MISSING) from exc
        if not ray.is_initialized():
            logger.info("connecting to Ray at %s", address or "a new local instance")
            ray.init(
                address=address,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                object_store_memory=object_store_memory,
                **ray_init_kwargs,
            )
            _state.owns_ray = True
    _state.mode = mode
    _state.seed = seed
    _state.call_timeout_s = call_timeout_s
    _state.groups_resources = resources
    if seed is not None:
        seed_everything(seed)


def shutdown() -> None:
    """Stop every remote group (its actors and placement group) and return to local mode."""
    for group in list(_state.groups.values()):
        group.stop()
    _state.groups.clear()
    if _state.owns_ray:
        import ray

        ray.shutdown()
        _state.owns_ray = False
    _state.mode = "local"
