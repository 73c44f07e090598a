"""The vocabulary of TransformersModel's choices, shared by the library and the job spec.

Light on purpose (no torch): `twinkle_core.spec`, which the API server and the CLI import, and
the library itself read the same names and the same rule from here, so `jobs validate`, the API
and `TransformersModel` accept and refuse the same things.
"""

from __future__ import annotations

from typing import Literal, get_args

MixedPrecision = Literal["no", "fp8", "fp16", "bf16"]
Strategy = Literal["accelerate", "native_fsdp"]

MIXED_PRECISIONS: tuple[str, ...] = get_args(MixedPrecision)
STRATEGIES: tuple[str, ...] = get_args(Strategy)

# What each strategy can run. native_fsdp's MixedPrecisionPolicy has no fp8 (torchao's float8
# layers are wired only into the accelerate path).
PRECISIONS_BY_STRATEGY: dict[str, frozenset[str]] = {
    "accelerate": frozenset(MIXED_PRECISIONS),
    "native_fsdp": frozenset({"no", "fp16", "bf16"}),
}


def check_precision_for_strategy(mixed_precision: str, strategy: str) -> None:
    """ValueError when `strategy` cannot run `mixed_precision` (names both and what it supports)."""
    allowed = PRECISIONS_BY_STRATEGY.get(strategy)
    if allowed is not None and mixed_precision not in allowed:
        raise ValueError(
            f"mixed_precision '{mixed_precision}' is not supported by the '{strategy}' strategy "
            f"(supported: {', '.join(sorted(allowed))})"
        )
