"""JobSpec: minimal specs resolve to full defaults; every bad field is named in the error."""

from __future__ import annotations

import json
import typing

import pytest
from pydantic import ValidationError

from twinkle_core.spec import JobSpec, ModelSection

MINIMAL = {"model": {"model_id": "/models/tiny"}, "data": {"train_file": "/data/train.jsonl"}}


def error_locs(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in err["loc"]) for err in exc.errors()]


def test_minimal_spec_resolves_every_section_with_defaults() -> None:
    spec = JobSpec.model_validate(MINIMAL)
    resolved = spec.model_dump()
    assert set(resolved) == {"model", "adapter", "data", "training", "optimizer", "scheduler", "resources"}
    assert resolved["model"]["mixed_precision"] == "bf16"
    assert resolved["model"]["strategy"] == "accelerate"
    assert resolved["model"]["model_cls"] == "AutoModelForCausalLM"
    assert resolved["training"]["gradient_accumulation_steps"] == 1
    assert resolved["resources"] == {
        "nnodes": 1,
        "nproc_per_node": 1,
        "launcher": "torchrun",
        "partition": None,
    }
    assert resolved["adapter"] is None


def test_model_section_mirrors_transformers_model_arguments() -> None:
    # The seed's constructor arguments, by name; `**kwargs` travels as `kwargs`.
    seed_args = {
        "model_cls",
        "model_id",
        "config",
        "device_mesh",
        "mixed_precision",
        "strategy",
        "ddp_config",
        "fsdp_config",
        "grad_scaler_config",
        "memory_efficient_init",
        "kwargs",
    }
    assert seed_args <= set(ModelSection.model_fields)
    precision = typing.get_args(ModelSection.model_fields["mixed_precision"].annotation)
    assert set(precision) == {"no", "fp8", "fp16", "bf16"}


def test_bad_precision_is_named() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**MINIMAL, "model": {"model_id": "x/y", "mixed_precision": "fp9"}})
    assert error_locs(exc.value) == ["model.mixed_precision"]


@pytest.mark.parametrize(
    "patch, loc",
    [
        ({"bogus": 1}, "bogus"),
        ({"training": {"max_stepz": 3}}, "training.max_stepz"),
        ({"resources": {"nproc_per_node": 0}}, "resources.nproc_per_node"),
        ({"optimizer": {"lr": -1}}, "optimizer.lr"),
    ],
)
def test_unknown_or_invalid_fields_are_named(patch: dict[str, object], loc: str) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**MINIMAL, **patch})
    assert loc in error_locs(exc.value)


def test_mesh_must_match_world_size() -> None:
    spec = {
        **MINIMAL,
        "model": {"model_id": "x/y", "device_mesh": {"dp_size": 2, "fsdp_size": 2}},
        "resources": {"nproc_per_node": 2},
        "training": {"batch_size": 4},
    }
    with pytest.raises(ValidationError, match="must equal the world size"):
        JobSpec.model_validate(spec)
    spec["resources"] = {"nproc_per_node": 4}
    assert JobSpec.model_validate(spec).model.device_mesh is not None


def test_batch_size_must_split_over_ranks() -> None:
    with pytest.raises(ValidationError, match="divisible"):
        JobSpec.model_validate({**MINIMAL, "resources": {"nproc_per_node": 3}, "training": {"batch_size": 8}})


def test_model_needs_id_or_config() -> None:
    with pytest.raises(ValidationError, match="model_id or config"):
        JobSpec.model_validate({"model": {}, "data": {"train_file": "a.jsonl"}})


def test_round_trip_through_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec.model_validate(MINIMAL)
    spec.dump(tmp_path / "spec.json")
    assert JobSpec.load(tmp_path / "spec.json") == spec
    assert json.loads((tmp_path / "spec.json").read_text())["model"]["model_id"] == "/models/tiny"


