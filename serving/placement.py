"""Where the transformers backend puts each model it loads, over the devices its host sees: the
GPUs it leased (serving/gpus.py), or the CPU.

A model goes whole onto the device with the most room left, so that a host with several GPUs keeps
more models warm and generates on them side by side. A model that fits on no device alone is
spread over all of them, whole decoder layers per device (accelerate's `dispatch_model`: a
pipeline without overlap, so slower per token than one device, but served); one that does not fit
on all of them together fails to load with the sizes named, rather than spilling onto the CPU.

A device's room is its capacity (80% of a GPU's memory, leaving the rest to activations and the
KV cache; half the RAM for the CPU) less the bytes of the models placed on it. The cache bounds
the total separately (`TWINKLE_SERVING_MEMORY_BYTES`), and evicts before a load; this only
chooses where. Loads may run two at a time, so a choice reserves its room until the load says
what it really took.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import torch

from serving.errors import LoadFailed

GPU_SHARE = 0.8


@dataclass(frozen=True)
class Placement:
    """The device a model's inputs go to (the whole model, or its first layers), and, for a model
    spread over several devices, the bytes it may take on each (accelerate's `max_memory`)."""

    device: torch.device
    max_memory: dict[int | str, int] | None = None

    @property
    def spread(self) -> bool:
        return self.max_memory is not None


def visible_devices() -> list[torch.device]:
    """Every GPU this process sees (after the lease set CUDA_VISIBLE_DEVICES), else the CPU."""
    if torch.cuda.is_available():
        return [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


def device_capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * GPU_SHARE)
    import psutil

    return int(psutil.virtual_memory().total // 2)


def bytes_by_device(model: torch.nn.Module) -> Counter[torch.device]:
    """The parameter and buffer bytes a loaded model holds on each device."""
    held: Counter[torch.device] = Counter()
    for tensor in [*model.parameters(), *model.buffers()]:
        held[tensor.device] += tensor.numel() * tensor.element_size()
    return held


def accelerate_key(device: torch.device) -> int | str:
    """A device as accelerate's device maps name it: the CUDA index, or "cpu"."""
    return device.index if device.type == "cuda" and device.index is not None else device.type


@dataclass
class DevicePlacer:
    capacity: dict[torch.device, int]
    _held: dict[str, Counter[torch.device]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_devices(cls, devices: list[torch.device]) -> DevicePlacer:
        return cls({device: device_capacity(device) for device in devices})

    @property
    def devices(self) -> list[torch.device]:
        return list(self.capacity)

    def room(self) -> dict[torch.device, int]:
        used: Counter[torch.device] = Counter()
        for held in self._held.values():
            used.update(held)
        return {device: self.capacity[device] - used[device] for device in self.capacity}

    def choose(self, key: str, estimate: int) -> Placement:
        """A placement for a model of about `estimate` bytes (0: unknown yet), with its room
        reserved under `key` until `placed` or `removed`."""
        with self._lock:
            room = self.room()
            roomiest = max(room, key=lambda device: room[device])
            if estimate <= room[roomiest] or len(room) == 1:
                # One device: always the choice on a host with a single one (the cache has made
                # what room the bound allows; the load itself tells if memory runs out).
                self._held[key] = Counter({roomiest: estimate})
                return Placement(roomiest)
            free = {device: max(0, left) for device, left in room.items()}
            if estimate > sum(free.values()):
                raise LoadFailed(
                    f"the model needs about {estimate // 2**20} MB and the {len(free)} devices of this "
                    f"host have {sum(free.values()) // 2**20} MB left for models "
                    f"({', '.join(f'{d}: {b // 2**20} MB' for d, b in free.items())})"
                )
            # Spread: first devices first, as accelerate fills them in order; inputs go to the
            # first device that takes a share.
            order = [device for device in self.capacity if free[device] > 0]
            self._held[key] = self._shares(estimate, order, free)
            return Placement(order[0], {accelerate_key(device): free[device] for device in order})

    @staticmethod
    def _shares(
        estimate: int, order: list[torch.device], free: dict[torch.device, int]
    ) -> Counter[torch.device]:
        shares: Counter[torch.device] = Counter()
        left = estimate
        for device in order:
            shares[device] = min(left, free[device])
            left -= shares[device]
        return shares

    def placed(self, key: str, model: torch.nn.Module) -> None:
        """The load of `key` finished: count what it really holds where."""
        held = Counter({d: size for d, size in bytes_by_device(model).items() if d in self.capacity})
        with self._lock:
            self._held[key] = held

    def removed(self, key: str) -> None:
        """The model of `key` was released, or its load failed."""
        with self._lock:
            self._held.pop(key, None)
