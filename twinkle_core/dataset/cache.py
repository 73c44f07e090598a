"""A content-addressed cache of tokenised datasets.

The key hashes everything the tokens depend on (the data bytes, the tokenizer's vocabulary,
merges, template and special tokens, the data format, max_length and packing), so a changed
input can never hit a stale entry and an unchanged one is never tokenised twice: not by the
other ranks of the same job, which wait on a file lock while the first rank tokenises, nor by a
retried job. Entries are written to a temporary name and renamed into place, so a reader sees a
whole file or none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# Bump when the tokenisation rules change, so old cache entries stop matching.
CACHE_VERSION = 1


def default_cache_dir() -> Path:
    env = os.environ.get("TWINKLE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "twinkle" / "datasets"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def rows_sha256(rows: Any) -> str:
    """Hash an in-memory dataset: its own fingerprint if it has one (HF `datasets`), else its rows."""
    fingerprint = getattr(rows, "_fingerprint", None)
    if isinstance(fingerprint, str) and fingerprint:
        return hashlib.sha256(f"fingerprint:{fingerprint}".encode()).hexdigest()
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of what decides the token ids: the backend tokenizer (vocab, merges, normaliser,
    post-processor) or else the vocabulary, plus the chat template and the special tokens."""
    digest = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        digest.update(backend.to_str().encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
        digest.update(str(getattr(tokenizer, "name_or_path", "")).encode())
    digest.update(json.dumps(getattr(tokenizer, "chat_template", None), sort_keys=True).encode())
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        digest.update(f"{name}={getattr(tokenizer, name, None)}".encode())
    return digest.hexdigest()


def cache_key(source_hash: str, tokenizer_hash: str, data_format: str, max_length: int, packing: bool) -> str:
    parts = {
        "version": CACHE_VERSION,
        "source": source_hash,
        "tokenizer": tokenizer_hash,
        "format": data_format,
        "max_length": max_length,
        "packing": packing,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `lock_path` (a no-op where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic rename still keeps entries whole
        yield
        return
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` as one .npz under a temporary name, fsync it, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            named: dict[str, Any] = dict(arrays)  # numpy's stubs mistype **kwargs arrays
            np.savez(fh, **named)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None if the entry is missing or unreadable (then it is rebuilt)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, KeyError):
        return None
