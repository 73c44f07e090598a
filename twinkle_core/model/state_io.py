"""Saving and restoring the stateful parts of training: weights (HF files, or sharded through DCP),
optimizer (one file when every rank holds the same state, else DCP), RNG per rank."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from twinkle_core.checkpoint import SHARDED_STATE_DIR

# The optimizer of a checkpoint with HF weights: one torch.save when the strategy does not shard
# (DDP, one process: every rank holds the same state), else DCP, each rank its own shard. HF-layout
# checkpoints written before OPTIMIZER_FILE existed hold OPTIMIZER_DIR under DDP too.
OPTIMIZER_FILE = "optimizer.pt"
OPTIMIZER_DIR = "optimizer"
SHARDED_DIR = SHARDED_STATE_DIR  # model (+ optimizer) of a sharded checkpoint, one DCP save
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.pth"


def full_model_state_dict(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU, on rank 0 (other ranks get an empty dict). Collective."""
    if not dist.is_initialized():
        module = wrapped.module if isinstance(wrapped, nn.parallel.DistributedDataParallel) else wrapped
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = get_model_state_dict(wrapped, options=options)
    return state if dist.get_rank() == 0 else {}


def load_full_model_state_dict(wrapped: nn.Module, state: dict[str, torch.Tensor], strict: bool) -> None:
    """Load an unsharded state dict (present on every rank) into the wrapped model. Collective."""
    if not dist.is_initialized():
        module = wrapped.module if isinstance(wrapped, nn.parallel.DistributedDataParallel) else wrapped
        _check_keys(module.load_state_dict(state, strict=False), strict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    result = set_model_state_dict(
        wrapped, dict(state), options=StateDictOptions(full_state_dict=True, strict=False)
    )
    _check_keys(result, strict)


def _check_keys(result: Any, strict: bool) -> None:
    missing = list(getattr(result, "missing_keys", []))
    unexpected = list(getattr(result, "unexpected_keys", []))
    if unexpected or (strict and missing):
        raise ValueError(
            f"checkpoint weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no model*.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def save_optimizer(wrapped: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Sharded optimizer state through DCP: every rank writes its own shard. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(wrapped, optimizer)
    dcp.save({"optimizer": state}, checkpoint_id=str(directory))


def load_optimizer(wrapped: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    # get_optimizer_state_dict creates the state tensors (a zero-lr step) that DCP loads into.
    state = {"optimizer": get_optimizer_state_dict(wrapped, optimizer)}
    dcp.load(state, checkpoint_id=str(directory))
    set_optimizer_state_dict(wrapped, optimizer, state["optimizer"])


def save_replicated_optimizer(
    wrapped: nn.Module, optimizer: torch.optim.Optimizer, file: Path, write: bool
) -> None:
    """The optimizer state of a strategy that does not shard it (DDP, one process), where every
    rank holds the same state: one `torch.save` by the rank with `write`, instead of DCP's planning
    collectives and a file per rank. Every rank calls it, none waits for another."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    # Every rank takes the state dict, not only the writer: on an optimizer without state yet it
    # creates the state (a zero-lr step), which must happen alike on all ranks. It is the form the
    # DCP save held: keyed by parameter name rather than position in the optimizer, so a resume
    # matches the state by name (a LoRA model trains a subset of the parameters; a different one
    # fails with the missing names instead of taking another parameter's state).
    state = get_optimizer_state_dict(wrapped, optimizer)
    if write:
        torch.save(state, file)


def load_replicated_optimizer(
    wrapped: nn.Module, optimizer: torch.optim.Optimizer, file: Path, device: torch.device, sharded: bool
) -> None:
    """Restore `save_replicated_optimizer`'s file on every rank (a shared filesystem, as for the HF
    weights). `sharded`: this strategy shards the optimizer, so each rank keeps its part of the
    full state (a checkpoint of a DDP run resumed under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # Onto this rank's device: a CUDA state would otherwise land on the writer's GPU on every rank.
    state = torch.load(file, map_location=device, weights_only=False)
    set_optimizer_state_dict(wrapped, optimizer, state, options=StateDictOptions(full_state_dict=sharded))


def save_sharded(wrapped: nn.Module, optimizer: torch.optim.Optimizer | None, directory: Path) -> None:
    """The model's (and optimizer's) sharded state in one DCP save: every rank writes only its own
    shards, nothing is gathered. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(wrapped)}
    else:
        model_state, optim_state = get_state_dict(wrapped, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    dcp.save(state, checkpoint_id=str(directory))


def load_sharded(wrapped: nn.Module, optimizer: torch.optim.Optimizer | None, directory: Path) -> None:
    """Restore `save_sharded`'s state (the optimizer too unless None): each rank reads only the
    parts of the files its own shards need (DCP reshards when the layout differs). Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        model_only: dict[str, Any] = {"model": get_model_state_dict(wrapped)}
        dcp.load(model_only, checkpoint_id=str(directory))
        _check_keys(set_model_state_dict(wrapped, model_only["model"]), strict=True)
        return
    # get_state_dict creates the optimizer's state tensors (a zero-lr step) that DCP loads into.
    model_state, optim_state = get_state_dict(wrapped, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(directory))
    result = set_state_dict(
        wrapped, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    _check_keys(result, strict=True)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
