"""The `twinkle` key of a request: which checkpoint to serve, checked before anything is read.

The API server resolves a public model name to a checkpoint directory and, for a LoRA job, the
base model; the host still checks both itself, since a path is what it will load: the checkpoint
must be a complete one under the host's jobs root (symlinks resolved), and a base given as a
local directory must lie under an allowed root and outside the service's own folders (the jobs
root among them: a base is a model a user named, never a job's weights). What is a path follows
from the spelling alone, as on the server (`jobcore.local_paths.PATH_PREFIXES`): a hub id
(`org/name`, `hf://org/name`) is a name, fetched into the hub cache by the loader.

A checkpoint kept only in object storage comes as its `s3://` location with its job id: it is
served from a local copy in the job's directory under the jobs root, fetched as part of the load
(`serving.fetch`), so its completeness is checked there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobcore.local_paths import PATH_PREFIXES
from jobcore.storage import is_remote
from serving.errors import Forbidden, InvalidValue, NotFound
from twinkle_core import checkpoint as ckpt


class TwinkleKey(BaseModel):
    """What the API server adds to an OpenAI request body for the host."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(
        min_length=1,
        description="The checkpoint directory, absolute; or its s3:// location when it is kept only in "
        "object storage (then fetched into <jobs root>/<job_id>/checkpoints/ before it loads)",
    )
    job_id: str | None = Field(default=None, description="The checkpoint's job: with an s3:// checkpoint")
    base_model: str | None = Field(
        default=None, description="A LoRA checkpoint's base: a directory or hub id"
    )
    model: str = Field(min_length=1, description="The public model name, echoed in answers")
    # How the job built the base (its spec's model section), so that the adapter is merged into
    # the model it was trained on: the class, the config overrides, the from_pretrained kwargs.
    base_model_cls: str | None = Field(default=None, description="The job's model.model_cls")
    base_config: dict[str, Any] | None = Field(default=None, description="The job's model.config")
    base_kwargs: dict[str, Any] | None = Field(default=None, description="The job's model.kwargs")


@dataclass(frozen=True)
class Target:
    key: str  # the checkpoint as the server named it: what heartbeats report as loaded
    checkpoint: Path  # resolved; for a stored one, where its local copy is (or will be)
    base_model: str | None
    model: str
    base_model_cls: str | None = None
    base_config: dict[str, Any] | None = field(default=None, hash=False)
    base_kwargs: dict[str, Any] | None = field(default=None, hash=False)
    source: str | None = None  # the s3:// location of a checkpoint kept in object storage


def _is_local_path(name: str) -> bool:
    return name.startswith(PATH_PREFIXES)


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root.resolve()) for root in roots)


# A job id or a step folder as a path component: no separators, no `..`.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _stored_copy(key: TwinkleKey, jobs_root: Path) -> Path:
    """Where a checkpoint of object storage is copied to on this host: the job dir's
    `checkpoints/step-N`, as a resuming worker puts it (`jobcore.storage.local_copy`)."""
    step = key.checkpoint.rstrip("/").rsplit("/", 1)[-1]
    if key.job_id is None or not _NAME.fullmatch(key.job_id) or not _NAME.fullmatch(step) or ".." in step:
        raise InvalidValue(
            "an s3:// twinkle.checkpoint needs twinkle.job_id and must end in the checkpoint's folder",
            param="twinkle.job_id",
        )
    return jobs_root.resolve() / key.job_id / ckpt.CHECKPOINTS_DIR / step


def check_target(
    key: TwinkleKey, jobs_root: Path, allowed_roots: Sequence[Path], owned_dirs: Sequence[Path] = ()
) -> Target:
    """The target `key` names, checked; `owned_dirs` are the service's own folders besides the
    jobs root (`Settings.service_dirs`), where no base may lie."""
    source = key.checkpoint if is_remote(key.checkpoint) else None
    raw = _stored_copy(key, jobs_root) if source is not None else Path(key.checkpoint)
    if not raw.is_absolute():
        raise InvalidValue("twinkle.checkpoint must be an absolute path", param="twinkle.checkpoint")
    checkpoint = raw.resolve()
    if not _under(checkpoint, [jobs_root]):
        raise Forbidden(
            f"checkpoint {key.checkpoint} is outside this host's jobs root {jobs_root}",
            param="twinkle.checkpoint",
        )
    if source is None and not ckpt.is_complete(checkpoint):
        raise NotFound(f"{key.checkpoint} is not a complete checkpoint", param="twinkle.checkpoint")
    base = key.base_model
    if base is not None and _is_local_path(base):
        try:
            base_dir = Path(base).expanduser().resolve()
        except RuntimeError:  # `~name/...` of a user this machine does not have
            raise InvalidValue(
                f"base model {base} names no home directory here", param="twinkle.base_model"
            ) from None
        # A base is a model a user named under an allowed root, never a job's weights or a merged
        # copy of them (a LoRA on a fine-tuned model is refused at submit): a link that leads
        # into the service's folders since would put another job's weights under this adapter.
        if _under(base_dir, [jobs_root, *owned_dirs]) or not _under(base_dir, allowed_roots):
            raise Forbidden(
                f"base model {base} is outside the allowed roots or in the service's own storage",
                param="twinkle.base_model",
            )
        if not base_dir.is_dir():
            raise NotFound(
                f"base model {base} is not a directory", param="twinkle.base_model", code="not_found"
            )
        base = str(base_dir)
    return Target(
        key=key.checkpoint,
        checkpoint=checkpoint,
        base_model=base,
        model=key.model,
        base_model_cls=key.base_model_cls,
        base_config=key.base_config,
        base_kwargs=key.base_kwargs,
        source=source,
    )
