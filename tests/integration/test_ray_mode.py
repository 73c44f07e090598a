"""Ray mode on a local Ray cluster started here (CPU, 2 actors): the seed's example as a Ray driver
script trains, saves and resumes bitwise exactly (against an uninterrupted Ray run and against
torchrun); a dead actor makes the next call fail naming its rank instead of hanging; and after an
actor killed mid-training, a new model in the same remote group resumes from the last checkpoint
and ends bitwise equal to the uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dist_scripts.launch import REPO_ROOT, torch_env, torchrun

ray = pytest.importorskip(
    "ray", reason="ray is not installed (optional group: pip install 'twinkle-jobs[ray]')"
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SCRIPT = str(REPO_ROOT / "cookbook" / "ray" / "seed_usage.py")
ADAPTER_FILE = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray instance with 2 CPUs, no dashboard and a small object store, for this module."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a loopback test cluster needs no token
    context = ray.init(
        num_cpus=2,
        num_gpus=0,
        include_dashboard=False,
        object_store_memory=100 * 1024**2,
        log_to_driver=False,
    )
    try:
        yield context.address_info["gcs_address"]
    finally:
        from twinkle_core.remote import shutdown

        shutdown()
        ray.shutdown()


def run_driver(args: list[str], address: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**torch_env(), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    command = [sys.executable, SCRIPT, "--address", address, *args]
    return subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


COMMON_ARGS = ["--max-steps", "4", "--save-every", "2"]


@pytest.fixture(scope="module")
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path, ray_address: str
) -> Path:
    """The seed example run once as a Ray driver, start to end: the reference of this module."""
    output = tmp_path_factory.mktemp("ray-uninterrupted")
    args = ["--model-id", str(tiny_model_dir), "--data", str(text_dataset), *COMMON_ARGS]
    whole = run_driver([*args, "--output-dir", str(output)], ray_address)
    assert whole.returncode == 0, whole.stderr[-5000:]
    assert "step 4: loss" in whole.stdout and "stopped at step 4" in whole.stdout
    return output


def load_seed_usage() -> object:
    """The cookbook script as a module (its build / resume / train functions)."""
    spec = importlib.util.spec_from_file_location("seed_usage", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adapter_weights(checkpoint: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return dict(load_file(str(checkpoint / ADAPTER_FILE)))


def assert_bitwise_equal(a: dict[str, object], b: dict[str, object]) -> None:
    import torch

    assert a.keys() == b.keys() and a
    different = [k for k in a if not torch.equal(a[k], b[k])]  # type: ignore[arg-type]
    assert not different, f"tensors differ: {different[:5]}"


def test_seed_example_resumes_exactly_in_ray_and_matches_torchrun(
    tmp_path: Path, tiny_model_dir: Path, text_dataset: Path, ray_address: str, uninterrupted: Path
) -> None:
    common = ["--model-id", str(tiny_model_dir), "--data", str(text_dataset), *COMMON_ARGS]

    interrupted = tmp_path / "interrupted"
    first = run_driver([*common, "--output-dir", str(interrupted), "--stop-at", "2"], ray_address)
    assert first.returncode == 0, first.stderr[-5000:]
    assert "stopped at step 2" in first.stdout and not (interrupted / "final").exists()
    second = run_driver([*common, "--output-dir", str(interrupted), "--resume"], ray_address)
    assert second.returncode == 0, second.stderr[-5000:]
    assert "at step 2" in second.stdout
    assert [line.split(":")[0] for line in second.stdout.splitlines() if line.startswith("step ")] == [
        "step 3",
        "step 4",
    ]

    local = torchrun([SCRIPT, "--mode", "local", *common, "--output-dir", str(tmp_path / "torchrun")])
    assert local.returncode == 0, local.stderr[-5000:]

    ray_losses = json.loads((uninterrupted / "losses-ray.json").read_text())
    assert json.loads((tmp_path / "torchrun" / "losses-local.json").read_text()) == ray_losses
    resumed_losses = json.loads((interrupted / "losses-ray.json").read_text())
    assert resumed_losses == {k: v for k, v in ray_losses.items() if int(k) > 2}

    reference = adapter_weights(uninterrupted / "final")
    assert_bitwise_equal(adapter_weights(interrupted / "final"), reference)
    assert_bitwise_equal(adapter_weights(tmp_path / "torchrun" / "final"), reference)
    # And training changed them (LoRA's B starts at zero).
    from safetensors.torch import load_file

    assert any(v.abs().sum() > 0 for k, v in load_file(str(interrupted / "final" / ADAPTER_FILE)).items())


def test_calls_split_gather_and_a_dead_rank_is_named(tiny_model_dir: Path, ray_address: str) -> None:
    import torch

    import twinkle_core
    from twinkle_core import DeviceMesh
    from twinkle_core.model import TransformersModel
    from twinkle_core.remote.group import RemoteRankError

    twinkle_core.initialize(mode="ray", seed=0)
    mesh = DeviceMesh(dp_size=2, fsdp_size=1)
    model = TransformersModel(
        model_id=str(tiny_model_dir), device_mesh=mesh, remote_group="dies", mixed_precision="no"
    )
    assert "TransformersModel" in repr(model) and model.device_mesh == mesh
    # One placement-group bundle per rank of the mesh, each with the group's default resources.
    handle: Any = model  # a RemoteHandle in Ray mode
    table = ray.util.placement_group_table(handle._group._placement_group)
    assert table["strategy"] == "PACK" and table["state"] == "CREATED"
    assert list(table["bundles"].values()) == [{"CPU": 1.0}] * mesh.world_size
    with pytest.raises(ValueError, match=r"not a torch\.optim optimizer") as raised:
        model.set_optimizer("no-such-optimizer")  # raised in the actors, re-raised here as ValueError
    assert "of remote group 'dies'" in " ".join(getattr(raised.value, "__notes__", []))
    model.set_optimizer("adamw", lr=1e-3)

    # A plain dict of tensors: rows 0-1 go to rank 0, rows 2-3 to rank 1.
    ids = torch.arange(4 * 8).reshape(4, 8) % 300
    per_rank = model.forward_backward(inputs={"input_ids": ids, "labels": ids.clone()})
    assert isinstance(per_rank, list) and len(per_rank) == 2 and per_rank[0]["num_tokens"] == 2 * 7
    result = model.clip_grad_and_step(gradient_accumulation_steps=1)  # the same on both ranks
    assert isinstance(result, dict) and result["step"] == 1 and result["num_tokens"] == 4 * 7
    assert model.cur_step == 1  # an instance attribute, read from rank 0
    with pytest.raises(ValueError, match="not divisible"):
        model.forward_backward(inputs={"input_ids": ids[:3], "labels": ids[:3]})

    os.kill(model.remote_pids[1], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RemoteRankError, match=r"rank 1 of remote group 'dies'.*died"):
        model.forward_backward(inputs={"input_ids": ids, "labels": ids.clone()})
    assert time.monotonic() - started < 60
    with pytest.raises(RemoteRankError, match="rank 1"):
        model.clip_grad_and_step()  # the group stays failed, it does not hang either


def test_after_a_killed_actor_a_new_model_in_the_group_resumes_bitwise_equal(
    tmp_path: Path, tiny_model_dir: Path, text_dataset: Path, ray_address: str, uninterrupted: Path
) -> None:
    """This test process is the driver: the cookbook's own build / train / resume, with rank 1's
    actor SIGKILLed right after step 3 (the last checkpoint is step 2's)."""
    import twinkle_core
    from twinkle_core.remote import shutdown
    from twinkle_core.remote.group import RemoteRankError

    seed_usage: Any = load_seed_usage()
    model_id, data = str(tiny_model_dir), str(text_dataset)
    twinkle_core.initialize(mode="ray", seed=42)  # the script's default seed
    try:
        model, dataloader = seed_usage.build(model_id, data, 2, 4)
        first_pids = model.remote_pids
        killed: list[int] = []

        def kill_rank_1(step: int) -> None:
            if step == 3:
                os.kill(first_pids[1], signal.SIGKILL)
                killed.append(step)

        started = time.monotonic()
        with pytest.raises(RemoteRankError, match=r"rank 1 of remote group 'actor'.*died") as raised:
            seed_usage.train(model, dataloader, tmp_path, 4, 2, on_step=kill_rank_1)
        assert killed == [3] and raised.value.rank == 1 and time.monotonic() - started < 300
        assert not (tmp_path / "final").exists()

        # Continue as docs/ray.md says: a new model in the same remote group, from the checkpoint.
        model, dataloader = seed_usage.build(model_id, data, 2, 4)
        assert model.remote_group == "actor" and not set(model.remote_pids) & set(first_pids)
        assert seed_usage.resume(model, dataloader, tmp_path / seed_usage.CHECKPOINT) == 2
        losses = seed_usage.train(model, dataloader, tmp_path, 4, 2)
    finally:
        shutdown()
    reference_losses = json.loads((uninterrupted / "losses-ray.json").read_text())
    assert {str(k): v for k, v in losses.items()} == {k: v for k, v in reference_losses.items() if int(k) > 2}
    assert_bitwise_equal(adapter_weights(tmp_path / "final"), adapter_weights(uninterrupted / "final"))
