"""Local paths a spec names (models, tokenizers, datasets): where they may lie.

A path must really lie (symlinks and `..` resolved) inside one of the allowed roots and outside
the service's own storage: the data dir is an allowed root by default, and it also holds every
project's jobs and uploads and the service's secrets, which a path must never reach (an upload
goes by its file id, a fine-tuned model by its name; `jobcore.trained_base`).

The server checks a path when the job is created (`server.jobs.references`). The worker checks
it again when it launches the job or exports from it, and hands the runner the resolved path
(`pin_local_path`): a path that was fine at submit may be a symlink into another project's
storage by launch time, and the runner must read what was checked, not follow the link again.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobcore.settings import Settings

# How a spec value says it is a local path (anything else is a file id, a hub id or a name).
PATH_PREFIXES = ("/", ".", "~")


class PathRefused(ValueError):
    """The path may not be read; the message says why, without naming the field."""


def in_service_storage(real: Path, settings: Settings) -> bool:
    """Whether a resolved path is the service's own (`Settings.service_dirs`, `service_files`)."""
    for owned in settings.service_dirs:
        root = Path(os.path.realpath(owned))
        if real == root or real.is_relative_to(root):
            return True
    owned_files = [Path(os.path.realpath(path)) for path in settings.service_files]
    # SQLite's side files (-wal, -shm, -journal) start with their database's name.
    return any(real.parent == path.parent and real.name.startswith(path.name) for path in owned_files)


def resolve_local_path(value: str, settings: Settings, *, check_roots: bool = True) -> Path:
    """The real path `value` names, or PathRefused: not absolute, outside the allowed roots
    (unless `check_roots` is False), in the service's storage, or not there."""
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # `~name/...` of a user this machine does not have
        raise PathRefused(f"'{value}' names no home directory here") from None
    if not path.is_absolute():
        raise PathRefused(f"a local path must be absolute, got '{value}'")
    real = Path(os.path.realpath(path))
    if check_roots:
        roots = [Path(os.path.realpath(root)) for root in settings.allowed_root_paths]
        if not any(real == root or real.is_relative_to(root) for root in roots):
            listed = ", ".join(str(root) for root in settings.allowed_root_paths)
            where = f"{listed}; TWINKLE_ALLOWED_ROOTS"
            raise PathRefused(f"'{value}' is outside the allowed data roots ({where})")
    if in_service_storage(real, settings):
        raise PathRefused(
            f"'{value}' is in the service's own storage (jobs, uploads, its database and secrets), "
            "which no spec reads by path: an upload goes by its file id, a fine-tuned model by its "
            "name (ft:... or JOB_ID:ckpt-STEP)"
        )
    if not real.exists():
        raise PathRefused(f"'{value}' does not exist")
    return real


def pin_local_path(value: str | None, settings: Settings) -> str | None:
    """At launch or export: a local path checked again and resolved, so the runner reads what was
    checked; any other value (a file id, a hub id, a model name, None) as it is.

    The allowed roots are checked where this process was given them (TWINKLE_ALLOWED_ROOTS); a
    worker left on the default (its data dir) trusts the server's check at submit for them, and
    still refuses its own storage."""
    if value is None or not value.startswith(PATH_PREFIXES):
        return value
    return str(resolve_local_path(value, settings, check_roots=settings.allowed_roots is not None))
