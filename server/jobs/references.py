"""Checks on what a spec may point at and pass on to the training process.

A spec names models, tokenizers and datasets. A dataset may be an uploaded file of the caller's
project (`file-...`); uploads are datasets only, so a model or tokenizer may not be one. Any of
them may be an absolute local path that really lies (after resolving symlinks and `..`) inside
one of the configured roots, or a hub id: for data a dataset, `hf://datasets/org/name`, which the
runner loads through `datasets` (a bare `org/name` names a model only). What a value is follows
from its spelling alone, never from what happens to exist in the server's working directory:
`org/name` is a hub id even when such a relative path exists, and a relative path is refused.
A model may also be a fine-tuned model of the project by its name (`ft:...`, `JOB:ckpt-STEP`;
`jobcore.trained_base`), the only way to a checkpoint: no path reaches the service's storage.

`model.kwargs` reaches `from_pretrained`/`from_config` as keyword arguments; many of those
choose what code runs (remote code, hub kernels, unpickling with `weights_only=False`) or where
files are read and written. So only the keys of `MODEL_KWARGS` are accepted, each with its
values checked; model settings belong in `model.config`, whose keys may not name remote code,
quantizers or private attributes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobcore.db.models import File
from jobcore.local_paths import PATH_PREFIXES, PathRefused, resolve_local_path
from jobcore.settings import Settings
from jobcore.trained_base import NotATrainedBase, find_trained_base, is_trained_base_name
from server.errors import InvalidRequest
from twinkle_core.dataset.hub import parse_dataset_id
from twinkle_core.spec import JobSpec
from twinkle_core.trackers import missing_library

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_SCHEMES = ("hf://", "ms://")
CLASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# model.kwargs: the only keys a spec may pass to from_pretrained / from_config, with a check of
# each value. Everything else is refused: it would run other code (trust_remote_code, use_kernels,
# a hub kernel as attn_implementation, weights_only=False), redirect files (cache_dir,
# offload_folder, subfolder="../..", gguf_file), pretend to pin what the worker does not pin
# (revision: hub models are downloaded once, at their default revision), or fight the strategy's
# own placement (device_map, tp_plan, device_mesh).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
DTYPES = ("auto", "float32", "float16", "bfloat16")
VARIANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MODEL_KWARGS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "dtype": (f"one of {', '.join(DTYPES)}", lambda v: v in DTYPES),
    "torch_dtype": (f"one of {', '.join(DTYPES)}", lambda v: v in DTYPES),
    "attn_implementation": (
        f"one of {', '.join(ATTN_IMPLEMENTATIONS)}",
        lambda v: v in ATTN_IMPLEMENTATIONS,
    ),
    "low_cpu_mem_usage": ("true or false", lambda v: isinstance(v, bool)),
    "ignore_mismatched_sizes": ("true or false", lambda v: isinstance(v, bool)),
    "use_safetensors": ("true or false", lambda v: isinstance(v, bool)),
    "use_cache": ("true or false", lambda v: isinstance(v, bool)),
    "variant": ("letters, digits, '_' or '-'", lambda v: isinstance(v, str) and bool(VARIANT.match(v))),
}
# Keys of model.config that would run downloaded code, load a quantizer or move files elsewhere.
FORBIDDEN_CONFIG_KEYS = frozenset(
    {
        "trust_remote_code",
        "auto_map",
        "quantization_config",
        "cache_dir",
        "offload_folder",
        "token",
        "use_auth_token",
        "code_revision",
    }
)


def check_reference(
    value: str,
    param: str,
    session: Session,
    project_id: str,
    settings: Settings,
    *,
    uploads: bool = True,
) -> None:
    """Raise InvalidRequest naming `param` unless `value` is a usable file id, path or hub id.

    `uploads=False` for a model or tokenizer: uploaded files are datasets, never models.
    """
    if not value or any(ord(ch) < 32 for ch in value):
        raise InvalidRequest(f"{param} is empty or contains control characters", param=param)
    if value.startswith("file-") and not uploads:
        raise InvalidRequest(
            f"{param}: '{value}' is an uploaded file id; uploads are datasets (data.train_file, "
            "data.validation_file). Name a model by an absolute path under an allowed root or a hub id",
            param=param,
        )
    if uploads and value.startswith(HUB_SCHEMES):
        # Data from the hub is a dataset repository, read by the runner through `datasets`.
        try:
            parse_dataset_id(value)
        except ValueError:
            raise InvalidRequest(
                f"{param}: '{value}' is not a hub dataset id; a dataset on the Hugging Face hub is "
                "hf://datasets/org/name",
                param=param,
            ) from None
        return
    if value.startswith("file-"):
        found = session.scalar(select(File.id).where(File.id == value, File.project_id == project_id))
        if found is None:
            raise InvalidRequest(f"{param}: no file '{value}' in this project", param=param)
        return
    if value.startswith(HUB_SCHEMES):
        if not HUB_ID.match(value[len("hf://") :]):
            raise InvalidRequest(
                f"{param}: '{value}' is not a valid hub id (expected scheme://org/name)", param=param
            )
        return
    # By its spelling only: whatever exists relative to this process's working directory must
    # not turn a hub id into a path (the worker's runner would not read it from there either).
    looks_like_path = value.startswith(PATH_PREFIXES)
    if HUB_ID.match(value) and not looks_like_path and not uploads:
        return
    if not looks_like_path and uploads:
        raise InvalidRequest(
            f"{param}: '{value}' is neither an uploaded file id (file-...), an absolute path under an "
            "allowed root, nor a hub dataset id (hf://datasets/org/name)",
            param=param,
        )
    if not looks_like_path:
        raise InvalidRequest(
            f"{param}: '{value}' is neither an absolute path under an allowed root nor a hub id "
            "(org/name, hf://org/name, ms://org/name)",
            param=param,
        )
    check_local_path(value, param, settings)


def check_local_path(value: str, param: str, settings: Settings) -> Path:
    try:
        return resolve_local_path(value, settings)
    except PathRefused as exc:
        raise InvalidRequest(f"{param}: {exc}", param=param) from None


def check_trained_base(spec: JobSpec, session: Session, project_id: str, param: str) -> None:
    """A model_id that names a fine-tuned model or checkpoint of this project (jobcore.trained_base)."""
    assert spec.model.model_id is not None
    try:
        find_trained_base(session, project_id, spec.model.model_id)
    except NotATrainedBase as exc:
        raise InvalidRequest(f"{param}: {exc}", param=param) from None
    if spec.adapter is not None:
        raise InvalidRequest(
            f"{param}: a LoRA adapter on a fine-tuned model's weights is not supported yet; "
            "train on from it in full (no `adapter`), or export it and name the folder",
            param=param,
        )


def check_spec(
    spec: JobSpec, session: Session, project_id: str, settings: Settings, prefix: str = "spec"
) -> None:
    """Everything about a spec that needs the database, the filesystem or cross-field policy."""
    model = spec.model
    references: list[tuple[str, str | None, bool]] = [
        ("data.train_file", spec.data.train_file, True),
        ("data.validation_file", spec.data.validation_file, True),
        ("model.model_id", model.model_id, False),
        ("model.tokenizer_id", model.tokenizer_id, False),
    ]
    for field, value, uploads in references:
        if field == "model.model_id" and is_trained_base_name(value):
            check_trained_base(spec, session, project_id, f"{prefix}.{field}")
        elif value is not None:
            check_reference(value, f"{prefix}.{field}", session, project_id, settings, uploads=uploads)
    if not CLASS_NAME.match(model.model_cls):
        raise InvalidRequest(
            f"{prefix}.model.model_cls must be a transformers class name, got '{model.model_cls}'",
            param=f"{prefix}.model.model_cls",
        )
    check_model_kwargs(model.kwargs, f"{prefix}.model.kwargs")
    check_config_keys(model.config or {}, f"{prefix}.model.config")
    check_trackers(spec.training.report_to, f"{prefix}.training.report_to")
    check_one_step_of_data(spec, session, project_id, prefix)


def check_one_step_of_data(spec: JobSpec, session: Session, project_id: str, prefix: str) -> None:
    """An uploaded training file must hold one optimizer step: `batch_size` x
    `gradient_accumulation_steps` rows. Without packing a row makes at most one sample and the
    runner drops an epoch's incomplete batch, so with fewer rows it could not train at all and
    would say so only once a worker had started it. With packing a long row may make several
    blocks, and a path or hub dataset is not counted here: the runner checks those."""
    data, training = spec.data, spec.training
    if data.packing or not data.train_file.startswith("file-"):
        return
    rows = session.scalar(select(File.rows).where(File.id == data.train_file, File.project_id == project_id))
    if rows is None:
        return  # not this project's: check_reference has refused it
    where = f"the {rows} row{'s' if rows != 1 else ''} of {prefix}.data.train_file ({data.train_file})"
    if rows < training.batch_size:
        param = f"{prefix}.training.batch_size"
        raise InvalidRequest(
            f"{param} ({training.batch_size}) is larger than {where}: not one full batch", param=param
        )
    per_step = training.batch_size * training.gradient_accumulation_steps
    if rows < per_step:
        param = f"{prefix}.training.gradient_accumulation_steps"
        raise InvalidRequest(
            f"{param} ({training.gradient_accumulation_steps}) x {prefix}.training.batch_size "
            f"({training.batch_size}) = {per_step} rows per optimizer step, more than {where}",
            param=param,
        )


def check_trackers(names: Sequence[str], param: str) -> None:
    """Each tracker's library must be installed on the server (deployments install the service with
    the same extras everywhere; a worker without it fails the job as a user error at start)."""
    for index, name in enumerate(names):
        problem = missing_library(name)
        if problem is not None:
            raise InvalidRequest(f"{param}[{index}]: {problem}", param=f"{param}[{index}]")


def check_model_kwargs(kwargs: dict[str, Any], param: str) -> None:
    """Only the keys of MODEL_KWARGS, each with an accepted value (see MODEL_KWARGS)."""
    for key, value in kwargs.items():
        rule = MODEL_KWARGS.get(key)
        if rule is None:
            raise InvalidRequest(
                f"{param}.{key} is not allowed in a job spec (allowed: {', '.join(MODEL_KWARGS)}; "
                "model settings go in model.config)",
                param=f"{param}.{key}",
            )
        expected, accepts = rule
        if not accepts(value):
            raise InvalidRequest(f"{param}.{key} must be {expected}, got {value!r}", param=f"{param}.{key}")


def check_config_keys(config: dict[str, Any], param: str) -> None:
    """No key of FORBIDDEN_CONFIG_KEYS nor a private one, and an attention implementation of
    ATTN_IMPLEMENTATIONS only: transformers reads any other as a hub kernel to download and run.
    Nested dicts (a composite model's sub-configs) are held to the same rules."""
    for key, value in config.items():
        where = f"{param}.{key}"
        if key in FORBIDDEN_CONFIG_KEYS or key.startswith("_"):
            raise InvalidRequest(f"{where} is not allowed in a job spec", param=where)
        if key == "attn_implementation" and value is not None and value not in ATTN_IMPLEMENTATIONS:
            expected = ", ".join(ATTN_IMPLEMENTATIONS)
            raise InvalidRequest(f"{where} must be one of {expected}, got {value!r}", param=where)
        if isinstance(value, dict):
            check_config_keys(value, where)
