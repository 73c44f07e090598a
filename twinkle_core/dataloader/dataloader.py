"""A resumable, data-parallel DataLoader with a deterministic order of its own.

Order: epoch `e` is a permutation of the dataset drawn from a private `torch.Generator` seeded
with `seed + e` (the global RNG is never touched, so creating or resuming a loader cannot shift
dropout or init). Global batch `b` is `permutation[b*B:(b+1)*B]` for the global batch size `B`;
data-parallel rank `r` takes the contiguous slice `[r*B/W, (r+1)*B/W)` of it.

Progress is one number, `consumed_train_samples` (global samples yielded so far, over all
epochs): the epoch is `consumed // samples_per_epoch` and the position inside it the remainder.
Saving it and passing it to `resume_from_checkpoint` continues at exactly the next sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data

from twinkle_core.dataloader.collate import IGNORE_INDEX, PadCollator, resolve_pad_token_id

Batch = Any


def data_parallel_coords(device_mesh: Any | None) -> tuple[int, int]:
    """(data-parallel rank, data-parallel world size): from the mesh, else torch.distributed, else (0, 1)."""
    if device_mesh is not None:
        rank = _attribute(device_mesh, "data_rank")
        world = _attribute(device_mesh, "data_world_size")
    elif dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"device_mesh: invalid data-parallel rank {rank} of world size {world}")
    return rank, world


def _attribute(mesh: Any, name: str) -> int:
    if not hasattr(mesh, name):
        raise ValueError(f"device_mesh must have a {name!r} attribute, got {type(mesh).__name__}")
    value = getattr(mesh, name)
    return int(value() if callable(value) else value)


@dataclass(frozen=True)
class _PlannedBatch:
    local_indices: list[int]
    global_samples: int  # real samples of the global batch this step consumes (padding excluded)
    padding: int = 0  # the last `padding` local samples repeat earlier ones (wrap-around)


class DataLoader:
    """Iterates local micro-batches of `dataset` for this data-parallel rank.

    Args:
        dataset: a sized, indexable dataset of `{'input_ids', 'labels'}` samples (e.g.
            `twinkle_core.dataset.Dataset`), or anything `collate_fn` understands.
        batch_size: the GLOBAL micro-batch size; each data-parallel rank gets
            `batch_size // dp_world_size` samples per step.
        device_mesh: where the data-parallel rank/size come from (duck-typed: `data_rank`,
            `data_world_size`); default torch.distributed's rank/world size, or a single process.
        shuffle: permute each epoch (seeded with `seed + epoch`); else dataset order.
        drop_last: drop the last, incomplete global batch of an epoch. If kept, it is padded by
            wrapping around the epoch's order to a multiple of the world size, so that every rank
            gets the same number of samples and collectives stay in step; the padding is not
            counted as consumed, and where a batch is a dict with `labels` the padded rows' labels
            are set to -100, so no sample is trained on or evaluated twice.
        collate_fn: turns a list of samples into a batch; default pads to the longest sample.
        pad_token_id: for the default collate; default the dataset tokenizer's pad (or eos) id.
        num_workers: worker processes loading samples (0: load in the training process).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        device_mesh: Any | None = None,
        shuffle: bool = True,
        seed: int = 42,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Batch] | None = None,
        pad_token_id: int | None = None,
        num_workers: int = 0,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.dp_rank, self.dp_world_size = data_parallel_coords(device_mesh)
        if batch_size % self.dp_world_size != 0:
            raise ValueError(
                f"batch_size ({batch_size}) must be divisible by the data-parallel world size "
                f"({self.dp_world_size})"
            )
        self.local_batch_size = batch_size // self.dp_world_size
        self.num_samples = len(dataset)
        if self.num_samples == 0:
            raise ValueError("dataset is empty")
        if drop_last and self.num_samples < batch_size:
            raise ValueError(
                f"batch_size ({batch_size}) is larger than the dataset ({self.num_samples} samples), "
                "so with drop_last=True there would be no batch at all"
            )
        self.collate_fn = collate_fn or PadCollator(resolve_pad_token_id(pad_token_id, dataset))
        self._consumed = 0

    # --- progress ----------------------------------------------------------------------------

    @property
    def samples_per_epoch(self) -> int:
        """Global samples one epoch consumes (a dropped last batch is not consumed)."""
        if self.drop_last:
            return (self.num_samples // self.batch_size) * self.batch_size
        return self.num_samples

    def __len__(self) -> int:
        """Global batches (optimizer micro-steps) per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    @property
    def epoch(self) -> int:
        return self._consumed // self.samples_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the loader is already inside that epoch (so a
        trainer that calls `set_epoch` after `resume_from_checkpoint` keeps the resumed position)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._consumed = epoch * self.samples_per_epoch

    def get_state(self) -> dict[str, int]:
        return {"consumed_train_samples": self._consumed}

    def resume_from_checkpoint(self, consumed_train_samples: int) -> None:
        """Continue after the first `consumed_train_samples` global samples (over all epochs)."""
        if (
            isinstance(consumed_train_samples, bool)
            or not isinstance(consumed_train_samples, int)
            or consumed_train_samples < 0
        ):
            raise ValueError(
                f"consumed_train_samples must be a non-negative integer, got {consumed_train_samples!r}"
            )
        self._consumed = consumed_train_samples

    def state_dict(self) -> dict[str, int]:
        return self.get_state()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_from_checkpoint(int(state["consumed_train_samples"]))

    # --- order -------------------------------------------------------------------------------

    def epoch_order(self, epoch: int) -> list[int]:
        """The dataset indices of `epoch` in the order all ranks consume them together."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def _local_slice(self, order: Sequence[int], start: int, end: int) -> tuple[list[int], int]:
        """This rank's indices of global batch [start, end), and how many of them are padding."""
        size = end - start
        if size < self.batch_size:
            # Incomplete last batch: pad to a multiple of the world size by wrapping around.
            size = math.ceil(size / self.dp_world_size) * self.dp_world_size
        per_rank = size // self.dp_world_size
        first = start + self.dp_rank * per_rank
        positions = range(first, first + per_rank)
        padding = sum(position >= end for position in positions)
        return [order[position % self.num_samples] for position in positions], padding

    def _plan_epoch(self) -> tuple[int, list[_PlannedBatch]]:
        epoch, position = divmod(self._consumed, self.samples_per_epoch)
        order = self.epoch_order(epoch)
        plan: list[_PlannedBatch] = []
        while position < self.samples_per_epoch:
            end = min(position + self.batch_size, self.samples_per_epoch)
            if end - position < self.batch_size and self.drop_last:
                break  # only after resuming at a count that is not a multiple of batch_size
            local, padding = self._local_slice(order, position, end)
            plan.append(_PlannedBatch(local, end - position, padding))
            position = end
        return epoch, plan

    # --- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch, starting at the consumed position."""
        epoch, plan = self._plan_epoch()
        return self._iterate(epoch, plan)

    def _iterate(self, epoch: int, plan: list[_PlannedBatch]) -> Iterator[Batch]:
        if self.num_workers == 0:
            batches: Iterator[Batch] = (
                self.collate_fn([self.dataset[i] for i in planned.local_indices]) for planned in plan
            )
        else:
            # The generator keeps torch's DataLoader from drawing its worker seed from the global RNG.
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)
            batches = iter(
                torch.utils.data.DataLoader(
                    self.dataset,
                    batch_sampler=[planned.local_indices for planned in plan],
                    collate_fn=self.collate_fn,
                    num_workers=self.num_workers,
                    generator=generator,
                )
            )
        for planned, batch in zip(plan, batches, strict=True):
            self._consumed += planned.global_samples
            yield _mask_padding(batch, planned.padding)
        self._consumed = (epoch + 1) * self.samples_per_epoch


def _mask_padding(batch: Batch, padding: int) -> Batch:
    """Padded rows (always the last of a rank's slice) carry no loss: labels -100."""
    if padding and isinstance(batch, dict) and isinstance(batch.get("labels"), torch.Tensor):
        labels = batch["labels"].clone()
        labels[-padding:] = IGNORE_INDEX
        batch = {**batch, "labels": labels}
    return batch
