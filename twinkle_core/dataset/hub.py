"""Hugging Face hub datasets as training data: `hf://datasets/org/name`, one split, renamed columns.

A dataset repository is fetched once per worker into `$TWINKLE_HUB_CACHE/datasets/org--name`
(default `~/.cache/twinkle/hub`; a marker file says the download finished) and reused from there,
as `twinkle_core.hub` does for models; `HF_HUB_OFFLINE=1` uses only what is there. The split is
read from that directory with `datasets.load_dataset` (parquet, JSON Lines, CSV, ... in the hub's
own layout, e.g. `data/train-00000-of-00001.parquet`; `load_dataset`'s own cache goes to
`$TWINKLE_CACHE_DIR/hf-datasets` when that is set, else the `datasets` default). Tests replace
`download_dataset`.

`columns` maps our record fields (`messages`, `prompt`, `completion`, `text`) to the dataset's
column names; only the mapped columns are kept. Without it the dataset's columns must already be
named like ours.

Parsing is standard library only: the API server imports this module to check a spec's spelling.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HUB_DATASET_PREFIX = "hf://datasets/"
REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_HUB_DATASET = re.compile(rf"^hf://datasets/({REPO_PART}/{REPO_PART})$")
RECORD_FIELDS = ("messages", "prompt", "completion", "text")
COMPLETE_MARKER = ".twinkle-download-complete"
SPLIT = re.compile(r"^[A-Za-z0-9_.-]{1,64}(\[[0-9A-Za-z:%.+-]{0,32}\])?$")


def is_hub_dataset(value: str) -> bool:
    """Whether `value` is spelled as a hub dataset (well-formed or not)."""
    return value.startswith(HUB_DATASET_PREFIX)


def parse_dataset_id(value: str) -> str:
    """`hf://datasets/org/name` -> `org/name`; ValueError for anything else."""
    match = _HUB_DATASET.match(value)
    if match is None:
        raise ValueError(f"'{value}' is not a hub dataset id: expected hf://datasets/org/name")
    return match.group(1)


def dataset_cache_dir(repo_id: str) -> Path:
    from twinkle_core.hub import hub_cache_dir

    return hub_cache_dir() / "datasets" / repo_id.replace("/", "--")


def resolve_dataset(dataset_id: str) -> Path:
    """The local directory holding the dataset repository: the cached copy, or a fresh download."""
    repo_id = parse_dataset_id(dataset_id)
    target = dataset_cache_dir(repo_id)
    if (target / COMPLETE_MARKER).exists():
        return target
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"{dataset_id} is not in the dataset cache ({target}) and HF_HUB_OFFLINE is set")
    target.mkdir(parents=True, exist_ok=True)
    download_dataset(repo_id, target)
    (target / COMPLETE_MARKER).write_text(repo_id)  # an interrupted download is fetched again
    return target


def download_dataset(repo_id: str, local_dir: Path) -> None:
    """Fetch every file of the dataset repository `repo_id` into `local_dir`."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=repo_id, repo_type="dataset", local_dir=str(local_dir))


def load_hub_dataset(
    dataset_id: str, split: str, columns: Mapping[Any, str] | None = None, *, field: str = "data.train_file"
) -> Any:
    """The `split` of hub dataset `dataset_id` as a `datasets.Dataset` with our field names.

    Every problem the submitter can fix (no such split, a mapped column the dataset lacks) is a
    ValueError naming `field` or the `data.columns` entry.
    """
    import datasets

    from twinkle_core.dataset import cache

    cache_root = os.environ.get("TWINKLE_CACHE_DIR")
    cache_dir = str(Path(cache_root) / "hf-datasets") if cache_root else None
    target = dataset_cache_dir(parse_dataset_id(dataset_id))
    target.parent.mkdir(parents=True, exist_ok=True)
    # Ranks of one node (and jobs sharing the worker) download and prepare it once, one at a time.
    with cache.exclusive_lock(target.parent / f"{target.name}.lock"):
        local = resolve_dataset(dataset_id)
        try:
            data = datasets.load_dataset(str(local), split=split, cache_dir=cache_dir)
        except ValueError as exc:  # an unknown split names the ones there are
            raise ValueError(f"{field}: {dataset_id}, split '{split}': {exc}") from exc
        except FileNotFoundError as exc:
            raise ValueError(f"{field}: {dataset_id} holds no data files datasets can read: {exc}") from exc
    if columns:
        present = list(data.column_names)
        for ours, theirs in columns.items():
            if theirs not in present:
                raise ValueError(
                    f"data.columns.{ours}: the column '{theirs}' is not in {dataset_id} "
                    f"(columns: {', '.join(present)})"
                )
        data = data.select_columns(list(columns.values())).rename_columns(
            {theirs: ours for ours, theirs in columns.items() if theirs != ours}
        )
    return data
