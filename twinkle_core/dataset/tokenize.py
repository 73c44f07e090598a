"""Turning validated records into `(input_ids, labels)` pairs, and packing them.

Labels hold the token id where the model is trained to predict that token and `IGNORE_INDEX`
(-100, what `torch.nn.CrossEntropyLoss` skips) everywhere else:
- chat: only the assistant turns (as marked by the chat template) carry labels;
- prompt_completion: only the completion and the eos after it;
- text: every token, plus an eos so the model learns where a text ends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle_core.dataset.formats import DataFormat

IGNORE_INDEX = -100

# `{% generation %}` (optionally with whitespace control dashes) marks assistant text in templates
# that support `return_assistant_tokens_mask`.
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass
class Sample:
    input_ids: list[int]
    labels: list[int]

    def has_labels(self) -> bool:
        return any(label != IGNORE_INDEX for label in self.labels)


class RecordTokenizer:
    """Tokenises one record of a given data format with a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id: int | None = getattr(tokenizer, "eos_token_id", None)
        template = getattr(tokenizer, "chat_template", None)
        self.chat_template_has_generation_tags = isinstance(template, str) and bool(
            _GENERATION_TAG.search(template)
        )
        # transformers maps generation spans to tokens with offsets only fast tokenizers provide.
        self.use_assistant_mask = self.chat_template_has_generation_tags and bool(
            getattr(tokenizer, "is_fast", False)
        )

    def __call__(self, record: dict[str, Any], data_format: DataFormat) -> Sample:
        if data_format == "chat":
            return self.chat(record["messages"])
        if data_format == "prompt_completion":
            return self.prompt_completion(record["prompt"], record["completion"])
        return self.text(record["text"])

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def _with_eos(self, ids: list[int]) -> list[int]:
        if self.eos_token_id is not None and (not ids or ids[-1] != self.eos_token_id):
            return [*ids, self.eos_token_id]
        return ids

    def text(self, text: str) -> Sample:
        ids = self._with_eos(self._encode(text, add_special_tokens=True))
        return Sample(ids, list(ids))

    def prompt_completion(self, prompt: str, completion: str) -> Sample:
        # Tokenised apart so the boundary is exact; special tokens (bos) belong to the prompt.
        prompt_ids = self._encode(prompt, add_special_tokens=True)
        completion_ids = self._with_eos(self._encode(completion, add_special_tokens=False))
        return Sample(prompt_ids + completion_ids, [IGNORE_INDEX] * len(prompt_ids) + completion_ids)

    def chat(self, messages: list[dict[str, Any]]) -> Sample:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template, so chat data cannot be tokenised")
        if self.use_assistant_mask:
            return self._chat_with_assistant_mask(messages)
        return self._chat_by_prefixes(messages)

    def _chat_with_assistant_mask(self, messages: list[dict[str, Any]]) -> Sample:
        encoded = self.tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(encoded["input_ids"])
        mask = list(encoded["assistant_masks"])
        labels = [tok if keep else IGNORE_INDEX for tok, keep in zip(ids, mask, strict=True)]
        return Sample(ids, labels)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert isinstance(text, str)
        return text

    def _chat_by_prefixes(self, messages: list[dict[str, Any]]) -> Sample:
        """For templates without generation tags: render growing prefixes of the conversation.

        Each piece of text the template adds is tokenised on its own; the piece between the
        assistant header (`add_generation_prompt=True`) and the end of an assistant message is the
        assistant's, and carries labels. This needs a template whose rendering of a prefix is a
        prefix of the whole rendering, which is true of ordinary templates.
        """
        ids: list[int] = []
        labels: list[int] = []
        rendered = ""

        def append(text: str, trained: bool) -> None:
            nonlocal rendered
            if not text.startswith(rendered):
                raise ValueError(
                    "the chat template renders a conversation prefix differently from the whole "
                    "conversation, so assistant tokens cannot be located; use a template with "
                    "{% generation %} tags"
                )
            piece = self._encode(text[len(rendered) :], add_special_tokens=False)
            ids.extend(piece)
            labels.extend(piece if trained else [IGNORE_INDEX] * len(piece))
            rendered = text

        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                if i > 0:
                    append(self._render(messages[:i], add_generation_prompt=True), trained=False)
                append(self._render(messages[: i + 1], add_generation_prompt=False), trained=True)
            else:
                append(self._render(messages[: i + 1], add_generation_prompt=False), trained=False)
        return Sample(ids, labels)


def truncate(sample: Sample, max_length: int) -> Sample:
    return Sample(sample.input_ids[:max_length], sample.labels[:max_length])


def pack(samples: Iterable[Sample], max_length: int) -> list[Sample]:
    """Concatenate samples into blocks of `max_length` tokens (the last block may be shorter).

    Samples are laid end to end and the stream is cut every `max_length` tokens, so a long
    sample continues in the next block instead of being truncated. The first token of every
    sample gets no label: predicting it from the end of the previous, unrelated sample would teach
    noise (and in an unpacked batch that position is never trained either). Attention is plain
    causal over the whole block: a sample can attend to the earlier samples in its block, the
    usual trade-off of packing without per-document masks. Blocks with no labels are dropped.
    """
    blocks: list[Sample] = []
    ids: list[int] = []
    labels: list[int] = []
    for sample in samples:
        if not sample.input_ids:
            continue
        ids.extend(sample.input_ids)
        labels.append(IGNORE_INDEX)
        labels.extend(sample.labels[1:])
        while len(ids) >= max_length:
            blocks.append(Sample(ids[:max_length], labels[:max_length]))
            ids, labels = ids[max_length:], labels[max_length:]
    if ids:
        blocks.append(Sample(ids, labels))
    return [block for block in blocks if block.has_labels()]


def flatten(samples: Sequence[Sample]) -> tuple[list[int], list[int], list[int]]:
    """Flat `input_ids`, flat `labels` and the `offsets` (len n+1) that split them into samples."""
    offsets = [0]
    flat_ids: list[int] = []
    flat_labels: list[int] = []
    for sample in samples:
        flat_ids.extend(sample.input_ids)
        flat_labels.extend(sample.labels)
        offsets.append(len(flat_ids))
    return flat_ids, flat_labels, offsets
