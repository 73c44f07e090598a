"""Process-wide execution mode: `local` (the default, and always under torchrun) or `ray`.

`initialize(mode='ray')` connects this process (the driver) to a Ray cluster; from then on a class
decorated with `remote_class` and constructed with `remote_group='<name>'` runs in a group of Ray
actors, one per rank. Ray actors themselves stay in local mode: they build the real objects.
"""

from __future__ import annotations

import logging
from typing import Any

from twinkle_core.remote.context import (
    GroupResources,
    Mode,
    RuntimeState,
    is_ray_mode,
    seed_everything,
    state,
    under_torchrun,
)

# The state and its readers live in `context` (so that every module can import them without a
# cycle); they stay importable from here, where `initialize` sets them.
__all__ = [
    "RAY_MISSING",
    "GroupResources",
    "Mode",
    "RuntimeState",
    "initialize",
    "is_ray_mode",
    "seed_everything",
    "shutdown",
    "state",
    "under_torchrun",
]

logger = logging.getLogger(__name__)

_MODES = ("local", "ray")
RAY_MISSING = "Ray mode needs the optional dependency group 'ray': pip install 'twinkle-jobs[ray]'"


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
    current = state()
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
            current.owns_ray = True
    current.mode = mode
    current.seed = seed
    current.call_timeout_s = call_timeout_s
    current.groups_resources = resources
    if seed is not None:
        seed_everything(seed)


def shutdown() -> None:
    """Stop every remote group (its actors and placement group) and return to local mode."""
    current = state()
    for group in list(current.groups.values()):
        group.stop()
    current.groups.clear()
    if current.owns_ray:
        import ray

        ray.shutdown()
        current.owns_ray = False
    current.mode = "local"
