"""'Did you mean' for unknown spec keys (twinkle_core/spec_hints.py): a near spelling in the same
section, the section a key belongs to, the spec's name for another trainer's setting, and
nothing where no guess is good. The API's 422 and `jobs validate` carry it (test_api_jobs.py,
test_api_actions.py, tests/integration/test_cli_ci.py)."""

from __future__ import annotations

import pytest

from twinkle_core.spec import JobSpec
from twinkle_core.spec_hints import (
    FAMILIAR_NAMES,
    _model_at,
    _sections,
    meant_instead,
    unknown_field_message,
)


@pytest.mark.parametrize(
    ("path", "meant"),
    [
        (("training", "max_step"), "spec.training.max_steps"),  # a typo in its section
        (("optimiser",), "spec.optimizer"),  # a section's name
        (("training", "lr"), "spec.optimizer.lr"),  # a field of another section
        (("training", "warmup_steps"), "spec.scheduler.warmup_steps"),
        (("learning_rate",), "spec.optimizer.lr"),  # Trainer's name, at the top
        (("training", "num_train_epochs"), "spec.training.num_epochs"),
        (("adapter", "lora_rank"), "spec.adapter.r"),  # the adapter section is optional
        (("model", "model_name_or_path"), "spec.model.model_id"),
        (("data", "cutoff_len"), "spec.data.max_length"),  # LLaMA-Factory's
        (("lora",), "spec.adapter"),  # a section under another tool's name
        (("training", "bf16"), "spec.model.mixed_precision"),
    ],
)
def test_the_field_that_was_meant(path: tuple[str, ...], meant: str) -> None:
    assert meant_instead(path) == meant


@pytest.mark.parametrize(
    "path",
    [
        ("training", "colour"),  # nothing near
        ("training", "name"),  # a field of two other sections: no guess
        ("no_section", "lr"),  # under a key that is no section
        (),
    ],
)
def test_no_guess_where_none_is_good(path: tuple[str, ...]) -> None:
    assert meant_instead(path) is None


def test_the_guess_is_spelled_under_the_callers_name_for_the_spec() -> None:
    assert meant_instead(("training", "lr"), root="twinkle_spec") == "twinkle_spec.optimizer.lr"


def test_the_message_names_the_key_and_the_guess() -> None:
    assert unknown_field_message(["training", "max_step"]) == (
        "unknown field 'spec.training.max_step' (did you mean 'spec.training.max_steps'?)"
    )
    assert unknown_field_message(["training", "colour"]) == "unknown field 'spec.training.colour'"


def test_every_familiar_name_points_at_a_spec_field() -> None:
    fields = {field for section in _sections().values() for field in section.model_fields}
    fields |= set(JobSpec.model_fields)
    for name, target in FAMILIAR_NAMES.items():
        assert name not in fields, name  # a spec's own field name is found without the table
        *section, field = target.split(".")
        model = _model_at(section)
        assert model is not None and field in model.model_fields, name
