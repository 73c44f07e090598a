"""Building the transformers model: class resolution, config handling, loading or meta creation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig


def resolve_model_cls(model_cls: Any) -> Any:
    """A class, an Auto class, or the name of either in `transformers`; None means AutoModelForCausalLM."""
    if model_cls is None:
        return AutoModelForCausalLM
    if isinstance(model_cls, str):
        resolved = getattr(transformers, model_cls, None)
        if not isinstance(resolved, type):
            raise ValueError(f"model_cls {model_cls!r} is not a class exported by transformers")
        model_cls = resolved
    if not isinstance(model_cls, type) or not hasattr(model_cls, "from_pretrained"):
        raise ValueError(f"model_cls must be a transformers model class or Auto class, got {model_cls!r}")
    return model_cls


def build_config(
    config: PretrainedConfig | dict[str, Any] | None, model_dir: Path | None
) -> PretrainedConfig:
    """The model config: the stored one (with `config` fields overriding it), or `config` alone."""
    if config is not None and not isinstance(config, (dict, PretrainedConfig)):
        raise ValueError(f"config must be a PretrainedConfig or a dict, got {type(config).__name__}")
    if model_dir is None:
        if config is None:
            raise ValueError("TransformersModel needs model_id or config")
        if isinstance(config, PretrainedConfig):
            return config
        fields = dict(config)
        model_type = fields.pop("model_type", None)
        if not model_type:
            raise ValueError("config: a dict without model_id must name its model_type (e.g. 'llama')")
        try:
            return AutoConfig.for_model(model_type, **fields)
        except ValueError as exc:
            raise ValueError(f"config.model_type: {exc}") from exc
    stored = AutoConfig.from_pretrained(str(model_dir))
    if config is None:
        return stored
    overrides = config.to_diff_dict() if isinstance(config, PretrainedConfig) else dict(config)
    if "model_type" in overrides and overrides["model_type"] != stored.model_type:
        raise ValueError(
            f"config.model_type {overrides['model_type']!r} differs from the model's {stored.model_type!r}"
        )
    overrides.pop("model_type", None)
    overrides.pop("transformers_version", None)
    # A key the stored config does not have is most likely a typo (`hiden_size`): setting it would
    # add an attribute that no model code reads, and the job would train something else silently.
    unknown = sorted(key for key in overrides if not hasattr(stored, key))
    if unknown:
        raise ValueError(
            f"config: {unknown} are not fields of the {stored.model_type!r} config stored with the model "
            "(overrides must name existing fields)"
        )
    for key, value in overrides.items():
        setattr(stored, key, value)
    return stored


def load_model(
    model_cls: Any,
    model_dir: Path | None,
    config: PretrainedConfig,
    kwargs: dict[str, Any],
    on_meta: bool,
) -> torch.nn.Module:
    """Load weights from `model_dir` (or initialise from `config`); `on_meta` builds shapes only."""
    kwargs = dict(kwargs)
    # Master weights stay in fp32: mixed precision casts in the forward pass, the optimizer keeps
    # full precision. A caller who wants otherwise passes dtype explicitly.
    if "dtype" not in kwargs and "torch_dtype" not in kwargs:
        kwargs["dtype"] = torch.float32
    if on_meta:
        with torch.device("meta"):
            return _from_config(model_cls, config, kwargs)
    if model_dir is None:
        return _from_config(model_cls, config, kwargs)
    try:
        model: torch.nn.Module = model_cls.from_pretrained(str(model_dir), config=config, **kwargs)
    except TypeError as exc:
        raise ValueError(f"kwargs rejected by {model_cls.__name__}.from_pretrained: {exc}") from exc
    return model


def load_base_model(
    model_dir: Path,
    model_cls: Any = None,
    config: PretrainedConfig | dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    keep_attention: bool = False,
) -> torch.nn.Module:
    """A LoRA job's base model outside training (serving, export), built as the runner built it:
    the spec's `model_cls`, its `config` overrides and its `from_pretrained` kwargs (through the
    same `resolve_model_cls`, `build_config` and `load_model`), so that the adapter lands on the
    model it was trained on.

    One difference: unless the kwargs choose a dtype, the weights load in the dtype they are
    stored in (`dtype="auto"`), not in training's fp32 master weights: training computed in that
    precision or a lower one (mixed precision), and fp32 would double the memory for nothing.
    `attn_implementation` (how attention is computed, no weight) is dropped unless
    `keep_attention`: a GPU kernel such as flash_attention_2 does not load on a CPU."""
    kwargs = dict(kwargs or {})
    if not keep_attention:
        kwargs.pop("attn_implementation", None)
    if "dtype" not in kwargs and "torch_dtype" not in kwargs:
        kwargs["dtype"] = "auto"
    return load_model(resolve_model_cls(model_cls), model_dir, build_config(config, model_dir), kwargs, False)


def _from_config(model_cls: Any, config: PretrainedConfig, kwargs: dict[str, Any]) -> torch.nn.Module:
    build = getattr(model_cls, "from_config", None) or model_cls._from_config
    try:
        model: torch.nn.Module = build(config, **kwargs)
    except TypeError as exc:
        raise ValueError(f"kwargs rejected by {model_cls.__name__}.from_config: {exc}") from exc
    return model


def load_tokenizer(location: str | Path | None) -> Any:
    """The tokenizer stored with the model, or None where the directory holds none."""
    if location is None:
        return None
    path = Path(location)
    if path.is_dir() and not (path / "tokenizer_config.json").exists():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(location))
