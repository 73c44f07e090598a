"""`Dataset`: a data file (or in-memory rows) tokenised once, cached, and served as token lists."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from twinkle_core.dataset import cache
from twinkle_core.dataset.formats import (
    DataFormat,
    DatasetFormatError,
    check_data_format,
    file_format_of,
    location_unit,
    read_records,
    validated_records,
)
from twinkle_core.dataset.tokenize import RecordTokenizer, Sample, flatten, pack, truncate

logger = logging.getLogger(__name__)

IN_MEMORY_SOURCE = "<in-memory dataset>"


class Dataset(torch.utils.data.Dataset):
    """Tokenised training data; item `i` is `{'input_ids': list[int], 'labels': list[int]}`.

    Args:
        source: a data file (.jsonl, .json, .csv, .parquet) or an in-memory dataset: anything with
            `__len__` that iterates dict rows (a Hugging Face `datasets.Dataset` works).
        tokenizer: a Hugging Face tokenizer (chat data needs its chat template).
        data_format: 'chat', 'prompt_completion', 'text' or 'auto' (the format of the first record).
        max_length: samples are truncated to this many tokens (with packing: the block length).
        packing: concatenate samples into `max_length` blocks (see `tokenize.pack` for how labels
            and attention behave).
        cache_dir: where tokenised data is cached; default `$TWINKLE_CACHE_DIR` or
            `~/.cache/twinkle/datasets`.

    A malformed record raises `DatasetFormatError` naming the file and its line (or row) before
    any tokens are cached. Samples left with no trained token after truncation (a prompt longer
    than `max_length`) are dropped with a warning; `num_dropped` counts them.
    """

    def __init__(
        self,
        source: str | Path | Any,
        tokenizer: Any,
        data_format: str = "auto",
        max_length: int = 1024,
        packing: bool = False,
        cache_dir: str | Path | None = None,
    ) -> None:
        check_data_format(data_format)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.packing = packing
        self.source_name, source_hash = self._open_source(source)
        self._source: Any = source
        self._requested_format = data_format

        key = cache.cache_key(
            source_hash, cache.tokenizer_fingerprint(tokenizer), data_format, max_length, packing
        )
        directory = Path(cache_dir) if cache_dir is not None else cache.default_cache_dir()
        self.cache_path = directory / f"{key}.npz"
        arrays, self.loaded_from_cache = self._load_or_build(directory, key)

        self._input_ids = arrays["input_ids"]
        self._labels = arrays["labels"]
        self._offsets = arrays["offsets"]
        meta = json.loads(str(arrays["meta"]))
        self.data_format: DataFormat = meta["data_format"]
        self.num_records: int = meta["records"]
        self.num_dropped: int = meta["dropped"]

    # --- construction ------------------------------------------------------------------------

    def _open_source(self, source: Any) -> tuple[str, str]:
        if isinstance(source, str | Path):
            path = Path(source)
            file_format_of(path)  # an unknown extension fails before hashing
            if not path.is_file():
                raise ValueError(f"source: data file not found: {path}")
            return str(path), cache.file_sha256(path)
        if not hasattr(source, "__len__") or not hasattr(source, "__iter__"):
            raise ValueError(
                "source must be a data file path or a dataset object with __len__ that iterates dict "
                f"rows, got {type(source).__name__}"
            )
        return IN_MEMORY_SOURCE, cache.rows_sha256(source)

    @property
    def _unit(self) -> str:
        """How a record's location is named in errors: rows of tables and in-memory data, else lines."""
        if self.source_name == IN_MEMORY_SOURCE:
            return "row"
        return location_unit(file_format_of(self.source_name))

    def _records(self) -> Iterator[tuple[int, DataFormat, dict[str, Any]]]:
        rows: Iterator[tuple[int, Any]]
        if self.source_name == IN_MEMORY_SOURCE:
            rows = enumerate(self._source, start=1)
        else:
            rows = read_records(self.source_name)
        return validated_records(rows, self.source_name, self._requested_format, unit=self._unit)

    def _load_or_build(self, directory: Path, key: str) -> tuple[dict[str, np.ndarray], bool]:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.warning("dataset cache disabled: cannot create %s (%s)", directory, exc)
            return self._build(), False
        cached = cache.load_arrays(self.cache_path)
        if cached is not None:
            return cached, True
        # Other ranks (or a concurrent job on the same data) wait here while one tokenises.
        with cache.exclusive_lock(directory / f"{key}.lock"):
            cached = cache.load_arrays(self.cache_path)
            if cached is not None:
                return cached, True
            arrays = self._build()
            cache.save_arrays(self.cache_path, arrays)
            return arrays, False

    def _build(self) -> dict[str, np.ndarray]:
        record_tokenizer = RecordTokenizer(self.tokenizer)
        samples: list[Sample] = []
        resolved: DataFormat = "text"
        records = 0
        for location, data_format, record in self._records():
            resolved = data_format
            records += 1
            try:
                sample = record_tokenizer(record, data_format)
            except Exception as exc:
                # A template that rejects the conversation (e.g. roles out of order) is bad data.
                raise DatasetFormatError(
                    self.source_name, location, f"cannot tokenise: {exc}", self._unit
                ) from exc
            samples.append(sample)

        if self.packing:
            blocks = pack(samples, self.max_length)
            dropped = 0
        else:
            blocks = [truncate(sample, self.max_length) for sample in samples]
            kept = [block for block in blocks if block.has_labels()]
            dropped = len(blocks) - len(kept)
            blocks = kept
        if dropped:
            logger.warning(
                "%s: dropped %d of %d samples with no trained token within max_length=%d",
                self.source_name,
                dropped,
                records,
                self.max_length,
            )
        if not blocks:
            raise DatasetFormatError(
                self.source_name, None, f"no sample has a trained token within max_length={self.max_length}"
            )
        flat_ids, flat_labels, offsets = flatten(blocks)
        meta = {"data_format": resolved, "records": records, "dropped": dropped}
        return {
            "input_ids": np.asarray(flat_ids, dtype=np.int32),
            "labels": np.asarray(flat_labels, dtype=np.int32),
            "offsets": np.asarray(offsets, dtype=np.int64),
            "meta": np.asarray(json.dumps(meta)),
        }

    # --- access ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        return {
            "input_ids": self._input_ids[start:end].tolist(),
            "labels": self._labels[start:end].tolist(),
        }

    def num_tokens(self) -> int:
        return int(self._offsets[-1])
