"""Mixed precision: what each setting means on each device, and the gradient scaler for fp16."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from twinkle_core.options import MIXED_PRECISIONS

PRECISIONS = MIXED_PRECISIONS
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def check_precision(mixed_precision: str, device: torch.device) -> None:
    """Reject a precision the device cannot run, at construction time (never a silent fallback)."""
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {mixed_precision!r}")
    if mixed_precision != "fp8":
        return
    if device.type != "cuda":
        raise ValueError(
            f"mixed_precision='fp8' needs a CUDA GPU with fp8 support (compute capability >= 8.9); "
            f"this process runs on {device.type}. Use 'bf16' or 'no'."
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ValueError(
            f"mixed_precision='fp8' needs compute capability >= 8.9 (Ada/Hopper or newer); "
            f"this GPU has {capability[0]}.{capability[1]}"
        )
    if importlib.util.find_spec("torchao") is None:
        raise ValueError("mixed_precision='fp8' needs torchao: pip install 'twinkle-jobs[fp8]'")


def compute_dtype(mixed_precision: str) -> torch.dtype | None:
    """The dtype matmuls run in (fp8 layers keep their non-fp8 ops in bf16); None for 'no'."""
    return _DTYPES.get(mixed_precision)


@contextlib.contextmanager
def autocast(mixed_precision: str, device: torch.device) -> Iterator[None]:
    dtype = compute_dtype(mixed_precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def make_grad_scaler(
    mixed_precision: str, grad_scaler_config: dict[str, Any] | None, device: torch.device, sharded: bool
) -> Any:
    """A GradScaler for fp16 (ShardedGradScaler under FSDP2), None otherwise."""
    config = dict(grad_scaler_config or {})
    if mixed_precision != "fp16":
        if config:
            raise ValueError(
                f"grad_scaler_config applies to mixed_precision='fp16' only (got {mixed_precision!r})"
            )
        return None
    try:
        if sharded:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(device=device.type, **config)
        return torch.amp.GradScaler(device.type, **config)
    except TypeError as exc:
        raise ValueError(f"grad_scaler_config: {exc}") from exc


def fp8_eligible(module: torch.nn.Module, fqn: str) -> bool:
    """Whether torchao should swap this layer: fp8 matmuls need both dims divisible by 16, and the
    output head stays in bf16 for accuracy."""
    if not isinstance(module, torch.nn.Linear) or fqn.endswith("lm_head"):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def check_fp8_layers(model: torch.nn.Module) -> int:
    """The number of fp8-eligible linear layers; none is an error (the job would train in bf16)."""
    count = sum(fp8_eligible(module, name) for name, module in model.named_modules())
    if count == 0:
        raise ValueError(
            "mixed_precision='fp8': no linear layer of this model can run in fp8 (both dimensions must "
            "be divisible by 16, lm_head excluded), so it would silently train in bf16; use 'bf16'"
        )
    return count


def convert_to_fp8(model: torch.nn.Module) -> int:
    """Swap eligible nn.Linear layers for torchao float8 training layers (CUDA only, checked earlier);
    returns how many were converted, and fails if none was."""
    from torchao.float8 import convert_to_float8_training

    check_fp8_layers(model)
    convert_to_float8_training(model, module_filter_fn=fp8_eligible)
    converted = sum(type(module).__name__ == "Float8Linear" for module in model.modules())
    if converted == 0:
        raise RuntimeError("mixed_precision='fp8': torchao converted no layer to Float8Linear")
    return converted