def test_the_launcher_is_torchrun_ray_or_slurm_on_any_number_of_nodes() -> None:
    ray = JobSpec.model_validate({**MINIMAL, "resources": {"launcher": "ray", "nproc_per_node": 2}})
    assert ray.resources.launcher == "ray"
    with pytest.raises(ValidationError) as bad:
        JobSpec.model_validate({**MINIMAL, "resources": {"launcher": "mpirun"}})
    assert error_locs(bad.value) == ["resources.launcher"]
    # One torchrun per node of a Ray placement group (worker.ray_gang).
    multi = JobSpec.model_validate({**MINIMAL, "resources": {"nnodes": 2, "launcher": "ray"}})
    assert multi.resources.world_size == 2
    # Slurm: a partition, for Slurm jobs only (docs/scale.md).
    slurm = JobSpec.model_validate(
        {**MINIMAL, "resources": {"nnodes": 2, "launcher": "slurm", "partition": "gpu"}}
    )
    assert slurm.resources.partition == "gpu"
    with pytest.raises(ValidationError) as bad:
        JobSpec.model_validate({**MINIMAL, "resources": {"partition": "gpu"}})
    assert error_locs(bad.value) == ["resources"]


def test_precision_by_strategy_is_one_rule_for_spec_and_library() -> None:
    # The API, `jobs validate` (both JobSpec) and TransformersModel read twinkle_core.options.
    from twinkle_core.options import PRECISIONS_BY_STRATEGY, check_precision_for_strategy

    base = {"model": {"model_id": "org/m"}, "data": {"train_file": "file-1"}}
    for strategy, allowed in PRECISIONS_BY_STRATEGY.items():
        for precision in ("no", "fp8", "fp16", "bf16"):
            spec = {
                **base,
                "model": {"model_id": "org/m", "strategy": strategy, "mixed_precision": precision},
            }
            if precision in allowed:
                JobSpec.model_validate(spec)
                check_precision_for_strategy(precision, strategy)
                continue
            with pytest.raises(ValidationError) as excinfo:
                JobSpec.model_validate(spec)
            error = excinfo.value.errors()[0]
            assert error["loc"] == ("model", "strategy")
            assert (
                f"mixed_precision '{precision}' is not supported by the '{strategy}' strategy" in error["msg"]
            )
            with pytest.raises(ValueError, match="is not supported by the"):
                check_precision_for_strategy(precision, strategy)
    assert "fp8" not in PRECISIONS_BY_STRATEGY["native_fsdp"]


def test_samples_need_sample_every_and_prompts_together() -> None:
    def training(**values: object) -> dict[str, object]:
        return {**MINIMAL, "training": values}

    spec = JobSpec.model_validate(training(sample_every=100, sample_prompts=["Say hi"]))
    assert spec.training.sample_max_new_tokens == 64
    resolved = JobSpec.model_validate(MINIMAL).training
    assert (resolved.sample_every, resolved.sample_prompts) == (None, [])  # off by default
    cases: list[tuple[dict[str, object], str, str]] = [
        ({"sample_every": 100}, "training.sample_prompts", "needs at least one prompt"),
        ({"sample_every": 100, "sample_prompts": []}, "training.sample_prompts", "needs at least one prompt"),
        ({"sample_prompts": ["Say hi"]}, "training.sample_prompts", "only with sample_every"),
        ({"sample_every": 0, "sample_prompts": ["Say hi"]}, "training.sample_every", "greater than or equal"),
        ({"sample_every": 1, "sample_prompts": ["p"] * 9}, "training.sample_prompts", "at most 8"),
        ({"sample_every": 1, "sample_prompts": [""]}, "training.sample_prompts.0", "at least 1 character"),
        ({"sample_every": 1, "sample_prompts": ["x" * 2001]}, "training.sample_prompts.0", "at most 2000"),
        (
            {"sample_every": 1, "sample_prompts": ["p"], "sample_max_new_tokens": 0},
            "training.sample_max_new_tokens",
            "",
        ),
        (
            {"sample_every": 1, "sample_prompts": ["p"], "sample_max_new_tokens": 513},
            "training.sample_max_new_tokens",
            "",
        ),
    ]
    for values, loc, message in cases:
        with pytest.raises(ValidationError, match=message) as exc:
            JobSpec.model_validate(training(**values))
        assert error_locs(exc.value) == [loc], values
