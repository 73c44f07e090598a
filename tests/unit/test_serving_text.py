"""How the serving host turns a choice's tokens into text (stop sequences cut and held back,
multi-byte characters waited for) and draws tokens (the request's seed, top_p)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from serving.sampling import ChoiceText, SeededSampler, make_generator


class CharTokenizer:
    """One token per character (id = code point); 0 is half of a multi-byte character."""

    def decode(self, ids: list[int], **_: object) -> str:
        return "".join("\ufffd" if i == 0 else chr(i) for i in ids)


def feed(text: ChoiceText, chars: str) -> tuple[str, bool]:
    sent = ""
    for char in chars:
        chunk, stopped = text.add(ord(char))
        sent += chunk
        if stopped:
            return sent, True
    return sent, False


def test_text_is_sent_as_it_comes_without_stops() -> None:
    text = ChoiceText(CharTokenizer(), ())
    assert [text.add(ord(c)) for c in "ab"] == [("a", False), ("b", False)]
    assert text.flush() == ""


def test_a_stop_sequence_ends_the_choice_and_is_never_sent() -> None:
    text = ChoiceText(CharTokenizer(), ("END",))
    sent, stopped = feed(text, "one EN two END three")
    assert stopped and sent == "one EN two "


def test_what_might_begin_a_stop_is_held_back_until_it_cannot() -> None:
    text = ChoiceText(CharTokenizer(), ("xyz",))
    assert feed(text, "ax") == ("a", False)  # "x" might begin "xyz"
    assert text.add(ord("y")) == ("", False)
    assert text.add(ord("!")) == ("xy!", False)  # it did not: sent after all
    assert feed(text, "xy") == ("", False)
    assert text.flush() == "xy"  # the choice ended (length, EOS) on a partial stop: it is text


def test_the_earliest_stop_of_several_wins() -> None:
    text = ChoiceText(CharTokenizer(), ("cd", "b"))
    assert feed(text, "abcd") == ("a", True)


def test_half_a_character_waits_for_the_rest() -> None:
    text = ChoiceText(CharTokenizer(), ())
    assert text.add(0) == ("", False)  # decodes to U+FFFD for now


def test_bytes_that_never_complete_a_character_are_sent_after_four_tokens() -> None:
    text = ChoiceText(CharTokenizer(), ())
    assert [text.add(0) for _ in range(3)] == [("", False)] * 3  # could still be one character
    assert text.add(0) == ("\ufffd" * 4, False)  # four bytes and no character: send them as is
    assert text.add(ord("a")) == ("a", False)  # and the text after streams again at once
    assert text.flush() == ""


def _draws(seed: int, top_p: float = 1.0, steps: int = 20) -> list[int]:
    sampler = SeededSampler(1.0, top_p, make_generator(seed, torch.device("cpu")))
    scores = torch.log_softmax(torch.linspace(0, 3, 50).repeat(2, 1), dim=-1)
    picked = []
    for _ in range(steps):
        out = sampler(torch.zeros(2, 1, dtype=torch.long), scores)
        # Exactly one token left possible per row: greedy decoding then takes it.
        assert (torch.isfinite(out).sum(dim=-1) == 1).all()
        picked += out.argmax(dim=-1).tolist()
    return picked


def test_the_same_seed_draws_the_same_tokens_and_top_p_narrows_the_draw() -> None:
    assert _draws(5) == _draws(5)
    assert _draws(5) != _draws(6)
    assert len(set(_draws(5))) > 5
    # The last token holds ~6% of the mass here: top_p=0.05 leaves it alone.
    assert set(_draws(5, top_p=0.05)) == {49}


def test_incremental_text_is_the_full_decode_with_a_real_byte_level_tokenizer(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rng = random.Random(0)
    # Random tokens split multi-byte characters anywhere (and make invalid ones): the text sent
    # bit by bit must still be the whole decode, character for character.
    for _ in range(50):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        text = ChoiceText(tokenizer, ())
        sent = "".join(text.add(i)[0] for i in ids) + text.flush()
        assert sent == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
