"""The DataLoader: order, padding, rank slicing, progress and exact resume."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twinkle_core.dataloader import DataLoader, PadCollator


class IndexDataset:
    """Sample `i` holds the single token `i`, so a batch shows which samples it contains."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": [index], "labels": [index]}


@dataclass
class Mesh:
    data_rank: int
    data_world_size: int


def make_loader(n: int = 20, batch_size: int = 4, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("pad_token_id", -1)
    return DataLoader(IndexDataset(n), batch_size, **kwargs)


def indices(batch: dict[str, torch.Tensor]) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def epoch_batches(loader: DataLoader) -> list[list[int]]:
    return [indices(batch) for batch in loader]


def test_one_epoch_covers_each_sample_once_in_global_batches() -> None:
    loader = make_loader(n=20, batch_size=4)
    batches = epoch_batches(loader)
    assert len(loader) == len(batches) == 5
    assert all(len(batch) == 4 for batch in batches)
    assert sorted(i for batch in batches for i in batch) == list(range(20))
    assert loader.get_state() == {"consumed_train_samples": 20}
    assert loader.epoch == 1


def test_order_is_a_seeded_permutation_per_epoch() -> None:
    loader = make_loader(n=20, batch_size=4, seed=7)
    first, second = epoch_batches(loader), epoch_batches(loader)
    for epoch, batches in enumerate([first, second]):
        expected = torch.randperm(20, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert [i for batch in batches for i in batch] == expected
    assert first != second

    again = make_loader(n=20, batch_size=4, seed=7)
    assert [epoch_batches(again), epoch_batches(again)] == [first, second]
    assert epoch_batches(make_loader(n=20, batch_size=4, seed=8)) != first


def test_no_shuffle_keeps_dataset_order() -> None:
    assert epoch_batches(make_loader(n=8, batch_size=4, shuffle=False)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng_is_untouched(num_workers: int) -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)

    torch.manual_seed(123)
    loader = make_loader(n=12, batch_size=4, num_workers=num_workers)
    for _ in range(2):
        loader.set_epoch(loader.epoch)
        epoch_batches(loader)
    loader.resume_from_checkpoint(4)
    next(iter(loader))
    assert torch.equal(torch.rand(4), expected)


def test_worker_processes_yield_the_same_batches() -> None:
    assert epoch_batches(make_loader(n=16, num_workers=2)) == epoch_batches(make_loader(n=16, num_workers=0))


def test_padding_masks_and_ignores_the_pad() -> None:
    class Ragged:
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> dict[str, list[int]]:
            return [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}][
                index
            ]

    batch = next(iter(DataLoader(Ragged(), batch_size=2, shuffle=False, pad_token_id=0)))
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_pad_id_defaults_to_the_dataset_tokenizer() -> None:
    class WithTokenizer(IndexDataset):
        tokenizer = type("Tok", (), {"pad_token_id": None, "eos_token_id": 9})()

    loader = DataLoader(WithTokenizer(4), batch_size=2)
    assert isinstance(loader.collate_fn, PadCollator) and loader.collate_fn.pad_token_id == 9
    with pytest.raises(ValueError, match="pad_token_id"):
        DataLoader(IndexDataset(4), batch_size=2)


def test_custom_collate_fn_gets_the_local_samples() -> None:
    loader = make_loader(n=8, batch_size=4, shuffle=False, collate_fn=lambda samples: samples)
    assert next(iter(loader)) == [{"input_ids": [i], "labels": [i]} for i in range(4)]


@pytest.mark.parametrize("k", [0, 1, 3, 4])
def test_resume_after_k_batches_yields_exactly_the_rest(k: int) -> None:
    full = epoch_batches(make_loader(n=20, batch_size=4))

    interrupted = make_loader(n=20, batch_size=4)
    iterator = iter(interrupted)
    seen = [indices(next(iterator)) for _ in range(k)]
    state = interrupted.get_state()
    assert state == {"consumed_train_samples": 4 * k}

    resumed = make_loader(n=20, batch_size=4)
    resumed.resume_from_checkpoint(state["consumed_train_samples"])
    rest = epoch_batches(resumed)
    assert seen + rest == full
    assert resumed.get_state() == {"consumed_train_samples": 20}


def test_resume_across_an_epoch_boundary() -> None:
    # 22 samples, batch 4, drop_last: 5 batches (20 samples) per epoch; 2 are dropped each epoch.
    reference = make_loader(n=22, batch_size=4)
    epochs = [epoch_batches(reference) for _ in range(4)]
    assert reference.get_state() == {"consumed_train_samples": 80}

    for consumed, epoch, skip in [(20, 1, 0), (24, 1, 1), (56, 2, 4), (40, 2, 0)]:
        resumed = make_loader(n=22, batch_size=4)
        resumed.resume_from_checkpoint(consumed)
        assert resumed.epoch == epoch
        resumed.set_epoch(epoch)  # a trainer's usual call keeps the resumed position
        assert epoch_batches(resumed) == epochs[epoch][skip:]
        assert epoch_batches(resumed) == epochs[epoch + 1]


def test_break_mid_epoch_then_iterate_again_continues() -> None:
    loader = make_loader(n=20, batch_size=4)
    full = epoch_batches(make_loader(n=20, batch_size=4))
    got = []
    for batch in loader:
        got.append(indices(batch))
        if len(got) == 2:
            break
    got += epoch_batches(loader)
    assert got == full


def test_set_epoch_starts_that_epoch_from_its_beginning() -> None:
    reference = make_loader(n=20, batch_size=4)
    epochs = [epoch_batches(reference) for _ in range(4)]
    loader = make_loader(n=20, batch_size=4)
    loader.resume_from_checkpoint(8)
    loader.set_epoch(3)
    assert loader.get_state() == {"consumed_train_samples": 60}
    assert epoch_batches(loader) == epochs[3]
    loader.set_epoch(0)
    assert epoch_batches(loader) == epochs[0]
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)


