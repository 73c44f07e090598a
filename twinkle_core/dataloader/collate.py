"""Padding a list of `{'input_ids', 'labels'}` samples into a batch of tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

IGNORE_INDEX = -100


class PadCollator:
    """Right-pads to the longest sample: `input_ids` with `pad_token_id`, `labels` with -100, and an
    `attention_mask` of 1 on real tokens and 0 on padding."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        assert samples, "a batch needs at least one sample"
        longest = max(len(sample["input_ids"]) for sample in samples)
        input_ids = torch.full((len(samples), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, sample in enumerate(samples):
            length = len(sample["input_ids"])
            input_ids[row, :length] = torch.as_tensor(sample["input_ids"], dtype=torch.long)
            sample_labels = sample.get("labels", sample["input_ids"])
            labels[row, :length] = torch.as_tensor(sample_labels, dtype=torch.long)
            attention_mask[row, :length] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def resolve_pad_token_id(pad_token_id: int | None, dataset: Any) -> int:
    """The pad id given, else the dataset tokenizer's pad id, else its eos id (padding is masked)."""
    if pad_token_id is not None:
        return pad_token_id
    tokenizer = getattr(dataset, "tokenizer", None)
    for name in ("pad_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, name, None)
        if token_id is not None:
            return int(token_id)
    raise ValueError("pad_token_id is required: the dataset's tokenizer has neither a pad nor an eos token")
