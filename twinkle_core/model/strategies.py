"""How the model is spread over the ranks: `accelerate` (DDP, or its FSDP2 plugin) and `native_fsdp`.

A strategy validates its configuration at construction (so a bad argument fails before any
weights are read), wraps the model lazily (LoRA adapters must be added first), and says how to
skip gradient synchronisation inside a gradient-accumulation window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from twinkle_core.mesh import DeviceMesh
from twinkle_core.model.distributed import DistInfo
from twinkle_core.model.precision import compute_dtype

NATIVE_FSDP_KEYS = frozenset({"reshard_after_forward", "cpu_offload"})


class Strategy:
    name: str
    sharded: bool = False  # parameters are DTensor shards (FSDP2)
    uses_autocast: bool = True  # False where the wrapper casts parameters itself

    def wrap(self, model: nn.Module) -> nn.Module:
        raise NotImplementedError

    def no_sync(self, wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class AccelerateStrategy(Strategy):
    """An `accelerate.Accelerator`: DDP with `ddp_config` kwargs, or its FSDP2 plugin when fsdp_size > 1."""

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
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin

        on_cpu = info.device.type == "cpu"
        self.fsdp = mesh.fsdp_size > 1
        if memory_efficient_init:
            # Checked first, so the refusal is the same on CPU and GPU. Under DDP every rank holds the
            # whole model anyway. Under accelerate's FSDP2 plugin the other ranks would start on the
            # meta device, and accelerate re-registers each rank's own non-persistent buffers (rotary
            # inv_freq) after sharding: from meta they cannot be copied to the device.
            raise ValueError(
                "memory_efficient_init needs strategy='native_fsdp' with fsdp_size > 1 (DDP replicates "
                "the weights; accelerate's FSDP2 plugin cannot take ranks built on the meta device)"
            )
        if self.fsdp and on_cpu:
            # accelerate silently ignores its FSDP plugin on CPU and trains with DDP instead.
            raise ValueError(
                "strategy='accelerate' with fsdp_size > 1 cannot shard on CPU (accelerate would silently "
                "fall back to DDP); use strategy='native_fsdp' on CPU"
            )
        if self.fsdp and mesh.dp_size > 1:
            raise ValueError("hybrid sharding (dp_size > 1 and fsdp_size > 1) needs strategy='native_fsdp'")
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
        # Under FSDP accelerate applies the precision (a MixedPrecisionPolicy); under DDP we autocast.
        accel_precision = ("bf16" if mixed_precision == "fp8" else mixed_precision) if self.fsdp else "no"
        self.uses_autocast = not self.fsdp
        self.sharded = self.fsdp
        self.accelerator = Accelerator(
            cpu=on_cpu, mixed_precision=accel_precision, kwargs_handlers=handlers, fsdp_plugin=plugin
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
        reshard = fsdp_config.get("reshard_after_forward", True)
        if not isinstance(reshard, (bool, int)):
            raise ValueError("fsdp_config.reshard_after_forward must be a bool or an int")
        self.reshard_after_forward: bool | int = reshard
        self.cpu_offload = bool(fsdp_config.get("cpu_offload", False))
        if self.cpu_offload and info.device.type == "cpu":
            raise ValueError("fsdp_config.cpu_offload needs a GPU: the parameters already live on the CPU")
        self.mesh = mesh
        self.info = info
        self.mixed_precision = mixed_precision
        self.memory_efficient_init = memory_efficient_init

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
    if strategy == "accelerate":
        return AccelerateStrategy(*args)
    if strategy == "native_fsdp":
        return NativeFSDPStrategy(*args)
    raise ValueError(f"strategy must be 'accelerate' or 'native_fsdp', got {strategy!r}")
