"""Training data: file formats and validation (light), and the tokenised `Dataset` (needs torch).

`twinkle_core.dataset.formats` imports only the standard library, so the API server can import
this package to validate uploads; `Dataset` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twinkle_core.dataset.formats import (
    DatasetFormatError,
    FileReport,
    detect_format,
    read_records,
    validate_file,
    validate_record,
)

if TYPE_CHECKING:
    from twinkle_core.dataset.dataset import Dataset

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
        from twinkle_core.dataset.dataset import Dataset
        from twinkle_core.remote import remote_class

        # Ray mode: a Dataset built with remote_group= is loaded once, in the driver, and reaches
        # the ranks as batches of a DataLoader with the same remote_group.
        return remote_class(execute="driver")(Dataset)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
