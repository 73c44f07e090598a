"""Reading and validating data files (twinkle_core.dataset.formats): no tokenizer involved."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from twinkle_core.dataset.formats import (
    DatasetFormatError,
    FileReport,
    detect_format,
    read_records,
    validate_file,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
PROMPT_COMPLETION = {"prompt": "the cat", "completion": " reads books."}
TEXT = {"text": "a bird paints small boats."}


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def write_records_jsonl(path: Path, records: list[Any]) -> Path:
    return write_jsonl(path, [json.dumps(r) for r in records])


def write_csv(path: Path, records: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in record.items()})
    return path


def write_parquet(path: Path, records: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def test_importing_formats_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys, twinkle_core.dataset, twinkle_core.dataset.formats;"
        "heavy = [m for m in ('torch', 'transformers', 'pyarrow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


@pytest.mark.parametrize(
    ("record", "expected"),
    [(CHAT, "chat"), (PROMPT_COMPLETION, "prompt_completion"), (TEXT, "text")],
)
def test_detect_format(record: dict[str, Any], expected: str) -> None:
    assert detect_format(record) == expected


def test_detect_format_names_the_keys_when_nothing_fits() -> None:
    with pytest.raises(ValueError, match="'question'"):
        detect_format({"question": "q", "answer": "a"})


@pytest.mark.parametrize(
    ("record", "data_format"),
    [(CHAT, "chat"), (PROMPT_COMPLETION, "prompt_completion"), (TEXT, "text")],
)
@pytest.mark.parametrize("writer", ["jsonl", "json", "csv", "parquet"])
def test_every_file_format_round_trips_every_data_format(
    tmp_path: Path, writer: str, record: dict[str, Any], data_format: str
) -> None:
    records = [record, {**record}, {**record}]
    path = tmp_path / f"data.{writer}"
    if writer == "jsonl":
        write_records_jsonl(path, records)
    elif writer == "json":
        path.write_text(json.dumps(records, indent=2))
    elif writer == "csv":
        write_csv(path, records)
    else:
        write_parquet(path, records)

    assert [r for _, r in read_records(path)] == records
    assert validate_file(path) == FileReport(file_format=writer, data_format=data_format, rows=3)  # type: ignore[arg-type]
    assert validate_file(path, data_format=data_format).rows == 3


def test_locations_are_file_lines_for_text_formats_and_rows_for_parquet(tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "a.jsonl", [json.dumps(TEXT), "", json.dumps(TEXT)])
    assert [line for line, _ in read_records(jsonl)] == [1, 3]

    array = tmp_path / "a.json"
    array.write_text(json.dumps([TEXT, TEXT], indent=2))  # each object spans 3 lines after '['
    assert [line for line, _ in read_records(array)] == [2, 5]

    table = write_csv(tmp_path / "a.csv", [TEXT, {"text": "two\nlines"}, TEXT])
    assert [line for line, _ in read_records(table)] == [2, 3, 5]

    parquet = write_parquet(tmp_path / "a.parquet", [TEXT, TEXT])
    assert [row for row, _ in read_records(parquet)] == [1, 2]


def test_json_file_holding_json_lines_is_accepted(tmp_path: Path) -> None:
    path = write_records_jsonl(tmp_path / "data.json", [TEXT, TEXT])
    assert validate_file(path) == FileReport(file_format="json", data_format="text", rows=2)


def _error(path: Path, data_format: str = "auto") -> DatasetFormatError:
    with pytest.raises(DatasetFormatError) as info:
        validate_file(path, data_format)
    return info.value


def test_bad_json_on_line_3_is_reported_with_line_3(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps(TEXT), json.dumps(TEXT), '{"text": "oops"', "{}"])
    error = _error(path)
    assert error.line == 3
    assert error.path == str(path)
    assert str(error).startswith(f"{path}, line 3: invalid JSON")
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("bad_line", "data_format", "message"),
    [
        ({"text": 5}, "text", "field 'text' must be a string, got a number"),
        ({"text": "  "}, "text", "field 'text' is empty"),
        ({"prompt": "p"}, "prompt_completion", "missing field 'completion'"),
        (
            {"prompt": "p", "completion": ["x"]},
            "prompt_completion",
            "'completion' must be a string, got a list",
        ),
        ({"messages": "hi"}, "chat", "'messages' must be a list, got a string"),
        ({"messages": []}, "chat", "'messages' is an empty list"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "chat", "unknown role 'bot'"),
        ({"messages": [{"content": "x"}]}, "chat", "messages[0] has no 'role'"),
        ({"messages": [{"role": "user", "content": None}]}, "chat", "messages[0].content must be a string"),
        ({"messages": [{"role": "user", "content": "x"}]}, "chat", "no assistant message"),
        ({"text": "x"}, "chat", "missing field 'messages'"),
        (["not", "an", "object"], "auto", "expected a JSON object, got a list"),
    ],
)
def test_first_bad_record_is_reported_with_its_line(
    tmp_path: Path, bad_line: Any, data_format: str, message: str
) -> None:
    good_records: dict[str, dict[str, Any]] = {
        "text": TEXT,
        "prompt_completion": PROMPT_COMPLETION,
        "chat": CHAT,
        "auto": TEXT,
    }
    good_record = good_records[data_format]
    path = write_records_jsonl(tmp_path / "d.jsonl", [good_record, bad_line, bad_line])
    error = _error(path, data_format)
    assert error.line == 2
    assert message in str(error)
    assert f"{path}, line 2: " in str(error)


def test_auto_format_is_detected_from_the_first_record_and_enforced(tmp_path: Path) -> None:
    path = write_records_jsonl(tmp_path / "mixed.jsonl", [TEXT, TEXT, TEXT, PROMPT_COMPLETION])
    error = _error(path)
    assert error.line == 4
    assert "missing field 'text'" in str(error)
    assert "detected from line 1" in str(error)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    error = _error(path)
    assert error.line is None
    assert "empty" in str(error)


def test_empty_json_list_and_header_only_csv_are_empty(tmp_path: Path) -> None:
    (tmp_path / "e.json").write_text("[ ]")
    (tmp_path / "e.csv").write_text("text\n")
    assert "empty" in str(_error(tmp_path / "e.json"))
    assert "empty" in str(_error(tmp_path / "e.csv"))


def test_json_array_errors_carry_the_line_of_the_bad_element(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"},\n  {"text": }\n]\n')
    error = _error(path)
    assert error.line == 4
    assert "invalid JSON" in str(error)

    path.write_text('[\n  {"text": "a"}\n  {"text": "b"}\n]')
    assert _error(path).line == 3

    path.write_text('[\n  {"text": "a"},\n  {"text": 1}\n]')
    error = _error(path)
    assert (error.line, "must be a string" in str(error)) == (3, True)


def test_csv_messages_cell_must_be_json(tmp_path: Path) -> None:
    path = tmp_path / "chat.csv"
    path.write_text(
        'messages\n"[{""role"": ""user"", ""content"": ""hi""}, '
        '{""role"": ""assistant"", ""content"": ""yo""}]"\n[oops\n'
    )
    error = _error(path)
    assert error.line == 3
    assert "'messages' cell is not valid JSON" in str(error)


def test_csv_row_with_extra_cells_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("text\nfine\nnot,fine\n")
    assert _error(path).line == 3


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", [{"text": "ok"}, {"text": ""}])
    error = _error(path)
    assert (error.line, error.unit, error.problem) == (2, "row", "field 'text' is empty")
    assert f"{path}, row 2: field 'text' is empty" == str(error)


def test_unreadable_files(tmp_path: Path) -> None:
    assert "unknown file extension '.txt'" in str(_error(tmp_path / "a.txt"))
    assert "cannot read file" in str(_error(tmp_path / "missing.jsonl"))
    (tmp_path / "bin.jsonl").write_bytes(json.dumps(TEXT).encode() + b"\n\xff\xfe\n")
    error = _error(tmp_path / "bin.jsonl")
    assert (error.line, error.problem) == (2, "not valid UTF-8 text")
    (tmp_path / "bin.csv").write_bytes(b"text\nfine\n\xff\n")
    assert _error(tmp_path / "bin.csv").line == 3
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    assert "not a readable Parquet file" in str(_error(tmp_path / "junk.parquet"))


def test_unknown_data_format_argument_is_a_value_error(tmp_path: Path) -> None:
    path = write_records_jsonl(tmp_path / "d.jsonl", [TEXT])
    with pytest.raises(ValueError, match="data_format must be"):
        validate_file(path, data_format="instructions")
