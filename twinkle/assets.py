"""Tiny local models, tokenizers and data sets for examples and tests (see twinkle_core.assets)."""

from twinkle_core.assets import (
    build_tiny_model,
    build_tokenizer,
    write_chat_dataset,
    write_prompt_completion_dataset,
    write_text_dataset,
)

__all__ = [
    "build_tiny_model",
    "build_tokenizer",
    "write_chat_dataset",
    "write_prompt_completion_dataset",
    "write_text_dataset",
]
