"""DeviceMesh: sizes, world-size checks and the unsupported dimensions."""

from __future__ import annotations

import pytest

from twinkle_core import DeviceMesh


def test_from_sizes_fills_dp_from_the_world() -> None:
    mesh = DeviceMesh.from_sizes(fsdp_size=2, world_size=8)
    assert (mesh.dp_size, mesh.fsdp_size, mesh.world_size) == (4, 2, 8)
    assert DeviceMesh.from_sizes(dp_size=-1, world_size=2).dp_size == 2


def test_explicit_sizes_must_multiply_to_the_world_size() -> None:
    assert DeviceMesh.from_sizes(dp_size=2, fsdp_size=2, world_size=4).world_size == 4
    with pytest.raises(
        ValueError, match=r"dp_size \(2\) x fsdp_size \(2\) = 4 must equal the world size \(2\)"
    ):
        DeviceMesh.from_sizes(dp_size=2, fsdp_size=2, world_size=2)


def test_world_size_defaults_to_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert DeviceMesh.from_sizes(fsdp_size=4).dp_size == 1
    assert DeviceMesh.from_sizes(fsdp_size=2).dp_size == 2
    # Under a launcher a mismatch still fails, naming both numbers.
    with pytest.raises(
        ValueError, match=r"dp_size \(2\) x fsdp_size \(1\) = 2 must equal the world size \(4\)"
    ):
        DeviceMesh.from_sizes(dp_size=2)
    monkeypatch.delenv("WORLD_SIZE")
    assert DeviceMesh.from_sizes().world_size == 1


def test_outside_a_launcher_the_sizes_make_the_world(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ray driver is no torchrun rank: the seed's from_sizes(dp_size=2, fsdp_size=2) there asks for
    # four ranks (one actor each), whatever this process is.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    mesh = DeviceMesh.from_sizes(dp_size=2, fsdp_size=2)
    assert (mesh.dp_size, mesh.fsdp_size, mesh.world_size) == (2, 2, 4)
    assert DeviceMesh.from_sizes(fsdp_size=2).world_size == 2  # dp_size unset counts as 1
    assert DeviceMesh.from_sizes(dp_size=-1, fsdp_size=3).world_size == 3


@pytest.mark.parametrize("name", ["tp_size", "pp_size", "cp_size", "ep_size"])
def test_unsupported_parallelisms_are_rejected_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}=2 is not supported"):
        DeviceMesh.from_sizes(world_size=2, **{name: 2})


@pytest.mark.parametrize("kwargs", [{"dp_size": 0}, {"fsdp_size": 0}, {"dp_size": 1.5}])
def test_sizes_must_be_positive_integers(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        DeviceMesh(**kwargs)  # type: ignore[arg-type]


def test_fsdp_size_must_divide_the_world() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        DeviceMesh.from_sizes(fsdp_size=3, world_size=4)


def test_data_parallel_view_for_the_dataloader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    mesh = DeviceMesh(dp_size=1, fsdp_size=2)
    # FSDP ranks each read their own batches: the data world is the whole world.
    assert (mesh.data_rank, mesh.data_world_size) == (1, 2)
