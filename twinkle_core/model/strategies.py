"""How the model is spread over the ranks: `accelerate` (DDP, or its FSDP2 plugin; native FSDP2 for
an FSDP mesh on CPU, where accelerate cannot shard) and `native_fsdp`.

A strategy validates its configuration at construction (so a bad argument fails before any
weights are read), wraps the model lazily (LoRA adapters must be added first), and says how to
skip gradient synchronisation inside a gradient-accumulation window.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from twinkle_core.mesh import DeviceMesh
from twinkle_core.model.distributed import DistInfo
from twinkle_core.model.precision import compute_dtype
from twinkle_core.options import PRECISIONS_BY_STRATEGY, check_precision_for_strategy

logger = logging.getLogger(__name__)

NATIVE_FSDP_KEYS = frozenset({"reshard_after_forward", "cpu_offload"})


class Strategy:
    name: str
    sharded: bool = False  # parameters are DTensor shards (FSDP2)
    uses_autocast: bool = True  # False where the wrapper casts parameters itself
    implementation: str = ""  # what actually wraps the model, logged once at construction

    def wrap(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def no_sync(self, wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class AccelerateStrategy(Strategy):
    """An `accelerate.Accelerator`: DDP with `ddp_config` kwargs, or its FSDP2 plugin when fsdp_size > 1.

    A 2-D mesh (dp_size > 1 and fsdp_size > 1) is hybrid sharding through accelerate's
    `ParallelismConfig` (dp_replicate x dp_shard). On CPU accelerate cannot shard: `make_strategy`
    then builds the native FSDP2 implementation instead (see `accelerate_strategy`).
    """

    name = "accelerate"

    def __init__(
        self,
        mesh: DeviceMesh,
        info: DistInfo,
        mixed_precision: str,
        ddp_config: dict[str, Any],
        fsdp_config: dict[str, Any],
        memory_efficient_init: bool,
    ) -> None:
        from accelerate import Accelerator, ParallelismConfig
        from accelerate.utils import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin

        on_cpu = info.device.type == "cpu"
        self.fsdp = mesh.fsdp_size > 1
        _refuse_memory_efficient_init(memory_efficient_init)
        if self.fsdp and on_cpu:
            # accelerate silently ignores its FSDP plugin on CPU and trains with DDP instead.
            raise ValueError(
                "accelerate cannot shard on CPU (it would silently fall back to DDP); build the strategy "
                "with make_strategy, which shards through native FSDP2 there"
            )
        if not self.fsdp and fsdp_config:
            raise ValueError("fsdp_config applies only when device_mesh.fsdp_size > 1")
        if self.fsdp and ddp_config:
            raise ValueError("ddp_config applies to DDP (fsdp_size == 1), not to FSDP")
        try:
            handlers = [DistributedDataParallelKwargs(**ddp_config)] if ddp_config else []
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2, **fsdp_config) if self.fsdp else None
        except TypeError as exc:
            field = "fsdp_config" if self.fsdp else "ddp_config"
            raise ValueError(f"{field}: {exc}") from exc
        # accelerate builds the (dp_replicate, dp_shard) mesh that its FSDP2 plugin shards over.
        parallelism = (
            ParallelismConfig(dp_replicate_size=mesh.dp_size, dp_shard_size=mesh.fsdp_size)
            if self.fsdp
            else None
        )
        # Under FSDP accelerate applies the precision (a MixedPrecisionPolicy); under DDP we autocast.
        accel_precision = ("bf16" if mixed_precision == "fp8" else mixed_precision) if self.fsdp else "no"
        self.uses_autocast = not self.fsdp
        self.sharded = self.fsdp
        if not self.fsdp:
            self.implementation = "accelerate DDP"
        elif mesh.dp_size > 1:
            self.implementation = (
                f"accelerate FSDP2, hybrid sharding (dp {mesh.dp_size} x fsdp {mesh.fsdp_size})"
            )
        else:
            self.implementation = f"accelerate FSDP2 (fsdp {mesh.fsdp_size})"
        self.accelerator = Accelerator(
            cpu=on_cpu,
            mixed_precision=accel_precision,
            kwargs_handlers=handlers,
            fsdp_plugin=plugin,
            parallelism_config=parallelism,
        )
        if self.accelerator.num_processes != info.world_size:
            raise RuntimeError(
                f"accelerate sees {self.accelerator.num_processes} processes but WORLD_SIZE is "
                f"{info.world_size}: the ranks would train alone"
            )

    def wrap(self, model: nn.Module) -> nn.Module:
        wrapped: nn.Module = self.accelerator.prepare_model(model)
        return wrapped

    def no_sync(self, wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
        if sync:
            return contextlib.nullcontext()
        if isinstance(wrapped, nn.parallel.DistributedDataParallel):
            return wrapped.no_sync()
        if self.fsdp:
            return _fsdp2_no_sync(wrapped)
        return contextlib.nullcontext()


class NativeFSDPStrategy(Strategy):
    """`fully_shard` on every decoder layer, then on the root; HSDP on a 2-D mesh when dp_size > 1."""

    name = "native_fsdp"
    sharded = True
    uses_autocast = False

    def __init__(
        self,
        mesh: DeviceMesh,
        info: DistInfo,
        mixed_precision: str,
        ddp_config: dict[str, Any],
        fsdp_config: dict[str, Any],
        memory_efficient_init: bool,
    ) -> None:
        if ddp_config:
            raise ValueError("ddp_config applies to strategy='accelerate' only")
        unknown = set(fsdp_config) - NATIVE_FSDP_KEYS
        if unknown:
            raise ValueError(
                f"fsdp_config: unknown keys {sorted(unknown)} for strategy='native_fsdp' "
                f"(known: {sorted(NATIVE_FSDP_KEYS)})"
            )
        # None (the default) is torch's own: the decoder layers reshard after forward, the root
        # does not, since the backward needs its parameters (embeddings, head) first. Resharding
        # the root too re-gathered them at the start of every backward (measured: ~3% of a step
        # of a small model on two CPU ranks).
        reshard = fsdp_config.get("reshard_after_forward")
        if reshard is not None and not isinstance(reshard, (bool, int)):
            raise ValueError("fsdp_config.reshard_after_forward must be a bool or an int")
        self.reshard_after_forward: bool | int | None = reshard
        self.cpu_offload = bool(fsdp_config.get("cpu_offload", False))
        if self.cpu_offload and info.device.type == "cpu":
            raise ValueError("fsdp_config.cpu_offload needs a GPU: the parameters already live on the CPU")
        self.mesh = mesh
        self.info = info
        self.mixed_precision = mixed_precision
        self.memory_efficient_init = memory_efficient_init
        layout = (
            f"dp {mesh.dp_size} x fsdp {mesh.fsdp_size}" if mesh.dp_size > 1 else f"fsdp {mesh.fsdp_size}"
        )
        kind = "hybrid sharding" if mesh.dp_size > 1 else "sharded"
        self.implementation = f"native FSDP2 (fully_shard), {kind} ({layout})"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        if not dist.is_initialized():
            # A single process still needs a (trivial) process group for DTensor and DCP.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        torch_mesh = self.mesh.to_torch(self.info.device.type)
        dtype = compute_dtype(self.mixed_precision)
        kwargs: dict[str, Any] = {"mesh": torch_mesh, "reshard_after_forward": self.reshard_after_forward}
        if dtype is not None:
            # Gradients are reduced in fp32 so that the sum over ranks loses nothing.
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if self.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        full_state = None
        if self.memory_efficient_init and self.info.is_main:
            # Keep rank 0's full weights alive past sharding: they are the broadcast source.
            full_state = dict(model.state_dict())
        elif not self.memory_efficient_init:
            model.to(self.info.device)
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        if self.memory_efficient_init:
            _materialise_from_rank0(model, full_state, self.info)
        return model

    def no_sync(self, wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if sync else _fsdp2_no_sync(wrapped)


@contextlib.contextmanager
def _fsdp2_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _materialise_from_rank0(
    model: nn.Module, full_state: dict[str, torch.Tensor] | None, info: DistInfo
) -> None:
    """Other ranks built on meta: allocate their shards, then receive rank 0's weights.

    One parameter at a time, rank 0 scatters the full tensor (`distribute_tensor` with
    `src_data_rank=0`), so a rank only ever receives its own shard. On the other ranks the
    full-size source is an `empty` placeholder whose pages are never written, so it costs no memory.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not info.is_main or any(p.device.type == "meta" for p in model.parameters()):
        model.to_empty(device=info.device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if info.is_main:
                assert full_state is not None
                source = full_state[name].to(device=info.device, dtype=param.dtype)
            else:
                source = torch.empty(param.shape, dtype=param.dtype, device=info.device)
            if isinstance(param, DTensor) and _evenly_row_sharded(param):
                # Scatter straight into this rank's shard: no temporary copy of it at all.
                local = param.to_local()
                chunks = list(source.chunk(param.device_mesh.size(), dim=0)) if info.is_main else None
                dist.scatter(local, chunks, group=param.device_mesh.get_group(), group_src=0)
            elif isinstance(param, DTensor):
                shard = distribute_tensor(source, param.device_mesh, param.placements, src_data_rank=0)
                param.to_local().copy_(shard.to_local())
            else:
                dist.broadcast(source, src=0)
                param.copy_(source)
            del source
    # Buffers are not sharded and non-persistent ones (rotary inv_freq) are not in the state dict:
    # after to_empty they hold garbage on the other ranks, so every buffer comes from rank 0.
    for _name, buffer in model.named_buffers():
        source = buffer if info.is_main else torch.empty_like(buffer)
        dist.broadcast(source, src=0)
        if not info.is_main:
            buffer.copy_(source)


def _evenly_row_sharded(param: Any) -> bool:
    """A 1-D FSDP mesh with dim 0 split in equal parts (FSDP2's unpadded local shard is then a chunk)."""
    from torch.distributed.tensor import Shard

    mesh = param.device_mesh
    return bool(
        mesh.ndim == 1
        and param.placements[0] == Shard(0)
        and param.shape[0] % mesh.size() == 0
        and param.to_local().is_contiguous()
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks: the classes a model lists in `_no_split_modules`."""
    names: set[str] = set()
    for module in model.modules():
        no_split = getattr(module, "_no_split_modules", None)
        if no_split:
            names.update(no_split)
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    # Fallback for models without _no_split_modules: the children of the largest ModuleList.
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=lambda modules: len(list(modules)))) if lists else []


def make_strategy(
    strategy: str,
    mesh: DeviceMesh,
    info: DistInfo,
    mixed_precision: str,
    ddp_config: dict[str, Any] | None,
    fsdp_config: dict[str, Any] | None,
    memory_efficient_init: bool,
) -> Strategy:
    for field, value in (("ddp_config", ddp_config), ("fsdp_config", fsdp_config)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{field} must be a dict, got {type(value).__name__}")
    args = (
        mesh,
        info,
        mixed_precision,
        dict(ddp_config or {}),
        dict(fsdp_config or {}),
        memory_efficient_init,
    )
    if strategy in PRECISIONS_BY_STRATEGY:
        # The same rule as the job spec's (twinkle_core.options): what the API refuses, so does this.
        check_precision_for_strategy(mixed_precision, strategy)
    if strategy == "accelerate":
        built = accelerate_strategy(*args)
    elif strategy == "native_fsdp":
        built = NativeFSDPStrategy(*args)
    else:
        raise ValueError(f"strategy must be 'accelerate' or 'native_fsdp', got {strategy!r}")
    _log_implementation_once(built, info)
    return built


def accelerate_strategy(
    mesh: DeviceMesh,
    info: DistInfo,
    mixed_precision: str,
    ddp_config: dict[str, Any],
    fsdp_config: dict[str, Any],
    memory_efficient_init: bool,
) -> Strategy:
    """strategy='accelerate': accelerate itself, except for an FSDP mesh on CPU.

    accelerate ignores its FSDP plugin on CPU (every rank would hold the whole model and train
    DDP), so there the same request shards through the native FSDP2 implementation, with the same
    mesh (hybrid sharding on a 2-D one), precision policy and exact resume. It keeps the name
    'accelerate': the user asked for the default strategy, and checkpoints record that.
    """
    _refuse_memory_efficient_init(memory_efficient_init)
    if mesh.fsdp_size == 1 or info.device.type != "cpu":
        return AccelerateStrategy(mesh, info, mixed_precision, ddp_config, fsdp_config, memory_efficient_init)
    if ddp_config:
        raise ValueError("ddp_config applies to DDP (fsdp_size == 1), not to FSDP")
    unknown = set(fsdp_config) - NATIVE_FSDP_KEYS
    if unknown:
        raise ValueError(
            f"fsdp_config: {sorted(unknown)} cannot be honoured on CPU, where strategy='accelerate' shards "
            f"through native FSDP2 (accelerate cannot shard on CPU); it takes {sorted(NATIVE_FSDP_KEYS)}"
        )
    native = NativeFSDPStrategy(mesh, info, mixed_precision, ddp_config, fsdp_config, memory_efficient_init)
    native.name = "accelerate"
    native.implementation += ", because accelerate cannot shard on CPU"
    return native


def _refuse_memory_efficient_init(memory_efficient_init: bool) -> None:
    if memory_efficient_init:
        # The same refusal on CPU and GPU. Under DDP every rank holds the whole model anyway. Under
        # accelerate's FSDP2 plugin the other ranks would start on the meta device, and accelerate
        # re-registers each rank's own non-persistent buffers (rotary inv_freq) after sharding: from
        # meta they cannot be copied to the device.
        raise ValueError(
            "memory_efficient_init needs strategy='native_fsdp' with fsdp_size > 1 (strategy='accelerate' "
            "does not support it: DDP replicates the weights, and accelerate's FSDP2 plugin cannot take "
            "ranks built on the meta device; on GPU its fsdp_config={'cpu_ram_efficient_loading': True} "
            "is accelerate's own variant)"
        )


_logged: set[tuple[str, str]] = set()


def _log_implementation_once(strategy: Strategy, info: DistInfo) -> None:
    """Say once per process, on rank 0, what really wraps the model for the requested strategy."""
    key = (strategy.name, strategy.implementation)
    if info.is_main and key not in _logged:
        _logged.add(key)
        # A substitution (accelerate's request served by native FSDP2) is a warning: visible by default.
        substituted = strategy.name == "accelerate" and isinstance(strategy, NativeFSDPStrategy)
        level = logging.WARNING if substituted else logging.INFO
        logger.log(level, "strategy=%r runs as %s", strategy.name, strategy.implementation)
