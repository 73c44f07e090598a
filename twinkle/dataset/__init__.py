"""Training data (see twinkle_core.dataset), as `twinkle.dataset`.

`Dataset` needs torch and is resolved on first use, as in twinkle_core.dataset; the format helpers
are light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import twinkle_core.dataset
from twinkle_core.dataset import (
    DatasetFormatError,
    FileReport,
    detect_format,
    read_records,
    validate_file,
    validate_record,
)

if TYPE_CHECKING:
    from twinkle_core.dataset import Dataset

__all__ = [
    "Dataset",
    "DatasetFormatError",
    "FileReport",
    "detect_format",
    "read_records",
    "validate_file",
    "validate_record",
]


def __getattr__(name: str) -> Any:
    if name == "Dataset":
        return twinkle_core.dataset.Dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
