"""Hub datasets (`hf://datasets/org/name`): resolved into the hub cache once, read with `datasets`.

No network: `download_dataset` is replaced by a stand-in that writes the files a dataset repository
holds on the hub (`data/<split>-00000-of-00001.parquet`), as tests/unit/test_model.py does for models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from twinkle_core.dataset import hub

ROWS = {
    "question": ["the cat", "a robot", "my dog"],
    "answer": [" sat on the mat", " builds a house", " runs far"],
    "id": [1, 2, 3],
}


def write_hub_layout(directory: Path, splits: dict[str, dict[str, list[object]]]) -> None:
    import datasets

    for split, rows in splits.items():
        (directory / "data").mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows).to_parquet(
            str(directory / "data" / f"{split}-00000-of-00001.parquet")
        )


@pytest.fixture()
def downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    calls: list[tuple[str, Path]] = []

    def download(repo_id: str, local_dir: Path) -> None:
        calls.append((repo_id, local_dir))
        write_hub_layout(local_dir, {"train": ROWS, "validation": {k: v[:1] for k, v in ROWS.items()}})

    monkeypatch.setenv("TWINKLE_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TWINKLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "download_dataset", download)
    return calls


def test_dataset_ids_are_spelled_hf_datasets_org_name() -> None:
    assert hub.parse_dataset_id("hf://datasets/org-1/qa.v2") == "org-1/qa.v2"
    for bad in ("org/qa", "hf://org/qa", "hf://datasets/org", "hf://datasets/org/qa/x", "hf://datasets/../x"):
        with pytest.raises(ValueError, match="hf://datasets/org/name"):
            hub.parse_dataset_id(bad)


def test_a_split_is_loaded_with_columns_renamed_and_downloaded_once(
    tmp_path: Path, downloads: list[tuple[str, Path]]
) -> None:
    columns = {"prompt": "question", "completion": "answer"}
    train = hub.load_hub_dataset("hf://datasets/org/qa", "train", columns)
    assert train.column_names == ["prompt", "completion"]  # only the mapped columns are kept
    pairs = zip(ROWS["question"], ROWS["answer"], strict=True)
    assert list(train) == [{"prompt": q, "completion": a} for q, a in pairs]
    validation = hub.load_hub_dataset("hf://datasets/org/qa", "validation", columns)
    assert len(validation) == 1
    target = tmp_path / "hub" / "datasets" / "org--qa"
    assert downloads == [("org/qa", target)]  # the second load reads the cache
    assert (target / hub.COMPLETE_MARKER).is_file()
    assert (tmp_path / "cache" / "hf-datasets").is_dir()  # load_dataset's cache is the worker's


def test_the_result_is_training_data_for_our_dataset(
    downloads: list[tuple[str, Path]], tmp_path: Path
) -> None:
    from twinkle_core.assets import build_tokenizer
    from twinkle_core.dataset import Dataset

    tokenizer = build_tokenizer(tmp_path / "tok")
    rows = hub.load_hub_dataset("hf://datasets/org/qa", "train", {"text": "question"})
    data = Dataset(rows, tokenizer, max_length=16, cache_dir=tmp_path / "tokens")
    assert data.data_format == "text" and len(data) == 3


def test_problems_name_the_field_or_the_column(downloads: list[tuple[str, Path]]) -> None:
    with pytest.raises(
        ValueError, match=r"data.columns.prompt: the column 'query' is not in hf://datasets/org/qa"
    ):
        hub.load_hub_dataset("hf://datasets/org/qa", "train", {"prompt": "query", "completion": "answer"})
    with pytest.raises(ValueError, match=r"^data.validation_file: hf://datasets/org/qa, split 'test'"):
        hub.load_hub_dataset("hf://datasets/org/qa", "test", field="data.validation_file")


def test_offline_without_a_cached_copy_is_a_clear_error(
    downloads: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"not in the dataset cache .* HF_HUB_OFFLINE"):
        hub.load_hub_dataset("hf://datasets/org/qa", "train")
    assert downloads == []


def test_the_real_download_asks_for_a_dataset_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: calls.append(kw))
    hub.download_dataset("org/qa", tmp_path)
    assert calls == [{"repo_id": "org/qa", "repo_type": "dataset", "local_dir": str(tmp_path)}]
