"""Tokenised datasets: label masks per format, truncation, packing, the cache, bad data."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twinkle_core import assets
from twinkle_core.dataset import Dataset, DatasetFormatError
from twinkle_core.dataset import tokenize as tokenize_module
from twinkle_core.dataset.tokenize import IGNORE_INDEX

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who reads?"},
    {"role": "assistant", "content": "the cat reads."},
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "a bird paints."},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    assets.build_tokenizer(out)
    return out


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def trained_text(tokenizer: Any, item: dict[str, list[int]]) -> str:
    """Decode the tokens that carry a label (labels equal input_ids wherever they are set)."""
    for token, label in zip(item["input_ids"], item["labels"], strict=True):
        assert label in (IGNORE_INDEX, token)
    return tokenizer.decode([t for t in item["labels"] if t != IGNORE_INDEX])


def test_text_trains_every_token_and_ends_with_eos(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    path = assets.write_text_dataset(tmp_path / "t.jsonl", n=10)
    ds = Dataset(path, tokenizer, cache_dir=cache_dir)
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert (len(ds), ds.data_format) == (10, "text")
    for text, item in zip(texts, (ds[i] for i in range(len(ds))), strict=True):
        assert item["labels"] == item["input_ids"]
        assert item["input_ids"][-1] == tokenizer.eos_token_id
        assert tokenizer.decode(item["input_ids"]) == text + "<|eos|>"


def test_prompt_completion_trains_only_the_completion_and_eos(
    tokenizer: Any, tmp_path: Path, cache_dir: Path
) -> None:
    path = write_jsonl(
        tmp_path / "pc.jsonl", [{"prompt": "Question: the cat", "completion": " reads long books."}]
    )
    item = Dataset(path, tokenizer, cache_dir=cache_dir)[0]
    prompt_len = len(tokenizer("Question: the cat")["input_ids"])
    assert item["labels"][:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert all(label != IGNORE_INDEX for label in item["labels"][prompt_len:])
    assert trained_text(tokenizer, item) == " reads long books.<|eos|>"
    assert tokenizer.decode(item["input_ids"]) == "Question: the cat reads long books.<|eos|>"


def test_chat_trains_only_assistant_turns(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    item = Dataset(path, tokenizer, cache_dir=cache_dir)[0]
    assert trained_text(tokenizer, item) == "the cat reads.<|eos|>a bird paints.<|eos|>"
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokenizer.decode(item["input_ids"]) == rendered
    # The assistant header is context, not a target.
    header = tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert all(label != header for label in item["labels"])


def test_chat_without_generation_tags_falls_back_to_prefix_rendering(
    tokenizer: Any, tmp_path: Path, cache_dir: Path
) -> None:
    path = assets.write_chat_dataset(tmp_path / "c.jsonl", n=6)
    path.write_text(path.read_text() + json.dumps({"messages": CONVERSATION}) + "\n")
    with_tags = Dataset(path, tokenizer, cache_dir=cache_dir)
    assert tokenize_module.RecordTokenizer(tokenizer).chat_template_has_generation_tags

    tokenizer.chat_template = tokenizer.chat_template.replace("{% generation %}", "").replace(
        "{% endgeneration %}", ""
    )
    assert not tokenize_module.RecordTokenizer(tokenizer).chat_template_has_generation_tags
    by_prefix = Dataset(path, tokenizer, cache_dir=cache_dir)
    assert not by_prefix.loaded_from_cache  # the template is part of the cache key
    assert [by_prefix[i] for i in range(len(by_prefix))] == [with_tags[i] for i in range(len(with_tags))]


def test_template_that_rejects_a_conversation_reports_the_line(
    tokenizer: Any, tmp_path: Path, cache_dir: Path
) -> None:
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}"
        "{% endif %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    tool_chat = {"messages": [*CONVERSATION[:3], {"role": "tool", "content": "x"}]}
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}, tool_chat])
    with pytest.raises(DatasetFormatError, match=r"line 2: cannot tokenise: .*no tools here") as info:
        Dataset(path, tokenizer, cache_dir=cache_dir)
    assert info.value.line == 2


def test_truncation_and_samples_with_nothing_left_to_train(
    tokenizer: Any, tmp_path: Path, cache_dir: Path
) -> None:
    records = [
        {"prompt": "the cat", "completion": " reads long books and old maps."},
        {"prompt": "the cat likes small boats and my friend reads long books", "completion": " yes."},
    ]
    path = write_jsonl(tmp_path / "pc.jsonl", records)
    ds = Dataset(path, tokenizer, max_length=6, cache_dir=cache_dir)
    assert (len(ds), ds.num_records, ds.num_dropped) == (1, 2, 1)
    assert len(ds[0]["input_ids"]) == len(ds[0]["labels"]) == 6
    full = Dataset(path, tokenizer, max_length=1024, cache_dir=cache_dir)[0]
    assert ds[0]["input_ids"] == full["input_ids"][:6]


def test_packing_fills_blocks_and_keeps_every_token(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    path = assets.write_text_dataset(tmp_path / "t.jsonl", n=30)
    plain = Dataset(path, tokenizer, cache_dir=cache_dir)
    packed = Dataset(path, tokenizer, max_length=16, packing=True, cache_dir=cache_dir)

    samples = [plain[i] for i in range(len(plain))]
    blocks = [packed[i] for i in range(len(packed))]
    assert all(len(block["input_ids"]) == 16 for block in blocks[:-1])
    assert 0 < len(blocks[-1]["input_ids"]) <= 16
    stream = [token for sample in samples for token in sample["input_ids"]]
    assert [token for block in blocks for token in block["input_ids"]] == stream
    # Every sample's first token is unlabelled (not predicted from the previous sample); the rest are.
    expected_labels = [
        IGNORE_INDEX if i == 0 else token for sample in samples for i, token in enumerate(sample["input_ids"])
    ]
    assert [label for block in blocks for label in block["labels"]] == expected_labels
    assert packed.num_tokens() == len(stream)


def test_second_construction_hits_the_cache_without_tokenising(
    tokenizer: Any, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_call = tokenize_module.RecordTokenizer.__call__

    def counting_call(self: Any, record: dict[str, Any], data_format: Any) -> Any:
        calls.append(data_format)
        return real_call(self, record, data_format)

    monkeypatch.setattr(tokenize_module.RecordTokenizer, "__call__", counting_call)
    path = assets.write_chat_dataset(tmp_path / "c.jsonl", n=12)

    first = Dataset(path, tokenizer, cache_dir=cache_dir)
    assert (first.loaded_from_cache, len(calls)) == (False, 12)
    assert first.cache_path.parent == cache_dir and first.cache_path.exists()
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".lock", ".npz"]  # no temp file left

    second = Dataset(path, tokenizer, cache_dir=cache_dir)
    assert (second.loaded_from_cache, len(calls)) == (True, 12)
    assert second.data_format == "chat"
    assert [second[i] for i in range(12)] == [first[i] for i in range(12)]

    # Anything the tokens depend on changes the key.
    assert not Dataset(path, tokenizer, max_length=32, cache_dir=cache_dir).loaded_from_cache
    assert not Dataset(path, tokenizer, packing=True, cache_dir=cache_dir).loaded_from_cache
    path.write_text(path.read_text().replace(".", "!"))
    assert not Dataset(path, tokenizer, cache_dir=cache_dir).loaded_from_cache


def test_a_corrupt_cache_entry_is_rebuilt(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    path = assets.write_text_dataset(tmp_path / "t.jsonl", n=5)
    first = Dataset(path, tokenizer, cache_dir=cache_dir)
    first.cache_path.write_bytes(b"truncated")
    again = Dataset(path, tokenizer, cache_dir=cache_dir)
    assert not again.loaded_from_cache
    assert again[4] == first[4]


def test_concurrent_constructions_tokenise_once(
    tokenizer: Any, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[int] = []
    real_build = Dataset._build

    def counting_build(self: Dataset) -> Any:
        builds.append(1)
        return real_build(self)

    monkeypatch.setattr(Dataset, "_build", counting_build)
    path = assets.write_text_dataset(tmp_path / "t.jsonl", n=200)
    results: list[Dataset] = []
    threads = [
        threading.Thread(target=lambda: results.append(Dataset(path, tokenizer, cache_dir=cache_dir)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert len(builds) == 1
    assert sorted(ds.loaded_from_cache for ds in results) == [False, True, True]


def test_default_cache_dir_comes_from_the_environment(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_CACHE_DIR", str(tmp_path / "env-cache"))
    ds = Dataset(assets.write_text_dataset(tmp_path / "t.jsonl", n=3), tokenizer)
    assert ds.cache_path.parent == tmp_path / "env-cache"


def test_malformed_row_fails_fast_with_its_line_and_caches_nothing(
    tokenizer: Any, tmp_path: Path, cache_dir: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "the cat."}\n{"text": "a bird."}\n{"text": "no end\n{"text": "x"}\n')
    with pytest.raises(DatasetFormatError) as info:
        Dataset(path, tokenizer, cache_dir=cache_dir)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}, line 3: invalid JSON")
    assert not list(cache_dir.glob("*.npz"))


@pytest.mark.parametrize("suffix", ["csv", "parquet", "json"])
def test_csv_parquet_and_json_give_the_same_samples_as_jsonl(
    tokenizer: Any, tmp_path: Path, cache_dir: Path, suffix: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = assets.write_chat_dataset(tmp_path / "c.jsonl", n=8)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    other = tmp_path / f"c.{suffix}"
    if suffix == "csv":
        other.write_text(
            "messages\n"
            + "".join('"' + json.dumps(r["messages"]).replace('"', '""') + '"\n' for r in records)
        )
    elif suffix == "parquet":
        pq.write_table(pa.Table.from_pylist(records), other)
    else:
        other.write_text(json.dumps(records, indent=1))

    expected = Dataset(jsonl, tokenizer, cache_dir=cache_dir)
    got = Dataset(other, tokenizer, cache_dir=cache_dir)
    assert got.data_format == "chat"
    assert [got[i] for i in range(len(got))] == [expected[i] for i in range(len(expected))]


class FakeHFDataset:
    """The parts of `datasets.Dataset` that Dataset relies on: rows, a length, a fingerprint."""

    def __init__(self, rows: list[dict[str, Any]], fingerprint: str) -> None:
        self.rows = rows
        self._fingerprint = fingerprint

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Any:
        return iter(self.rows)


def test_in_memory_sources(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    rows = [{"prompt": "the cat", "completion": " reads."}, {"prompt": "a bird", "completion": " paints."}]
    from_list = Dataset(rows, tokenizer, cache_dir=cache_dir)
    from_file = Dataset(write_jsonl(tmp_path / "pc.jsonl", rows), tokenizer, cache_dir=cache_dir)
    assert [from_list[i] for i in range(2)] == [from_file[i] for i in range(2)]
    assert Dataset(list(rows), tokenizer, cache_dir=cache_dir).loaded_from_cache

    hf_like = FakeHFDataset(rows, fingerprint="abc123")
    assert not Dataset(hf_like, tokenizer, cache_dir=cache_dir).loaded_from_cache
    assert Dataset(
        FakeHFDataset(rows, fingerprint="abc123"), tokenizer, cache_dir=cache_dir
    ).loaded_from_cache

    with pytest.raises(DatasetFormatError, match=r"<in-memory dataset>, row 2: missing field 'completion'"):
        Dataset([rows[0], {"prompt": "x"}], tokenizer, cache_dir=cache_dir)


def test_invalid_arguments_name_the_field(tokenizer: Any, tmp_path: Path, cache_dir: Path) -> None:
    path = assets.write_text_dataset(tmp_path / "t.jsonl", n=2)
    with pytest.raises(ValueError, match="data_format"):
        Dataset(path, tokenizer, data_format="instruction", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="max_length"):
        Dataset(path, tokenizer, max_length=0, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="source: data file not found"):
        Dataset(tmp_path / "missing.jsonl", tokenizer, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="source must be"):
        Dataset(42, tokenizer, cache_dir=cache_dir)
    with pytest.raises(DatasetFormatError, match="missing field 'messages'"):
        Dataset(path, tokenizer, data_format="chat", cache_dir=cache_dir)
