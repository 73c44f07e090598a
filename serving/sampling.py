"""What a request asks of the generation, and the text each choice has produced so far.

`SamplingParams` is the engine-neutral form of OpenAI's knobs. `SeededSampler` draws the next
token (temperature, top_p) from a `torch.Generator` of the request's own, so that the same seed
gives the same text whatever else the host runs at the same time (the global RNG is shared by
every concurrent generation). `ChoiceText` turns a choice's tokens into the text to send, cutting
at a stop sequence and holding back what might become one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says


@dataclass(frozen=True)
class Delta:
    """New text of one choice; the last delta of a choice has its finish_reason and token count."""

    index: int
    text: str
    finish_reason: str | None = None  # "stop" | "length" on a choice's last delta
    completion_tokens: int = 0


class SeededSampler:
    """A transformers logits processor that samples the next token itself and leaves only it
    possible, so that `generate` in greedy mode picks it. Same distribution as transformers'
    sampling (temperature, then nucleus), but drawn from `generator`."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator) -> None:
        assert temperature > 0, "temperature 0 is greedy decoding: no sampler"
        self.temperature = temperature
        self.top_p = top_p
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = logits.sort(dim=-1, descending=True)
            probs = ordered.softmax(dim=-1)
            # Drop a token when the ones before it already hold top_p of the mass (the first stays).
            drop = probs.cumsum(dim=-1) - probs > self.top_p
            logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        chosen = torch.multinomial(logits.softmax(dim=-1), 1, generator=self.generator)
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(-1, chosen, 0.0)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


MAX_UTF8_BYTES = 4  # the longest character in UTF-8, so the most byte tokens one can take


@dataclass
class ChoiceText:
    """One choice's tokens and their text, decoded incrementally: each new token is decoded with
    the tokens of the previous step as context (the leading-space rules of SentencePiece-like
    decoders need them) and only the new characters are appended, so a long answer costs linear
    time, not a full decode per token."""

    tokenizer: Any
    stop: tuple[str, ...]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # the decoded text so far (whole characters)
    sent: int = 0  # characters of `text` already sent
    _context: int = 0  # ids[_context:_decoded] is the context of the next decode
    _decoded: int = 0  # ids before this are in `text`

    def add(self, token_id: int) -> tuple[str, bool]:
        """Take one token; return the text that can be sent now and whether a stop sequence ended
        the choice (the stop sequence itself is never sent, as with OpenAI)."""
        self.ids.append(token_id)
        if not self._decode(final=False):
            # The token ends inside a multi-byte character: wait for the rest of it.
            return "", False
        text = self.text
        for stop in self.stop:
            # Text that could begin a stop was held back, so a stop starts at `sent` or later.
            found = text.find(stop, self.sent)
            if found >= 0:
                return self._send(text, found), True
        return self._send(text, len(text) - self._held_back(text)), False

    def flush(self) -> str:
        """The text held back (a partial stop sequence or character that never completed), at
        the choice's end."""
        self._decode(final=True)
        return self._send(self.text, None)

    def _decode(self, *, final: bool) -> bool:
        """Append the text of the tokens not decoded yet; False while they end mid-character."""
        context = self._string(self.ids[self._context : self._decoded])
        extended = self._string(self.ids[self._context :])
        # A UTF-8 character has at most 4 bytes, so at most 4 byte tokens: past that the bytes
        # will never complete one (an untrained or sampled model makes invalid runs), and waiting
        # longer would hold back the whole rest of the answer and re-decode a growing tail.
        pending = len(self.ids) - self._decoded
        ends_mid_character = extended.endswith("\ufffd") or len(extended) < len(context)
        if not final and ends_mid_character and pending < MAX_UTF8_BYTES:
            return False
        self.text += extended[len(context) :]
        self._context, self._decoded = self._decoded, len(self.ids)
        return True

    def _string(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def _held_back(self, text: str) -> int:
        """Length of the longest end of `text` (after what was sent) that begins a stop sequence."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text) - self.sent), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        chunk = text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return chunk
