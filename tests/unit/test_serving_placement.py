"""Where the serving host's transformers backend puts models over the devices it leased (a whole
model on the roomiest device, a spread over all of them when none holds it alone, a refusal
when all together do not), how it counts what a load really holds, and how many GPUs a vLLM
engine shards over. The devices are descriptors: choosing needs no CUDA; moving onto two GPUs is
tested in tests/integration/test_serving_multi_gpu.py (marker gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serving_host import copied_checkpoint

from serving.errors import LoadFailed
from serving.generation import TransformersBackend
from serving.loading import put_on_devices
from serving.placement import DevicePlacer, Placement, bytes_by_device
from serving.targets import Target
from serving.vllm_backend import tensor_parallel_size

GPU0, GPU1 = torch.device("cuda", 0), torch.device("cuda", 1)
CPU = torch.device("cpu")


def test_each_model_goes_whole_onto_the_device_with_the_most_room() -> None:
    placer = DevicePlacer({GPU0: 100, GPU1: 100})
    assert placer.choose("a", 60) == Placement(GPU0)
    assert placer.choose("b", 50) == Placement(GPU1)
    assert placer.choose("c", 40) == Placement(GPU1)  # 50 left there, 40 on the first
    assert placer.room() == {GPU0: 40, GPU1: 10}
    placer.removed("a")
    assert placer.choose("d", 90) == Placement(GPU0)


def test_a_model_no_device_holds_alone_is_spread_and_one_all_cannot_hold_is_refused() -> None:
    placer = DevicePlacer({GPU0: 100, GPU1: 100})
    placer.choose("a", 30)
    spread = placer.choose("big", 150)
    # accelerate's max_memory, by CUDA index: what each device has left; inputs on the first.
    assert spread == Placement(GPU0, {0: 70, 1: 100}) and spread.spread
    assert placer.room() == {GPU0: 0, GPU1: 20}
    with pytest.raises(LoadFailed, match=r"needs about .* 2 devices"):
        placer.choose("huge", 50 * 2**20)
    assert placer.room() == {GPU0: 0, GPU1: 20}  # a refusal reserves nothing
    spread = placer.choose("more", 20)
    assert spread == Placement(GPU1)


def test_a_host_with_one_device_puts_every_model_there() -> None:
    # The cache has made what room its bound allows; a model larger than the device still
    # gets its try (the load says if memory runs out).
    placer = DevicePlacer({CPU: 100})
    placer.choose("a", 80)
    assert placer.choose("b", 80) == Placement(CPU)


def test_the_backend_counts_what_a_load_holds_frees_it_and_keeps_nothing_of_a_failed_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    checkpoint = copied_checkpoint(tiny_model_dir, tmp_path)
    backend = TransformersBackend([CPU])
    capacity = backend.placer.capacity[CPU]
    loaded = backend.load(Target(str(checkpoint), checkpoint, None, "m"))
    assert loaded.bytes > 0 and capacity - backend.placer.room()[CPU] == loaded.bytes
    backend.release(loaded)
    assert backend.placer.room()[CPU] == capacity

    (checkpoint / "config.json").write_text("{ not json")
    with pytest.raises(LoadFailed):
        backend.load(Target("broken", checkpoint, None, "m"))
    assert backend.placer.room()[CPU] == capacity


def test_a_spread_too_tight_for_whole_layers_fails_before_anything_moves(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    total = sum(bytes_by_device(model).values())
    with pytest.raises(LoadFailed, match="does not fit on the devices"):
        put_on_devices(model, Placement(GPU0, {0: total // 4, 1: total // 4}))
    assert {p.device for p in model.parameters()} == {CPU}


@pytest.mark.parametrize(
    ("heads", "kv_heads", "gpus", "shards"),
    [
        (32, 8, 4, 4),  # all of them
        (32, 8, 3, 2),  # powers of two only
        (12, 4, 8, 4),  # 12 heads do not split 8 ways
        (32, 2, 8, 8),  # 2 KV heads replicated 4 times each
        (32, 6, 4, 2),  # 6 KV heads neither split 4 ways nor replicate evenly
        (None, None, 4, 1),
        (32, 8, 1, 1),
    ],
)
def test_a_vllm_engine_shards_over_as_many_gpus_as_the_model_splits_by(
    heads: int | None, kv_heads: int | None, gpus: int, shards: int
) -> None:
    assert tensor_parallel_size(heads, kv_heads, gpus) == shards
