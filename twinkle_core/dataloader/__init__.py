"""The resumable, data-parallel DataLoader used by training jobs."""

from twinkle_core.dataloader.collate import PadCollator
from twinkle_core.dataloader.dataloader import DataLoader, data_parallel_coords
from twinkle_core.remote import remote_class
from twinkle_core.remote.data import sharded_dataloader

# Ray mode: DataLoader(..., remote_group=...) runs once in the driver and feeds the group's ranks.
# (The decorator changes the class in place.)
remote_class(execute="driver", driver_factory=sharded_dataloader)(DataLoader)

__all__ = ["DataLoader", "PadCollator", "data_parallel_coords"]
