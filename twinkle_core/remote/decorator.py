"""`remote_class`: lets a class run in a Ray actor group when constructed with `remote_group=`.

The decorator changes the class in place (no subclass, so `isinstance`, pickling by reference and
the class's own module keep working):

- Local mode (the default, and always under torchrun), or no `remote_group`: construction is
  unchanged. A `remote_group` keyword is passed on if `__init__` accepts it, else dropped, so the
  same script runs under torchrun and as a Ray driver.
- Ray mode with `remote_group='<name>'`:
  - `execute='ranks'` (TransformersModel): one actor per rank of `device_mesh` in the group
    `<name>` (created on first use, shared by later objects of the same group); returns a
    `RemoteHandle` whose method calls run on every rank.
  - `execute='driver'` (Dataset, DataLoader): the object runs once, here in the driver;
    `driver_factory(cls, remote_group, arguments)` builds it (DataLoader: a `ShardedDataLoader`
    that feeds the group's ranks). Without a factory the plain object is built here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from twinkle_core.remote import context
from twinkle_core.remote.group import RankGroup
from twinkle_core.remote.handle import RemoteHandle

T = TypeVar("T", bound=type)
DriverFactory = Callable[[type, str, dict[str, Any]], Any]
REMOTE_GROUP = "remote_group"


@dataclass(frozen=True)
class RemoteClassOptions:
    execute: Literal["ranks", "driver"]
    split_args: tuple[str, ...]
    driver_factory: DriverFactory | None


def remote_class(
    *,
    execute: Literal["ranks", "driver"] = "ranks",
    split_args: Sequence[str] = ("inputs",),
    driver_factory: DriverFactory | None = None,
) -> Callable[[T], T]:
    """Decorate a class so that `Cls(..., remote_group='name')` runs it in Ray mode (see module doc).

    Args:
        execute: 'ranks' (one actor per rank of the `device_mesh` argument) or 'driver' (once, in
            the driver process).
        split_args: method arguments split by data-parallel rank (the others go to every rank).
        driver_factory: for execute='driver', builds the driver-side object from the class, the
            group name and the bound constructor arguments.
    """
    if execute not in ("ranks", "driver"):
        raise ValueError(f"execute must be 'ranks' or 'driver', got {execute!r}")
    options = RemoteClassOptions(execute, tuple(split_args), driver_factory)

    def decorate(cls: T) -> T:
        if "__twinkle_remote__" in cls.__dict__:
            return cls  # already decorated (idempotent: lazy exports may apply it again)
        _patch_new(cls, options)
        _patch_init(cls)
        cls.__twinkle_remote__ = options  # type: ignore[attr-defined]
        return cls

    return decorate


def _patch_new(cls: Any, options: RemoteClassOptions) -> None:
    own_new = cls.__dict__.get("__new__")

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get(REMOTE_GROUP) is not None and context.is_ray_mode():
            remote = _build_remote(klass, options, args, kwargs)
            if remote is not None:
                return remote  # not an instance of klass, so Python skips __init__
        if own_new is not None:
            return own_new(klass, *args, **kwargs)
        parent_new = super(cls, klass).__new__
        if parent_new is object.__new__:
            return object.__new__(klass)
        return parent_new(klass, *args, **kwargs)

    cls.__new__ = staticmethod(__new__)


def _patch_init(cls: Any) -> None:
    original_init = cls.__init__
    parameters = inspect.signature(original_init).parameters
    if REMOTE_GROUP in parameters:
        return  # the class takes remote_group itself

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop(REMOTE_GROUP, None)
        original_init(self, *args, **kwargs)

    cls.__init__ = __init__


def bound_arguments(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments by name (a TypeError for a bad call, as the class would raise)."""
    signature = inspect.signature(cls.__init__)
    bound = signature.bind(None, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(signature.parameters)))  # self
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
            arguments.update(arguments.pop(name))
    return arguments


def _build_remote(
    cls: type, options: RemoteClassOptions, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    kwargs = dict(kwargs)
    group_name = kwargs.pop(REMOTE_GROUP)
    if not isinstance(group_name, str) or not group_name:
        raise ValueError(f"remote_group must be a non-empty string, got {group_name!r}")
    if options.execute == "driver":
        if options.driver_factory is None:
            return None
        return options.driver_factory(cls, group_name, bound_arguments(cls, args, kwargs))
    mesh = bound_arguments(cls, args, kwargs).get("device_mesh")
    group = _group_for(group_name, mesh)
    object_id = group.construct(cls, args, kwargs)
    return RemoteHandle(cls, group, object_id, options.split_args)


def _group_for(name: str, mesh: Any) -> RankGroup:
    state = context.state()
    existing = state.groups.get(name)
    if existing is not None and existing.failure is None:
        assert isinstance(existing, RankGroup), f"remote group {name!r} is a {type(existing).__name__}"
        if mesh is not None and mesh != existing.device_mesh:
            raise ValueError(
                f"device_mesh {mesh} differs from remote group {name!r}'s {existing.device_mesh}: "
                "objects of one group share its ranks"
            )
        return existing
    if mesh is None:
        raise ValueError(
            f"remote_group={name!r} needs device_mesh=...: the mesh says how many ranks (actors) to start"
        )
    resources = state.groups_resources.get(name, context.GroupResources())
    group = RankGroup(name, mesh, resources, seed=state.seed, call_timeout_s=state.call_timeout_s)
    state.groups[name] = group
    return group
