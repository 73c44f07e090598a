"""How batches reach the ranks of a remote group.

Split rule: a method argument named `inputs` (see `remote_class(split_args=...)`) is split by
data-parallel rank; every other argument goes to every rank unchanged.

- A `ShardedBatch` (what a DataLoader built with `remote_group=` yields) already holds one batch
  per data-parallel rank, each collated exactly as that rank's DataLoader would under torchrun:
  rank r gets part r. This is what makes a Ray run bitwise equal to a torchrun run.
- A dict is split value by value: tensors along dim 0 and lists/tuples into equal contiguous
  chunks (dim 0 must be divisible by the number of data-parallel ranks); other values (ints,
  strings, None) go to every rank. A bare tensor or list is split the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from twinkle_core.remote.context import group_mesh


@dataclass(frozen=True)
class ShardedBatch:
    """One global batch as its data-parallel parts: `parts[r]` is data-parallel rank r's batch."""

    parts: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.parts)


def split_for_ranks(value: Any, dp_world_size: int, name: str) -> list[Any]:
    """`value` as `dp_world_size` parts, by the rule in this module's docstring."""
    if isinstance(value, ShardedBatch):
        if len(value.parts) != dp_world_size:
            raise ValueError(
                f"{name}: a ShardedBatch of {len(value.parts)} parts for {dp_world_size} data-parallel "
                "ranks (the DataLoader's device_mesh differs from the model's)"
            )
        return list(value.parts)
    if isinstance(value, dict):
        columns = {key: _split_value(item, dp_world_size, f"{name}[{key!r}]") for key, item in value.items()}
        return [{key: parts[r] for key, parts in columns.items()} for r in range(dp_world_size)]
    if _splittable(value):
        return _split_value(value, dp_world_size, name)
    raise ValueError(
        f"{name}: cannot split a {type(value).__name__} by data-parallel rank (pass a dict of tensors "
        "or lists, a tensor, a list, or a batch from a DataLoader built with remote_group=)"
    )


def _splittable(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor | list | tuple)


def _split_value(value: Any, parts: int, name: str) -> list[Any]:
    import torch

    if not _splittable(value) or (isinstance(value, torch.Tensor) and value.dim() == 0):
        return [value] * parts  # a scalar setting, the same for every rank
    length = len(value)
    if length % parts:
        raise ValueError(f"{name}: dim 0 has {length} rows, not divisible by the {parts} data-parallel ranks")
    size = length // parts
    if isinstance(value, torch.Tensor):
        return list(value.split(size, dim=0))
    return [value[r * size : (r + 1) * size] for r in range(parts)]


class DataRankView:
    """A device mesh seen from one data-parallel rank (what DataLoader reads from a mesh)."""

    def __init__(self, data_rank: int, data_world_size: int) -> None:
        self.data_rank = data_rank
        self.data_world_size = data_world_size


class ShardedDataLoader:
    """A DataLoader built with `remote_group=` in Ray mode: it runs once, in the driver, and yields
    `ShardedBatch`es holding every data-parallel rank's batch for the same step.

    It holds one rank view of the DataLoader per data-parallel rank over the same dataset object
    (the dataset is loaded once); their progress is identical, so `get_state` is one number.
    """

    def __init__(self, loader_cls: type, device_mesh: Any, arguments: dict[str, Any]) -> None:
        world = int(device_mesh.data_world_size)
        self.device_mesh = device_mesh
        self.loaders = [
            loader_cls(**{**arguments, "device_mesh": DataRankView(rank, world)}) for rank in range(world)
        ]

    def __iter__(self) -> Iterator[ShardedBatch]:
        for parts in zip(*self.loaders, strict=True):
            yield ShardedBatch(tuple(parts))

    def __len__(self) -> int:
        return len(self.loaders[0])

    def __getattr__(self, name: str) -> Any:
        # Read-only settings and progress (batch_size, epoch, samples_per_epoch, ...): any rank's.
        if name.startswith("_") or name == "loaders":
            raise AttributeError(name)
        return getattr(self.loaders[0], name)

    def get_state(self) -> dict[str, int]:
        states = [loader.get_state() for loader in self.loaders]
        assert all(s == states[0] for s in states), f"rank views diverged: {states}"
        return states[0]

    def state_dict(self) -> dict[str, int]:
        return self.get_state()

    def resume_from_checkpoint(self, consumed_train_samples: int) -> None:
        for loader in self.loaders:
            loader.resume_from_checkpoint(consumed_train_samples)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for loader in self.loaders:
            loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:
            loader.set_epoch(epoch)


def sharded_dataloader(loader_cls: type, group_name: str, arguments: dict[str, Any]) -> ShardedDataLoader:
    """`remote_class` driver factory of DataLoader: the mesh is the argument or the group's."""
    mesh = arguments.get("device_mesh") or group_mesh(group_name)
    if mesh is None:
        raise ValueError(
            f"DataLoader(remote_group={group_name!r}) needs device_mesh=... (or a model built in that "
            "group first): the mesh says how many data-parallel ranks to feed"
        )
    return ShardedDataLoader(loader_cls, mesh, arguments)
