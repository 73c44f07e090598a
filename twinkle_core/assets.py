"""Tiny local assets: a causal LM, a tokenizer and datasets built without any hub access.

Used by the demo, the tests and the benchmarks. The tokenizer is a byte-level BPE trained
in-process on the demo corpus; the model is a Llama of a few hundred thousand parameters built
from a config, so a CPU trains it in seconds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_SUBJECTS = ["the cat", "a robot", "my friend", "the teacher", "our team", "the model", "a bird", "the river"]
_VERBS = ["likes", "builds", "reads", "watches", "follows", "trains", "paints", "finds"]
_OBJECTS = ["small boats", "long books", "green fields", "fast trains", "old maps", "bright stars"]


def demo_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}." for _ in range(n)]


def build_tokenizer(out_dir: str | Path, vocab_size: int = 384) -> Any:
    """Train a byte-level BPE tokenizer on the demo corpus and save it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bar printed empty lines into the demo's output when not on a terminal
    )
    tok.train_from_iterator(demo_sentences(2000) + ["Question: Answer:"] * 10, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
    )
    # Generation marker tags let `apply_chat_template(return_assistant_tokens_mask=True)` find the
    # assistant spans that carry the loss.
    fast.chat_template = (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}<|assistant|>{% generation %}{{ m['content'] }}<|eos|>"
        "{% endgeneration %}"
        "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|eos|>{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_llama_config(vocab_size: int, hidden_size: int = 64, num_layers: int = 2) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def build_tiny_model(out_dir: str | Path, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Save a tiny Llama and its tokenizer into `out_dir`; returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(len(tokenizer), hidden_size, num_layers))
    model.save_pretrained(str(out))
    return out


def write_text_dataset(path: str | Path, n: int = 64, seed: int = 0) -> Path:
    path = Path(path)
    with path.open("w") as fh:
        for sentence in demo_sentences(n, seed):
            fh.write(json.dumps({"text": sentence}) + "\n")
    return path


def write_chat_dataset(path: str | Path, n: int = 64, seed: int = 0) -> Path:
    path = Path(path)
    rng = random.Random(seed)
    with path.open("w") as fh:
        for sentence in demo_sentences(n, seed):
            subject = sentence.split(" ")[0:2]
            messages = [
                {"role": "user", "content": f"Who {rng.choice(_VERBS)} things?"},
                {"role": "assistant", "content": f"{' '.join(subject)} does: {sentence}"},
            ]
            fh.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_prompt_completion_dataset(path: str | Path, n: int = 64, seed: int = 0) -> Path:
    path = Path(path)
    with path.open("w") as fh:
        for sentence in demo_sentences(n, seed):
            words = sentence.split(" ")
            fh.write(
                json.dumps({"prompt": " ".join(words[:2]), "completion": " " + " ".join(words[2:])}) + "\n"
            )
    return path
