"""The process-wide state of Ray mode, shared by every other module of `twinkle_core.remote`.

The mode and settings that `initialize()` chose, and the registry of live remote groups, are
read by the decorator (which builds groups), the data feed (which asks a group for its mesh), the
actors (which seed themselves) and the runtime (which stops the groups). Keeping that state here,
in a module that imports nothing else of the package, lets each of them import it directly with
no import cycle. Standard library only: no Ray, no torch.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Mode = Literal["local", "ray"]


class LiveGroup(Protocol):
    """What the registry needs of a remote group (`group.RankGroup`, which depends on this module)."""

    # Read-only here (properties), so that RankGroup's narrower `failure` type still matches.
    @property
    def device_mesh(self) -> Any: ...

    @property
    def failure(self) -> BaseException | None: ...

    def stop(self) -> None: ...


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
    groups: dict[str, LiveGroup] = field(default_factory=dict)
    owns_ray: bool = False  # this process started the Ray instance (so shutdown() stops it)


_state = RuntimeState()


def state() -> RuntimeState:
    return _state


def is_ray_mode() -> bool:
    return _state.mode == "ray"


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def group_mesh(name: str) -> Any | None:
    """The device mesh of remote group `name`, if it exists (a DataLoader may take it from there)."""
    group = _state.groups.get(name)
    return group.device_mesh if group is not None else None


def seed_everything(seed: int) -> None:
    """The same seed on every rank before a model exists: identical init, reproducible runs."""
    # numpy and torch are imported here, when a seed is set, so that this module stays light.
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
