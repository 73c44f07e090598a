"""Consolidating the sharded weights of a checkpoint (its `dcp/` directory) into HF safetensors.

Called by `twinkle_core.checkpoint.hf_model_dir`, which owns the atomic, cached placement of the
result; kept apart from it so that module stays free of torch, and free of imports of ours so
that the two form no import cycle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Consolidated weights are split into files of at most this size, as save_pretrained does.
MAX_WEIGHT_FILE_BYTES = 5 * 1024**3


def write_consolidated_weights(dcp_dir: Path, out_dir: Path, config_dir: Path) -> None:
    """Write the model weights of a `save_sharded` checkpoint as HF safetensors into `out_dir`.

    One process, no process group: the full tensors are allocated from DCP's metadata and every
    shard file is read into them. The input embedding's tied copy (`tie_word_embeddings`) is left
    out, as `save_pretrained` leaves it out.
    """
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from transformers import AutoConfig

    metadata = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    weights: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata):
            weights[key.removeprefix("model.")] = torch.empty(item.size, dtype=item.properties.dtype)
    if not weights:
        raise ValueError(f"{dcp_dir} holds no model weights")
    dcp.load({"model": weights}, checkpoint_id=str(dcp_dir), no_dist=True)
    config = AutoConfig.from_pretrained(str(config_dir))
    if getattr(config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)
    _write_safetensors(weights, out_dir, save_file)


def _write_safetensors(weights: dict[str, torch.Tensor], out_dir: Path, save_file: Any) -> None:
    """One `model.safetensors`, or files of at most MAX_WEIGHT_FILE_BYTES and their index, named
    as `save_pretrained` names them (from_pretrained finds either)."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(weights):
        nbytes = weights[key].numel() * weights[key].element_size()
        if groups[-1] and size + nbytes > MAX_WEIGHT_FILE_BYTES:
            groups.append({})
            size = 0
        groups[-1][key] = weights[key]
        size += nbytes
    if len(groups) == 1:
        save_file(groups[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for index, group in enumerate(groups, start=1):
        name = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2))
