"""The resumable data-parallel `DataLoader` (see twinkle_core.dataloader), as `twinkle.dataloader`."""

from twinkle_core.dataloader import DataLoader, PadCollator, data_parallel_coords

__all__ = ["DataLoader", "PadCollator", "data_parallel_coords"]
