"""Two real gloo processes: the DataLoader takes its rank from torch.distributed, the ranks' local
batches together form each global batch exactly once, and both ranks building the same Dataset
at once tokenise it only once (the other waits on the cache lock and loads the result)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow

WORLD_SIZE = 2
GLOBAL_BATCH = 6
NUM_SAMPLES = 30


class IndexDataset:
    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": [index], "labels": [index]}


def _rank_main(rank: int, work_dir: str, tokenizer_dir: str, data_file: str) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"file://{work_dir}/rendezvous", rank=rank, world_size=WORLD_SIZE
    )
    try:
        from transformers import AutoTokenizer

        from twinkle_core.dataloader import DataLoader
        from twinkle_core.dataset import Dataset

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        dist.barrier()  # both ranks reach the cache at about the same time
        dataset = Dataset(data_file, tokenizer, cache_dir=f"{work_dir}/cache")

        loader = DataLoader(IndexDataset(), batch_size=GLOBAL_BATCH, pad_token_id=0)
        batches = [batch["input_ids"][:, 0].tolist() for batch in loader]

        # The ranks stay in step: every rank sees the same number of global batches of the same size.
        counts = [None] * WORLD_SIZE
        dist.all_gather_object(counts, (len(batches), loader.get_state()["consumed_train_samples"]))
        result = {
            "rank": (loader.dp_rank, loader.dp_world_size),
            "batches": batches,
            "counts": counts,
            "loaded_from_cache": dataset.loaded_from_cache,
            "first_sample": dataset[0],
        }
        Path(work_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_cover_each_global_batch_once(tmp_path: Path) -> None:
    from twinkle_core import assets
    from twinkle_core.dataloader import DataLoader

    tokenizer_dir = tmp_path / "tokenizer"
    assets.build_tokenizer(tokenizer_dir)
    data_file = assets.write_chat_dataset(tmp_path / "chat.jsonl", n=40)

    # spawn, not fork: forking a test process that may hold other threads (tokenizers' pool, servers
    # of earlier tests) risks a deadlocked child; a fresh interpreter costs a few seconds of imports.
    mp.spawn(
        _rank_main,
        args=(str(tmp_path), str(tokenizer_dir), str(data_file)),
        nprocs=WORLD_SIZE,
        join=True,
    )

    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert [r["rank"] for r in results] == [[0, 2], [1, 2]]

    expected = [
        batch["input_ids"][:, 0].tolist()
        for batch in DataLoader(IndexDataset(), GLOBAL_BATCH, pad_token_id=0)
    ]
    assert len(expected) == NUM_SAMPLES // GLOBAL_BATCH
    for b, global_batch in enumerate(expected):
        local = [results[r]["batches"][b] for r in range(WORLD_SIZE)]
        assert all(len(part) == GLOBAL_BATCH // WORLD_SIZE for part in local)
        assert sorted(local[0] + local[1]) == sorted(global_batch)
        assert local[0] + local[1] == global_batch
    assert results[0]["counts"] == [[5, 30], [5, 30]]

    # One rank tokenised, the other found the finished cache entry; both hold the same tokens.
    assert sorted(r["loaded_from_cache"] for r in results) == [False, True]
    assert results[0]["first_sample"] == results[1]["first_sample"]
    assert torch.tensor(results[0]["first_sample"]["labels"]).ne(-100).any()
