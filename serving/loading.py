"""A checkpoint into memory with transformers: the full model, or a LoRA adapter merged into its
base on load (one set of weights, generation as fast as the base's), with the checkpoint's own
tokenizer (so its chat template). The base is built as the job built it: the spec's model class,
config overrides and kwargs come with the request (`twinkle.base_*`).

`estimate_bytes` sizes a load before it starts, from the safetensors files on disk, so that the
cache can make room first instead of holding the new model and the evicted ones at once.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from serving.errors import InvalidRequest, LoadFailed
from serving.placement import Placement, bytes_by_device
from serving.targets import Target
from twinkle_core import checkpoint as ckpt

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
# A context for a model whose config states none (rare for causal LMs).
FALLBACK_CONTEXT = 2048


@dataclass
class LoadedModel:
    target: Target
    tokenizer: Any
    context_length: int
    bytes: int
    model: Any  # the engine's own object: a transformers model, or a vLLM engine

    @property
    def key(self) -> str:
        return self.target.key


def weights_dir(checkpoint: Path) -> Path:
    """Where the checkpoint's Hugging Face weights are (a sharded checkpoint is consolidated on
    first use, by `twinkle_core.checkpoint.hf_model_dir`)."""
    try:
        return ckpt.hf_model_dir(checkpoint)
    except ValueError as exc:
        raise LoadFailed(str(exc)) from exc


def is_adapter(weights: Path) -> bool:
    return (weights / ADAPTER_CONFIG).is_file()


def base_dir(target: Target) -> Path:
    """The directory of a LoRA checkpoint's base model (a hub id is fetched into the hub cache)."""
    from twinkle_core.hub import resolve_model_id

    if target.base_model is None:
        raise InvalidRequest(
            f"{target.key} holds a LoRA adapter: twinkle.base_model must name its base model",
            param="twinkle.base_model",
        )
    try:
        return resolve_model_id(target.base_model)
    except (ValueError, OSError) as exc:
        raise LoadFailed(f"base model {target.base_model}: {exc}") from exc


def load_base(target: Target, device: torch.device) -> Any:
    """A LoRA checkpoint's base, built as the job's runner built it (`load_base_model`: the spec's
    model class, config overrides and kwargs), in its stored dtype unless the kwargs chose one."""
    from twinkle_core.model.loading import load_base_model

    return load_base_model(
        base_dir(target),
        target.base_model_cls,
        target.base_config,
        target.base_kwargs,
        keep_attention=device.type == "cuda",
    )


def safetensors_bytes(directory: Path) -> int:
    """The tensor bytes of the safetensors files in `directory`, read from their headers (an
    8-byte length, then JSON with each tensor's data offsets): exact, unlike the file sizes."""
    total = 0
    for path in directory.glob("*.safetensors"):
        try:
            with path.open("rb") as fh:
                header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
            total += sum(
                end - start
                for name, info in header.items()
                if name != "__metadata__"
                for start, end in [info["data_offsets"]]
            )
        except (OSError, ValueError, KeyError, struct.error):
            total += path.stat().st_size
    return total


def estimate_bytes(target: Target) -> int:
    """The parameter bytes the load will hold, from the files on disk (0 when unknown yet: a base
    still to be fetched from a hub). Merging keeps the base's size."""
    weights = weights_dir(target.checkpoint)
    if not is_adapter(weights):
        return safetensors_bytes(weights)
    if target.base_model is None:
        return 0
    from twinkle_core.hub import parse_model_id

    try:
        hub, _ = parse_model_id(target.base_model)
    except ValueError:
        return 0
    return safetensors_bytes(Path(target.base_model)) if hub is None else 0


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(bytes_by_device(model).values())


def context_length(config: Any, tokenizer: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    # Tokenizers without a limit report a huge sentinel (int(1e30)).
    return limit if isinstance(limit, int) and 0 < limit < 1_000_000 else FALLBACK_CONTEXT


def load_tokenizer(weights: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(weights))
    except (OSError, ValueError) as exc:
        raise LoadFailed(f"{weights}: no tokenizer saved with the checkpoint ({exc})") from exc


def put_on_devices(model: torch.nn.Module, placement: Placement) -> None:
    """Move a model loaded on the CPU to where `placement` says: whole onto one device, or spread
    over several by accelerate, whole decoder layers per device (its hooks move the activations
    between them, and the logits back to the inputs' device)."""
    if not placement.spread:
        model.to(placement.device)
        return
    from accelerate import dispatch_model, infer_auto_device_map

    device_map = infer_auto_device_map(
        model,
        max_memory=placement.max_memory,
        no_split_module_classes=list(getattr(model, "_no_split_modules", None) or []),
    )
    spilled = sorted({str(where) for where in device_map.values() if where in ("cpu", "disk")})
    if spilled:  # the placement's shares were too tight for whole layers
        raise LoadFailed(f"the model does not fit on the devices given to it (it would spill to {spilled})")
    dispatch_model(model, device_map)


def load_with_transformers(target: Target, placement: Placement) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    weights = weights_dir(target.checkpoint)
    tokenizer = load_tokenizer(weights)
    try:
        if is_adapter(weights):
            from peft import PeftModel

            base = load_base(target, placement.device)
            model = PeftModel.from_pretrained(base, str(weights)).merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(str(weights), dtype="auto")
    except (OSError, ValueError, RuntimeError) as exc:
        raise LoadFailed(f"{target.key}: the model did not load ({exc})") from exc
    put_on_devices(model, placement)
    model.eval()
    loaded = LoadedModel(
        target=target,
        tokenizer=tokenizer,
        context_length=context_length(model.config, tokenizer),
        bytes=parameter_bytes(model),
        model=model,
    )
    spread_over = sorted({str(where) for where in getattr(model, "hf_device_map", {}).values()})
    where = ", ".join(spread_over) if placement.spread else str(placement.device)
    log.info("loaded %s (%d MB) on %s", target.key, loaded.bytes // 2**20, where)
    return loaded
