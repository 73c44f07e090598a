"""'Did you mean ...?' for an unknown key in a job spec.

A spec refuses keys it does not know (a typo must not be ignored silently), and the refusal is
more useful when it names the key that was meant: a near spelling in the same section
(`training.max_step` -> `training.max_steps`), the section a known key belongs to
(`training.lr` -> `optimizer.lr`), or the spec's name for a setting that users bring from Hugging
Face's `TrainingArguments`, PEFT's `LoraConfig` or LLaMA-Factory's YAML (`learning_rate`,
`num_train_epochs`, `lora_rank`, ...). The API's 422, `clone`'s and `twinkle-jobs jobs validate`
all say it the same way, from here.

And where a check across fields points: pydantic locates such an error where its validator runs
(the spec, or a section), while the message starts with the field it is about; `located_error`
gives that field instead, for the API's `param` and for `jobs validate`.
"""

from __future__ import annotations

import re
import types
from collections.abc import Sequence
from difflib import get_close_matches
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from twinkle_core.spec import JobSpec

# What users of other trainers call a setting, and where it lives in a spec (a key spelled as a
# field of another section needs no entry, and has none: `meant_instead` finds that section).
FAMILIAR_NAMES: dict[str, str] = {
    "learning_rate": "optimizer.lr",
    "adam_epsilon": "optimizer.eps",
    "optim": "optimizer.name",
    "num_train_epochs": "training.num_epochs",
    "epochs": "training.num_epochs",
    "per_device_train_batch_size": "training.batch_size",
    "train_batch_size": "training.batch_size",
    "logging_steps": "training.log_every",
    "save_steps": "training.save_every",
    "eval_steps": "training.eval_every",
    "lr_scheduler_type": "scheduler.name",
    "model_name_or_path": "model.model_id",
    "tokenizer_name_or_path": "model.tokenizer_id",
    "lora": "adapter",  # the section's name in LLaMA-Factory's and ms-swift's talk
    "peft": "adapter",
    "bf16": "model.mixed_precision",
    "fp16": "model.mixed_precision",
    "lora_rank": "adapter.r",
    "lora_r": "adapter.r",
    "lora_target": "adapter.target_modules",
    "cutoff_len": "data.max_length",
    "max_seq_length": "data.max_length",
    "dataset": "data.train_file",
    "eval_dataset": "data.validation_file",
}
_CLOSE_ENOUGH = 0.75  # difflib's ratio: `max_step`/`max_steps` 0.94, `lr`/`r` 0.67


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model class of a section's annotation (`LoraSection | None` -> `LoraSection`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for member in get_args(annotation):
            found = _section_model(member)
            if found is not None:
                return found
    return None


def _model_at(path: Sequence[str]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = JobSpec
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        model = _section_model(field.annotation) if field is not None else None
    return model


def _sections() -> dict[str, type[BaseModel]]:
    found = {}
    for name, field in JobSpec.model_fields.items():
        model = _section_model(field.annotation)
        if model is not None:
            found[name] = model
    return found


def meant_instead(path: Sequence[str | int], root: str = "spec") -> str | None:
    """The spec field (`<root>.section.key`) most likely meant by the unknown key at `path`
    (relative to the spec, e.g. `("training", "max_step")`), or None when nothing is close. `root`
    is what the caller's users call the spec (`twinkle_spec` in the OpenAI layer)."""
    if not path:
        return None
    *where, key = (str(part) for part in path)
    model = _model_at(where)
    if model is None:
        return None
    close = get_close_matches(key, list(model.model_fields), n=1, cutoff=_CLOSE_ENOUGH)
    if close:
        return ".".join([root, *where, close[0]])
    elsewhere = [f"{name}.{key}" for name, section in _sections().items() if key in section.model_fields]
    if len(elsewhere) == 1:
        return f"{root}.{elsewhere[0]}"
    familiar = FAMILIAR_NAMES.get(key.lower())  # never a spec field's own name: no loop back
    return None if familiar is None else f"{root}.{familiar}"


def unknown_field_message(path: Sequence[str | int]) -> str:
    """`unknown field 'spec.training.max_step' (did you mean 'spec.training.max_steps'?)`."""
    message = f"unknown field '{'.'.join(['spec', *(str(p) for p in path)])}'"
    meant = meant_instead(path)
    return f"{message} (did you mean '{meant}'?)" if meant else message


# A dotted field path at the start of a message: `model.device_mesh: ...`, `training.batch_size (8) ...`.
_LEADING_FIELD = re.compile(r"[a-z_]+(?:\.[a-z_]+)+(?=[ :(]|$)")


def located_error(loc: Sequence[str | int], message: str) -> tuple[str, str]:
    """A spec validation error as `(field, message)`, both relative to the spec: the field that
    the message starts with when it lies under `loc` (a check across fields, located at its
    validator's level), else `loc`; the message begins with that field's name."""
    path = ".".join(str(part) for part in loc)
    found = _LEADING_FIELD.match(message)
    if found and (not path or found.group(0).startswith(f"{path}.")):
        return found.group(0), message
    return path, f"{path}: {message}" if path else message
