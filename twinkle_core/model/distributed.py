"""The process group and device of this rank, initialised once per process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistInfo:
    """Join the torchrun process group (gloo on CPU, nccl on CUDA) when WORLD_SIZE > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=None)
    if dist.is_initialized():
        # The process group is the truth once it exists (a caller may have set it up itself).
        world_size, rank = dist.get_world_size(), dist.get_rank()
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor, op=op)
    return tensor
