"""An answer's first token from a forward pass of the host's own; `generate` goes on from its KV
cache for the rest.

`generate` spends ~0.8 ms before its first forward pass (it merges and validates the generation
config, inspects the model's signature, builds its processors and its cache), all of it on the
way to the first token. Here the prompt goes through the model at once, keeping only the last
position's logits, as generate's own first step does; the request's processors (the seeded
sampler) and the stopping criterion see that token as generate would show it to them, and
`generate` then decodes the rest from the cache that pass filled, so the answer is token for
token what `generate` alone gives (greedy or seeded).

That holds while generate would change nothing else at the first step. A model's generation
config can ask it to (a repetition penalty, a minimum length, forced or suppressed tokens, ...);
such a model, or one whose forward pass cannot keep only the last logits, has `generate` take
every step, as before. `FirstStep.of(model)` decides once per loaded model.

Measured with `bench/bench_serving_compare.py` (150 paired requests against the host before this
change, 19M Llama, 32-token prompt, two runs): -0.79 and -0.86 ms to the first token of ~21 ms,
95% CIs -1.19 to -0.32 and -1.20 to -0.42 ms.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# The generation-config fields whose value makes `generate` process the scores of the first step
# (its logits processors for a decoder-only model with greedy decoding, which is how the host
# calls it: sampling is the request's own processor), each with its value that does nothing.
_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "repetition_penalty": lambda v: v is None or v == 1.0,
    "no_repeat_ngram_size": lambda v: not v,
    "bad_words_ids": lambda v: v is None,
    "sequence_bias": lambda v: v is None,
    "min_length": lambda v: not v,
    "min_new_tokens": lambda v: not v,
    "forced_bos_token_id": lambda v: v is None,
    "forced_eos_token_id": lambda v: v is None,
    "suppress_tokens": lambda v: v is None,
    "begin_suppress_tokens": lambda v: v is None,
    "exponential_decay_length_penalty": lambda v: v is None,
    "remove_invalid_values": lambda v: not v,
    "renormalize_logits": lambda v: not v,
    "guidance_scale": lambda v: v is None or v == 1,
    "watermarking_config": lambda v: v is None,
}


def changes_first_step(generation_config: Any) -> list[str]:
    """The fields of a model's generation config that would make `generate` process the first
    step's scores (empty: it would take the raw logits' token, as the host's own pass does)."""
    return [name for name, neutral in _NEUTRAL.items() if not neutral(getattr(generation_config, name, None))]


def cache_argument(model: Any) -> str | None:
    """The name under which the model's forward pass (and so `generate`) takes and returns its KV
    cache: `cache` in recent transformers 5 releases, `past_key_values` in earlier ones. None
    when the forward pass cannot keep only the last position's logits (the prompt's other
    positions' logits are never used) or takes no cache."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    if "logits_to_keep" not in parameters:
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


@dataclass(frozen=True)
class FirstStep:
    """Whether the host takes a model's first step itself (and the name of the cache argument
    it hands to `generate`), and if not, why."""

    cache_argument: str | None
    reason: str = ""

    @property
    def own(self) -> bool:
        return self.cache_argument is not None

    @classmethod
    def of(cls, model: Any) -> FirstStep:
        if getattr(model.config, "is_encoder_decoder", False):
            return cls(None, "an encoder-decoder model")
        argument = cache_argument(model)
        if argument is None:
            return cls(None, "its forward pass takes no logits_to_keep or no cache")
        config = getattr(model, "generation_config", None)
        fields = changes_first_step(config)
        if fields:
            return cls(None, f"its generation config sets {', '.join(fields)}")
        cache_implementation = getattr(config, "cache_implementation", None)
        if cache_implementation is not None:
            # generate would build that cache itself, and refuses one given to it as well.
            return cls(None, f"its generation config sets cache_implementation={cache_implementation}")
        return cls(argument)


NO_FIRST_STEP = FirstStep(None, "not known")


@dataclass
class Prefilled:
    """The prompt with its first new token appended, the scores that chose it, and the cache
    holding the prompt's keys and values as `generate`'s keyword argument for the rest (empty
    when the model returned none: generate then reads the prompt again)."""

    input_ids: torch.Tensor
    scores: torch.Tensor
    cache: dict[str, Any]


def prefill(
    model: Any, step: FirstStep, input_ids: torch.Tensor, processors: Callable[..., torch.Tensor]
) -> Prefilled:
    """The first token of each row: one forward pass over the prompt, the processors over the
    last position's scores (float32 on the inputs' device, as generate gives them), then the best
    token, which is greedy decoding's choice or the one the seeded sampler left possible."""
    assert step.cache_argument is not None, "a model whose first step generate takes"
    output = model(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        use_cache=True,  # the model makes the cache it would make under generate
        logits_to_keep=1,
    )
    last = output.logits[:, -1, :].to(dtype=torch.float32, device=input_ids.device)
    scores = processors(input_ids, last)
    chosen = scores.argmax(dim=-1)
    cache = output.get(step.cache_argument)  # a ModelOutput: a dict of what the model returned
    given = {} if cache is None else {step.cache_argument: cache}
    return Prefilled(torch.cat([input_ids, chosen[:, None]], dim=-1), scores, given)
