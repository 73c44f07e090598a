"""LoRA adapters through peft: creation, per-adapter state dicts, and plain-HF export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

LORA_KEY_MARKERS = (
    ".lora_A.",
    ".lora_B.",
    ".lora_embedding_A.",
    ".lora_embedding_B.",
    ".lora_magnitude_vector.",
)


def lora_config(config: Any, overrides: dict[str, Any]) -> Any:
    from peft import LoraConfig

    if isinstance(config, LoraConfig):
        if overrides:
            raise ValueError("add_adapter_to_model: pass extra LoRA fields in the config, not as keywords")
        return config
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError(f"adapter config must be a peft LoraConfig or a dict, got {type(config).__name__}")
    fields = {**config, **overrides}
    fields.pop("type", None)
    fields.pop("adapter_name", None)
    fields.setdefault("task_type", "CAUSAL_LM")
    try:
        return LoraConfig(**fields)
    except TypeError as exc:
        raise ValueError(f"adapter config: {exc}") from exc


def add_adapter(model: nn.Module, adapter_name: str, config: Any) -> nn.Module:
    """Wrap in a PeftModel on the first adapter; later adapters are added to the same model."""
    from peft import PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        if adapter_name in model.peft_config:
            raise ValueError(f"adapter_name {adapter_name!r} already exists")
        model.add_adapter(adapter_name, config)
        return model
    peft_model: nn.Module = get_peft_model(model, config, adapter_name=adapter_name)
    return peft_model


def adapter_key_map(model: nn.Module, adapter_name: str) -> dict[str, str]:
    """Saved adapter key (peft's file format, adapter name removed) -> the model's state-dict key."""
    mapping: dict[str, str] = {}
    token = f".{adapter_name}."
    for key in model.state_dict():
        if token in key and any(marker in key for marker in LORA_KEY_MARKERS):
            mapping[key.replace(token, ".", 1)] = key
        elif key.endswith(f".{adapter_name}") and ".lora_magnitude_vector" in key:
            mapping[key[: -len(adapter_name) - 1]] = key
    return mapping


def adapter_state(full_state: dict[str, torch.Tensor], mapping: dict[str, str]) -> dict[str, torch.Tensor]:
    return {saved: full_state[model_key].contiguous() for saved, model_key in mapping.items()}


def save_adapter(
    model: nn.Module, adapter_name: str, weights: dict[str, torch.Tensor], directory: Path
) -> None:
    """`adapter_config.json` + `adapter_model.safetensors`, loadable by `PeftModel.from_pretrained`."""
    from safetensors.torch import save_file

    config: Any = model.peft_config[adapter_name]  # type: ignore[index]
    config.save_pretrained(str(directory))
    save_file(weights, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})


def merged_state(full_state: dict[str, torch.Tensor], model: nn.Module, adapter_name: str) -> dict[str, Any]:
    """Base weights with the adapter folded in (W + B @ A * scaling), under the base model's names."""
    config: Any = model.peft_config[adapter_name]  # type: ignore[index]
    if getattr(config, "use_dora", False):
        raise ValueError("merged export of DoRA adapters is not supported; export the adapter alone")
    if any(".lora_embedding_" in k or ".modules_to_save." in k for k in full_state):
        raise ValueError(
            "merged export supports LoRA on linear layers only; export the adapter alone for embedding "
            "adapters or modules_to_save"
        )
    rank, alpha = config.r, config.lora_alpha
    scaling = alpha / (rank**0.5) if getattr(config, "use_rslora", False) else alpha / rank
    merged: dict[str, torch.Tensor] = {}
    prefix = "base_model.model."
    for key, tensor in full_state.items():
        if any(marker in key for marker in LORA_KEY_MARKERS):
            continue
        if ".base_layer." in key:
            module = key.split(".base_layer.")[0]
            base_name = f"{module}.{key.split('.base_layer.')[1]}"
            a_key = f"{module}.lora_A.{adapter_name}.weight"
            b_key = f"{module}.lora_B.{adapter_name}.weight"
            if base_name.endswith(".weight") and a_key in full_state:
                delta = full_state[b_key].float() @ full_state[a_key].float() * scaling
                if getattr(config, "fan_in_fan_out", False):
                    delta = delta.T
                tensor = (tensor.float() + delta).to(tensor.dtype)
            key = base_name
        merged[key.removeprefix(prefix)] = tensor
    return merged
