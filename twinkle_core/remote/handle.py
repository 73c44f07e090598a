"""The driver-side handle of an object that lives in a remote group (one copy per rank).

Calling a method runs it on every rank at once (ranks take part in collectives together, so
they must all be called). Arguments named in `split_args` (default: `inputs`) are split by
data-parallel rank (see `twinkle_core.remote.data`); the rest go to every rank.

Results are gathered: when every rank returns the same value (a step's global loss, a checkpoint
path, resume progress, None) the handle returns that value, as the local object would; when they
differ (e.g. `forward_backward`'s per-rank micro-batch loss) it returns the list of per-rank
values, in rank order.

Reading an attribute: a property runs on every rank (it may involve collectives) and is gathered
the same way; a plain instance attribute (`tokenizer`, `cur_step`, ...) is read from rank 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from twinkle_core.remote.data import split_for_ranks
from twinkle_core.remote.group import RankGroup

_MISSING = object()


class RemoteHandle:
    def __init__(self, cls: type, group: RankGroup, object_id: int, split_args: Sequence[str]) -> None:
        self._cls = cls
        self._group = group
        self._object_id = object_id
        self._split_args = tuple(split_args)

    @property
    def remote_group(self) -> str:
        return self._group.name

    @property
    def device_mesh(self) -> Any:
        return self._group.device_mesh

    @property
    def remote_pids(self) -> list[int]:
        """The process id of each rank's actor, in rank order."""
        return list(self._group.pids)

    def __repr__(self) -> str:
        return f"<remote {self._cls.__name__} in group {self._group.name!r}, {self._group.world_size} ranks>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        static = inspect.getattr_static(self._cls, name, _MISSING)
        if isinstance(static, property):
            return gather(self._group.get_attribute(self._object_id, name, all_ranks=True))
        if isinstance(static, staticmethod | classmethod):
            return getattr(self._cls, name)  # no instance involved: runs here
        if static is not _MISSING and callable(static):
            return self._remote_method(name)
        return self._group.get_attribute(self._object_id, name, all_ranks=False)[0]

    def _remote_method(self, name: str) -> Callable[..., Any]:
        signature = inspect.signature(getattr(self._cls, name))
        group = self._group

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(None, *args, **kwargs)  # None stands for self
            split = {arg: bound.arguments[arg] for arg in self._split_args if arg in bound.arguments}
            per_rank = []
            parts = {
                arg: split_for_ranks(value, group.device_mesh.data_world_size, f"{name}({arg}=...)")
                for arg, value in split.items()
            }
            for rank in range(group.world_size):
                data_rank = rank * group.device_mesh.data_world_size // group.world_size
                for arg, values in parts.items():
                    bound.arguments[arg] = values[data_rank]
                per_rank.append((tuple(bound.args[1:]), dict(bound.kwargs)))
            return gather(group.call(self._object_id, name, per_rank))

        call.__name__ = name
        call.__doc__ = getattr(getattr(self._cls, name), "__doc__", None)
        return call

    def close(self) -> None:
        """Drop the remote copies of this object (the group's actors stay for other objects)."""
        self._group.release(self._object_id)


def gather(results: list[Any]) -> Any:
    """The common value when every rank returned the same, else the per-rank list."""
    first = results[0]
    if all(same_value(first, other) for other in results[1:]):
        return first
    return results


def same_value(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_value, a, b))
    try:
        return bool(a == b)
    except Exception:  # values without a usable == (e.g. arrays): treat as different
        return False