def test_two_simulated_ranks_split_each_global_batch_exactly_once() -> None:
    global_batches = epoch_batches(make_loader(n=24, batch_size=8))
    ranks = [make_loader(n=24, batch_size=8, device_mesh=Mesh(r, 2)) for r in range(2)]
    assert [r.local_batch_size for r in ranks] == [4, 4]
    per_rank = [epoch_batches(r) for r in ranks]
    for b, global_batch in enumerate(global_batches):
        assert per_rank[0][b] + per_rank[1][b] == global_batch  # contiguous slices, rank order
    assert all(r.get_state() == {"consumed_train_samples": 24} for r in ranks)
    assert len(ranks[0]) == len(global_batches) == 3


def test_mesh_methods_are_accepted_too() -> None:
    class MethodMesh:
        def data_rank(self) -> int:
            return 1

        def data_world_size(self) -> int:
            return 2

    loader = make_loader(n=8, batch_size=4, device_mesh=MethodMesh())
    assert (loader.dp_rank, loader.dp_world_size) == (1, 2)


def test_keeping_the_last_partial_batch_pads_it_across_ranks() -> None:
    # 9 samples, batch 4: batches of 4, 4 and 1; the lone last sample is padded to one per rank.
    single = make_loader(n=9, batch_size=4, drop_last=False)
    assert len(single) == 3
    batches = epoch_batches(single)
    assert [len(b) for b in batches] == [4, 4, 1]
    assert single.get_state() == {"consumed_train_samples": 9}

    order = single.epoch_order(0)
    ranks = [make_loader(n=9, batch_size=4, drop_last=False, device_mesh=Mesh(r, 2)) for r in range(2)]
    last = [epoch_batches(r)[-1] for r in ranks]
    assert last == [[order[8]], [order[0]]]  # rank 1 wraps around to the epoch's first sample
    assert all(r.get_state() == {"consumed_train_samples": 9} for r in ranks)


def test_invalid_arguments_name_the_field() -> None:
    with pytest.raises(
        ValueError, match=r"batch_size \(6\) must be divisible by the data-parallel world size \(4\)"
    ):
        make_loader(n=24, batch_size=6, device_mesh=Mesh(0, 4))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        make_loader(batch_size=0)
    with pytest.raises(ValueError, match=r"batch_size \(32\) is larger than the dataset"):
        make_loader(n=20, batch_size=32)
    with pytest.raises(ValueError, match="dataset is empty"):
        make_loader(n=0, batch_size=1, drop_last=False)
    with pytest.raises(ValueError, match="consumed_train_samples"):
        make_loader().resume_from_checkpoint(-1)
    with pytest.raises(ValueError, match="data_rank"):
        make_loader(device_mesh=object())


def test_state_dict_round_trip() -> None:
    loader = make_loader(n=20, batch_size=4)
    next(iter(loader))
    other = make_loader(n=20, batch_size=4)
    other.load_state_dict(loader.state_dict())
    assert epoch_batches(other) == epoch_batches(loader)


def test_with_a_tokenised_dataset(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from twinkle_core import assets
    from twinkle_core.dataset import Dataset

    assets.build_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    dataset = Dataset(
        assets.write_chat_dataset(tmp_path / "c.jsonl", n=10), tokenizer, cache_dir=tmp_path / "c"
    )
    batch = next(iter(DataLoader(dataset, batch_size=4)))
    lengths = batch["attention_mask"].sum(dim=1)
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] == int(lengths.max())
    for row, length in enumerate(lengths.tolist()):
        assert (batch["input_ids"][row, length:] == tokenizer.pad_token_id).all()
        assert (batch["labels"][row, length:] == -100).all()


def test_wrapped_around_padding_carries_no_labels() -> None:
    # 9 samples, batch 4, 2 ranks: the last global batch holds 1 real sample and 1 wrap-around copy.
    # An eval over these batches must count each sample once, so the copy's labels are all -100.
    ranks = [
        make_loader(n=9, batch_size=4, drop_last=False, shuffle=False, device_mesh=Mesh(r, 2))
        for r in range(2)
    ]
    labelled: list[int] = []
    for loader in ranks:
        batches = list(loader)
        for batch in batches:
            labelled += [int(row[0]) for row in batch["labels"] if int(row[0]) != -100]
        last = batches[-1]
        if loader.dp_rank == 1:
            assert indices(last) == [0] and last["labels"].tolist() == [[-100]]
    assert sorted(labelled) == list(range(9))
