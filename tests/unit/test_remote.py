"""Ray mode pieces that need no Ray: the decorator in local mode, splitting and gathering, the
driver-side DataLoader, and initialize's validation. (Ray itself: tests/integration/test_ray_mode.py.)
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from twinkle_core import DeviceMesh, initialize, remote_class
from twinkle_core.remote import runtime
from twinkle_core.remote.data import DataRankView, ShardedBatch, ShardedDataLoader, split_for_ranks
from twinkle_core.remote.handle import gather, same_value


@remote_class(execute="driver")
class Plain:
    def __init__(self, value: int) -> None:
        self.value = value


@remote_class()
class TakesGroup:
    def __init__(self, value: int, remote_group: str | None = None) -> None:
        self.value = value
        self.group = remote_group


@pytest.fixture()
def ray_mode_without_ray() -> Iterator[None]:
    """Ray mode as far as the decorator can tell; nothing here may reach Ray."""
    state = runtime.state()
    previous = state.mode
    state.mode = "ray"
    try:
        yield
    finally:
        state.mode = previous


def test_local_mode_builds_plain_objects_and_drops_remote_group_when_not_accepted() -> None:
    assert not runtime.is_ray_mode()
    obj = Plain(3, remote_group="actor")
    assert type(obj) is Plain and obj.value == 3
    kept = TakesGroup(4, remote_group="actor")
    assert isinstance(kept, TakesGroup) and kept.group == "actor"
    assert pickle.loads(pickle.dumps(obj)).value == 3
    assert list(inspect.signature(Plain.__init__).parameters) == ["self", "value"]
    assert remote_class()(Plain) is Plain  # idempotent
    with pytest.raises(TypeError):
        Plain(1, 2)  # a bad call still fails like the undecorated class


def test_library_classes_are_decorated_and_unchanged_locally(
    tiny_model_dir: Path, text_dataset: Path
) -> None:
    from transformers import AutoTokenizer

    from twinkle_core.dataloader import DataLoader
    from twinkle_core.dataset import Dataset
    from twinkle_core.model import TransformersModel

    for cls in (TransformersModel, DataLoader, Dataset):
        assert hasattr(cls, "__twinkle_remote__"), cls
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = Dataset(text_dataset, tokenizer, max_length=32, remote_group="actor")
    assert type(dataset) is Dataset
    with_group = DataLoader(dataset, batch_size=4, remote_group="actor", seed=1)
    without = DataLoader(dataset, batch_size=4, seed=1)
    assert type(with_group) is DataLoader
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(with_group, without, strict=True))


def test_split_for_ranks_splits_rows_and_keeps_settings() -> None:
    inputs = {"input_ids": torch.arange(8).reshape(4, 2), "lengths": [1, 2, 3, 4], "flag": True}
    parts = split_for_ranks(inputs, 2, "inputs")
    assert torch.equal(parts[1]["input_ids"], torch.tensor([[4, 5], [6, 7]]))
    assert parts[0]["lengths"] == [1, 2] and parts[1]["flag"] is True
    assert split_for_ranks(ShardedBatch(("a", "b")), 2, "inputs") == ["a", "b"]
    with pytest.raises(ValueError, match=r"inputs\['input_ids'\].*not divisible"):
        split_for_ranks({"input_ids": torch.zeros(3, 2)}, 2, "inputs")
    with pytest.raises(ValueError, match="3 parts for 2"):
        split_for_ranks(ShardedBatch(("a", "b", "c")), 2, "inputs")
    with pytest.raises(ValueError, match="cannot split a int"):
        split_for_ranks(5, 2, "inputs")


def test_gather_returns_the_common_value_or_the_per_rank_list() -> None:
    same = {"loss": 1.5, "t": torch.ones(2)}
    assert gather([same, {"loss": 1.5, "t": torch.ones(2)}]) is same
    assert gather([None, None]) is None
    assert gather([{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]
    assert not same_value(torch.ones(2), torch.ones(3)) and not same_value([1], (1,))


def test_sharded_dataloader_yields_each_ranks_batch_and_resumes(
    tiny_model_dir: Path, text_dataset: Path
) -> None:
    from transformers import AutoTokenizer

    from twinkle_core.dataloader import DataLoader
    from twinkle_core.dataset import Dataset

    dataset = Dataset(text_dataset, AutoTokenizer.from_pretrained(tiny_model_dir), max_length=32)
    mesh = DeviceMesh(dp_size=1, fsdp_size=2)
    sharded = ShardedDataLoader(DataLoader, mesh, {"dataset": dataset, "batch_size": 4, "seed": 3})
    per_rank = [DataLoader(dataset, batch_size=4, seed=3, device_mesh=DataRankView(r, 2)) for r in range(2)]
    batches = list(sharded)
    assert len(batches) == len(sharded) == 16
    for batch, *expected in zip(batches, *per_rank, strict=True):
        for part, rank_batch in zip(batch.parts, expected, strict=True):
            assert torch.equal(part["input_ids"], rank_batch["input_ids"])
    assert sharded.get_state() == {"consumed_train_samples": 64}
    sharded.resume_from_checkpoint(8)
    assert torch.equal(next(iter(sharded)).parts[1]["input_ids"], batches[2].parts[1]["input_ids"])


def test_ray_mode_dataloader_runs_in_the_driver(
    ray_mode_without_ray: None, tiny_model_dir: Path, text_dataset: Path
) -> None:
    from transformers import AutoTokenizer

    from twinkle_core.dataloader import DataLoader
    from twinkle_core.dataset import Dataset

    dataset = Dataset(text_dataset, AutoTokenizer.from_pretrained(tiny_model_dir), max_length=32)
    mesh = DeviceMesh(dp_size=2, fsdp_size=1)
    loader: Any = DataLoader(dataset, batch_size=4, device_mesh=mesh, remote_group="actor")
    assert isinstance(loader, ShardedDataLoader) and loader.batch_size == 4
    assert len(next(iter(loader))) == 2
    with pytest.raises(ValueError, match="needs device_mesh"):
        DataLoader(dataset, batch_size=4, remote_group="no-such-group")


def test_ray_mode_model_needs_a_mesh(ray_mode_without_ray: None) -> None:
    from twinkle_core.model import TransformersModel

    with pytest.raises(ValueError, match="remote_group='actor' needs device_mesh"):
        TransformersModel(model_id="unused", remote_group="actor")
    with pytest.raises(ValueError, match="remote_group must be a non-empty string"):
        TakesGroup(1, remote_group="")


def test_ray_mode_without_remote_group_builds_the_model_locally(
    ray_mode_without_ray: None, tiny_model_dir: Path
) -> None:
    from twinkle_core.model import TransformersModel

    for kwargs in ({}, {"remote_group": None}):
        model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="no", **kwargs)
        assert type(model) is TransformersModel  # the real object, here, not a RemoteHandle
        assert sum(p.numel() for p in model.model.parameters()) > 0
    assert runtime.state().groups == {}  # no actor group was started


def test_initialize_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        initialize(mode="cluster")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_cpus must be >= 0"):
        initialize(groups={"actor": {"num_cpus": -1}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="inside a torchrun rank"):
        initialize(mode="ray")
    with pytest.raises(ValueError, match="execute must be"):
        remote_class(execute="anywhere")  # type: ignore[arg-type]
    initialize(mode="local", seed=7)
    assert torch.initial_seed() == 7 and not runtime.is_ray_mode()
