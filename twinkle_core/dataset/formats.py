"""Reading and validating training data files, with no torch/transformers import.

The API server imports this module to validate uploads, so it must stay cheap: only the standard
library at import time, and pyarrow only when a Parquet file is actually read.

File formats (picked from the extension):
- JSON Lines (`.jsonl`, `.jsonlines`, `.ndjson`): one object per line; blank lines are skipped.
- JSON (`.json`): a top-level list of objects. A `.json` file that does not start with `[` is
  read as JSON Lines, because many tools write JSON Lines under a `.json` name.
- CSV (`.csv`): a header row naming the fields; a `messages` cell holds a JSON-encoded list.
- Parquet (`.parquet`, `.pq`): one record per row.

Data formats (what a record holds):
- `chat`: `messages`, a list of `{"role", "content"}` with at least one assistant turn.
- `prompt_completion`: string `prompt` and non-empty string `completion`.
- `text`: a non-empty string `text`.

Every record has a location a person can find: the 1-based line in the file where the record
starts (JSON Lines, JSON, CSV) or the 1-based row (Parquet).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

DataFormat = Literal["chat", "prompt_completion", "text"]
FileFormat = Literal["jsonl", "json", "csv", "parquet"]

DATA_FORMATS: tuple[str, ...] = ("chat", "prompt_completion", "text")
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})

_EXTENSIONS: dict[str, FileFormat] = {
    ".jsonl": "jsonl",
    ".jsonlines": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class DatasetFormatError(ValueError):
    """A data file (or in-memory dataset) holds something that cannot be trained on.

    `path` names the source, `line` is the 1-based line/row of the first bad record (None for a
    problem with the whole file, such as an unknown extension or no records at all), `unit` says
    which ('line', or 'row' for Parquet and in-memory rows) and `problem` is the message alone.
    """

    def __init__(self, path: str | Path, line: int | None, problem: str, unit: str = "line") -> None:
        self.path = str(path)
        self.line = line
        self.unit = unit
        self.problem = problem
        where = f"{self.path}, {unit} {line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class FileReport:
    """What `validate_file` found: the file's format, the records' format and how many there are."""

    file_format: FileFormat
    data_format: DataFormat
    rows: int


def file_format_of(path: str | Path) -> FileFormat:
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        known = ", ".join(sorted(_EXTENSIONS))
        raise DatasetFormatError(path, None, f"unknown file extension {suffix!r}; expected one of {known}")
    return _EXTENSIONS[suffix]


def location_unit(file_format: FileFormat) -> str:
    """The word that goes with a record's number in messages: Parquet has rows, text files lines."""
    return "row" if file_format == "parquet" else "line"


