"""DeviceMesh: how the ranks of a job are arranged (data-parallel replicas x FSDP shard groups).

Only the two dimensions twinkle_core implements exist as real sizes. The other parallelisms the
seed's `from_sizes` signature implies (tensor, pipeline, context, expert) are accepted as
arguments so that a call written for them fails with a message that says what is unsupported,
instead of a TypeError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

_UNSUPPORTED_SIZES = ("tp_size", "pp_size", "cp_size", "ep_size")


@dataclass(frozen=True)
class DeviceMesh:
    """`dp_size` replicas, each sharded over `fsdp_size` ranks; dp_size x fsdp_size = world size."""

    dp_size: int = 1
    fsdp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("dp_size", "fsdp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"device_mesh.{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_sizes(
        cls,
        dp_size: int | None = None,
        fsdp_size: int = 1,
        tp_size: int = 1,
        pp_size: int = 1,
        cp_size: int = 1,
        ep_size: int = 1,
        world_size: int | None = None,
    ) -> DeviceMesh:
        """Build a mesh; `dp_size=None` (or -1) fills the world: world_size // fsdp_size.

        The world is `world_size` when given, else the launcher's: the WORLD_SIZE that torchrun (or
        a Ray actor of a remote group) exports. A process outside any launcher, such as a Ray
        driver, has no world yet: there the sizes define it (their product; `dp_size=None` counts
        as 1). Under a launcher dp_size x fsdp_size must equal its world size.
        """
        for name, value in zip(_UNSUPPORTED_SIZES, (tp_size, pp_size, cp_size, ep_size), strict=True):
            if value != 1:
                raise ValueError(
                    f"device_mesh.{name}={value} is not supported: twinkle_core implements data "
                    "parallelism (dp_size) and FSDP sharding (fsdp_size) only"
                )
        if not isinstance(fsdp_size, int) or fsdp_size < 1:
            raise ValueError(f"device_mesh.fsdp_size must be a positive integer, got {fsdp_size!r}")
        world = world_size if world_size is not None else launcher_world_size()
        if dp_size is not None and dp_size != -1:
            dp = dp_size
        elif world is None:
            dp = 1
        elif world % fsdp_size:
            raise ValueError(f"device_mesh.fsdp_size ({fsdp_size}) does not divide the world size ({world})")
        else:
            dp = world // fsdp_size
        mesh = cls(dp_size=dp, fsdp_size=fsdp_size)
        if world is not None:
            mesh.check_world_size(world)
        return mesh

    @property
    def world_size(self) -> int:
        return self.dp_size * self.fsdp_size

    @property
    def data_world_size(self) -> int:
        """Ranks that read different batches: all of them (FSDP shards also read their own data)."""
        return self.world_size

    @property
    def data_rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def check_world_size(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ValueError(
                f"device_mesh: dp_size ({self.dp_size}) x fsdp_size ({self.fsdp_size}) = {self.world_size} "
                f"must equal the world size ({world_size})"
            )

    def to_torch(self, device_type: str) -> Any:
        """The torch DeviceMesh for FSDP2: 1-D ("fsdp",) or, for hybrid sharding, 2-D ("dp", "fsdp")."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.dp_size > 1:
            return init_device_mesh(
                device_type, (self.dp_size, self.fsdp_size), mesh_dim_names=("dp", "fsdp")
            )
        return init_device_mesh(device_type, (self.fsdp_size,), mesh_dim_names=("fsdp",))


def launcher_world_size() -> int | None:
    """The world size a launcher (torchrun, or a remote group's actor) gave this process, if any."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value is not None else None