def read_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line or row number, record)` for every record in the file, in order.

    Raises `DatasetFormatError` at the first record that is not valid JSON / not an object; it
    does not check the record's fields (see `validate_record`).
    """
    file_format = file_format_of(path)
    if file_format == "parquet":
        yield from _read_parquet(path)
        return
    if file_format == "jsonl" or (file_format == "json" and not _starts_with_list(path)):
        yield from _read_json_lines(path)
        return
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetFormatError(path, None, f"cannot read file: {exc.strerror or exc}") from exc
    text = _decode_file(path, data)
    if file_format == "csv":
        yield from _read_csv(path, text)
    else:
        yield from _read_json_array(path, text)


def detect_format(record: dict[str, Any]) -> DataFormat:
    """Guess a record's data format from its keys (`messages` / `prompt`+`completion` / `text`)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected an object, got {_type_name(record)}")
    if "messages" in record:
        return "chat"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "text" in record:
        return "text"
    keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    raise ValueError(
        "cannot tell the data format: expected a 'messages' list (chat), 'prompt' and 'completion' "
        f"(prompt_completion) or 'text' (text); the record's keys are {keys}"
    )


def validate_record(record: Any, data_format: DataFormat) -> None:
    """Raise ValueError (without a location) if `record` is not a trainable `data_format` record."""
    if not isinstance(record, dict):
        raise ValueError(f"expected an object, got {_type_name(record)}")
    if data_format == "chat":
        _validate_chat(record)
    elif data_format == "prompt_completion":
        _require_str(record, "prompt", data_format, allow_empty=True)
        _require_str(record, "completion", data_format, allow_empty=False)
    elif data_format == "text":
        _require_str(record, "text", data_format, allow_empty=False)
    else:
        raise ValueError(f"data_format must be one of {', '.join(DATA_FORMATS)}, got {data_format!r}")


def check_data_format(data_format: str) -> None:
    """Reject an unknown `data_format` argument ('auto' is allowed) with a message naming it."""
    if data_format != "auto" and data_format not in DATA_FORMATS:
        raise ValueError(
            f"data_format must be 'auto' or one of {', '.join(DATA_FORMATS)}, got {data_format!r}"
        )


def validated_records(
    records: Iterator[tuple[int, dict[str, Any]]],
    source: str | Path,
    data_format: str = "auto",
    unit: str = "line",
) -> Iterator[tuple[int, DataFormat, dict[str, Any]]]:
    """Check each record against `data_format` ('auto': the format of the first record).

    Yields `(location, resolved format, record)`; raises `DatasetFormatError` at the first bad
    record, or after the last one if there were none.
    """
    check_data_format(data_format)
    resolved: DataFormat | None = None if data_format == "auto" else cast(DataFormat, data_format)
    detected_at: int | None = None
    for location, record in records:
        try:
            if resolved is None:
                resolved = detect_format(record)
                detected_at = location
            validate_record(record, resolved)
        except ValueError as exc:
            problem = str(exc)
            # A missing field in 'auto' mode usually means the file mixes formats: say which won.
            if problem.startswith("missing field") and detected_at not in (None, location):
                problem += f" (format {resolved!r} detected from {unit} {detected_at})"
            raise DatasetFormatError(source, location, problem, unit) from None
        yield location, resolved, record
    if resolved is None:
        raise DatasetFormatError(source, None, "no records: the file is empty")


def validate_file(path: str | Path, data_format: str = "auto") -> FileReport:
    """Read every record of `path`; raise `DatasetFormatError` at the first bad one."""
    file_format = file_format_of(path)
    rows = 0
    resolved: DataFormat = "text"
    unit = location_unit(file_format)
    for _, fmt, _ in validated_records(read_records(path), path, data_format, unit):
        rows += 1
        resolved = fmt
    return FileReport(file_format=file_format, data_format=resolved, rows=rows)


# --- record checks ---------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def _require_str(record: dict[str, Any], field: str, data_format: str, allow_empty: bool) -> None:
    if field not in record:
        raise ValueError(f"missing field {field!r} (format {data_format!r})")
    value = record[field]
    if not isinstance(value, str):
        raise ValueError(f"field {field!r} must be a string, got {_type_name(value)}")
    if not allow_empty and not value.strip():
        raise ValueError(f"field {field!r} is empty")


def _validate_chat(record: dict[str, Any]) -> None:
    if "messages" not in record:
        raise ValueError("missing field 'messages' (format 'chat')")
    messages = record["messages"]
    if not isinstance(messages, list):
        raise ValueError(f"field 'messages' must be a list, got {_type_name(messages)}")
    if not messages:
        raise ValueError("field 'messages' is an empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object, got {_type_name(message)}")
        role = message.get("role")
        if "role" not in message:
            raise ValueError(f"messages[{i}] has no 'role'")
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{i}] has unknown role {role!r}; expected one of {sorted(CHAT_ROLES)}")
        if "content" not in message:
            raise ValueError(f"messages[{i}] has no 'content'")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}].content must be a string, got {_type_name(message['content'])}")
    # A conversation without an assistant turn has no tokens to learn from.
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("'messages' has no assistant message, so nothing would be trained on")


# --- file readers ----------------------------------------------------------------------------


_BLANK_BYTES = b"\xef\xbb\xbf \t\r\n"  # a UTF-8 byte order mark and JSON whitespace


def _open(path: str | Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise DatasetFormatError(path, None, f"cannot read file: {exc.strerror or exc}") from exc


def _starts_with_list(path: str | Path) -> bool:
    """Whether a .json file holds a JSON list (its first non-blank character is '[')."""
    with _open(path) as fh:
        head = fh.read(4096)
        while head and not head.lstrip(_BLANK_BYTES):
            head = fh.read(4096)
    return head.lstrip(_BLANK_BYTES).startswith(b"[")


def _decode_file(path: str | Path, data: bytes) -> str:
    try:
        return data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DatasetFormatError(path, line, "not valid UTF-8 text") from None


def _as_object(path: str | Path, line: int, value: Any, unit: str = "line") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DatasetFormatError(path, line, f"expected a JSON object, got {_type_name(value)}", unit)
    return value


def _read_json_lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream the file line by line, so validating a large upload needs little memory."""
    with _open(path) as fh:
        for line_number, raw in enumerate(fh, start=1):
            if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DatasetFormatError(path, line_number, "not valid UTF-8 text") from None
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(
                    path, line_number, f"invalid JSON: {exc.msg} (column {exc.colno})"
                ) from None
            yield line_number, _as_object(path, line_number, value)


def _read_json_array(path: str | Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Walk a top-level JSON list element by element so each record keeps its starting line."""
    decoder = json.JSONDecoder()

    def line_at(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def skip_ws(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip_ws(0) + 1  # past the opening '['
    pos = skip_ws(pos)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        if pos >= len(text):
            raise DatasetFormatError(path, line_at(pos), "invalid JSON: the list is not closed with ']'")
        line = line_at(pos)
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(
                path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})"
            ) from None
        yield line, _as_object(path, line, value)
        pos = skip_ws(pos)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            if skip_ws(pos + 1) != len(text):
                raise DatasetFormatError(path, line_at(pos + 1), "invalid JSON: extra data after the list")
            return
        raise DatasetFormatError(path, line_at(pos), "invalid JSON: expected ',' or ']' between list items")


def _read_csv(path: str | Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        return
    # csv's line_num counts physical lines read so far, so a record starts one past the previous end.
    start = reader.line_num + 1
    try:
        for row in reader:
            if None in row:
                raise DatasetFormatError(path, start, "more cells than header fields")
            record: dict[str, Any] = dict(row)
            if isinstance(record.get("messages"), str):
                try:
                    record["messages"] = json.loads(record["messages"])
                except json.JSONDecodeError as exc:
                    raise DatasetFormatError(
                        path, start, f"'messages' cell is not valid JSON: {exc.msg}"
                    ) from None
            yield start, record
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DatasetFormatError(path, start, f"invalid CSV: {exc}") from None


def _read_parquet(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(str(path))
    except (OSError, pa.ArrowException) as exc:
        raise DatasetFormatError(path, None, f"not a readable Parquet file: {exc}") from None
    row = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            row += 1
            yield row, record
