"""The parts TransformersModel delegates to: OptimizerBundle and the Checkpointer contract.

End-to-end save/resume through the model is in test_model.py and the distributed tests; these
check the seams: what the bundle resolves and steps, that the model's former attributes still
read and write through to it, and that the model and its checkpointer form no reference cycle.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from twinkle_core.model import TransformersModel
from twinkle_core.model.checkpointer import CheckpointedModel, Checkpointer, HFCheckpointer
from twinkle_core.model.optim import OptimizerBundle, one_of, resolve_optimizer


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return list(torch.nn.Linear(4, 2).parameters())


def test_optimizer_names_and_classes_resolve() -> None:
    assert resolve_optimizer("adamw") is torch.optim.AdamW
    assert resolve_optimizer("SGD") is torch.optim.SGD
    assert resolve_optimizer("Adagrad") is torch.optim.Adagrad
    assert resolve_optimizer(torch.optim.Adam) is torch.optim.Adam
    for bad in ("nosuch", "lr_scheduler", int, 3):
        with pytest.raises(ValueError, match="optimizer"):
            resolve_optimizer(bad)
    assert one_of("optimizer", None, None, default="adamw") == "adamw"
    assert one_of("optimizer", "sgd", None, default="adamw") == "sgd"
    assert one_of("optimizer", None, torch.optim.SGD, default="adamw") is torch.optim.SGD
    with pytest.raises(ValueError, match="not both"):
        one_of("optimizer", "sgd", "adamw", default="adamw")


def test_a_bad_optimizer_name_fails_before_the_parameters_are_collected() -> None:
    bundle = OptimizerBundle()

    def params() -> list[torch.nn.Parameter]:
        raise AssertionError("collecting parameters wraps the model: must not happen for a bad name")

    with pytest.raises(ValueError, match=r"not a torch\.optim optimizer"):
        bundle.set_optimizer("nosuch", params)
    with pytest.raises(ValueError, match="no trainable parameters"):
        bundle.set_optimizer("sgd", list)
    assert bundle.optimizer is None


def test_the_bundle_steps_optimizer_then_scheduler() -> None:
    bundle = OptimizerBundle()
    assert bundle.current_lr() == 0.0
    bundle.zero_grad()  # no optimizer yet: nothing to clear
    with pytest.raises(ValueError, match="set_optimizer must come before set_lr_scheduler"):
        bundle.set_lr_scheduler("linear")
    with pytest.raises(ValueError, match="set_optimizer must come before stepping"):
        bundle.require_optimizer()
    params = _params()
    bundle.set_optimizer("sgd", lambda: params, lr=1.0)
    bundle.set_lr_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    before = params[0].detach().clone()
    loss = bundle.scale(params[0].sum() + params[1].sum())  # no scaler: the loss itself
    loss.backward()
    bundle.unscale_()
    bundle.step()
    assert torch.equal(params[0].detach(), before - 1.0)  # the step used lr 1.0, then it halved
    assert bundle.current_lr() == 0.5
    bundle.zero_grad()
    assert all(p.grad is None for p in params)
    with pytest.raises(ValueError, match="unknown scheduler"):
        bundle.set_lr_scheduler("no_such_schedule")
    with pytest.raises(ValueError, match="lr scheduler arguments"):
        bundle.set_lr_scheduler(torch.optim.lr_scheduler.StepLR, bogus=1)


def test_the_bundle_steps_through_the_grad_scaler() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    bundle = OptimizerBundle(scaler)
    params = _params()
    bundle.set_optimizer("sgd", lambda: params, lr=1.0)
    bundle.scale(params[1].sum()).backward()
    assert params[1].grad is not None and torch.equal(params[1].grad, torch.full_like(params[1], 4.0))
    bundle.unscale_()
    assert torch.equal(params[1].grad, torch.ones_like(params[1]))
    bundle.step()
    assert scaler.get_scale() == 4.0  # finite gradients: the scale stays until growth_interval


def test_model_attributes_delegate_to_the_bundle(tiny_model_dir: Path) -> None:
    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="no")
    assert model.optimizer is None and model.lr_scheduler is None and model.grad_scaler is None
    model.set_optimizer("sgd", lr=0.1)
    assert model.optimizer is not None and model.optimizer is model.optim.optimizer
    # Assignable as the plain attributes they were: the bundle steps what is assigned.
    replacement = torch.optim.SGD(model.optimizer.param_groups[0]["params"], lr=0.25)
    model.optimizer = replacement
    assert model.optim.optimizer is replacement and model.current_lr() == 0.25
    model.lr_scheduler = torch.optim.lr_scheduler.StepLR(replacement, step_size=1)
    assert model.optim.lr_scheduler is model.lr_scheduler
    # A RemoteHandle reads properties on every rank and plain attributes on rank 0: these stay
    # plain (not properties), as they were before the bundle.
    for name in ("optimizer", "lr_scheduler", "grad_scaler"):
        static = inspect.getattr_static(TransformersModel, name)
        assert not isinstance(static, property) and not callable(static), name


def test_the_model_and_its_checkpointer_hold_no_reference_cycle(tiny_model_dir: Path) -> None:
    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="no")
    model.set_optimizer("sgd", lr=0.1)
    assert isinstance(model.checkpointer, HFCheckpointer)
    ref = weakref.ref(model)
    gc.disable()  # freed by reference counting alone, as before the split
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


class RecordingCheckpointer:
    """A Checkpointer that records what the model asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def save(self, owner: CheckpointedModel, name: str, output_dir: str | Path, **kwargs: Any) -> str:
        self.calls.append(("save", {"name": name, **kwargs}))
        return str(Path(output_dir) / name)

    def resume(
        self, owner: CheckpointedModel, checkpoint_dir: str | Path, *, resume_only_model: bool
    ) -> dict[str, int]:
        self.calls.append(("resume", {"resume_only_model": resume_only_model}))
        return {"cur_step": 7, "consumed_train_samples": 56, "gradient_accumulation_steps": 2}

    def export(self, owner: CheckpointedModel, output_dir: str | Path, *, merged: bool) -> str:
        self.calls.append(("export", {"merged": merged}))
        return str(output_dir)


def test_the_model_delegates_checkpoints_and_applies_the_progress(tiny_model_dir: Path) -> None:
    model = TransformersModel(model_id=str(tiny_model_dir), mixed_precision="no")
    recorder = RecordingCheckpointer()
    checkpointer: Checkpointer = recorder  # the contract: a structural type
    model.checkpointer = checkpointer
    assert model.save("step-1", "out", save_optimizer=False) == str(Path("out") / "step-1")
    assert recorder.calls[-1] == (
        "save",
        {
            "name": "step-1",
            "save_optimizer": False,
            "consumed_train_samples": 0,
            "window_rng": None,  # outside a window: the checkpointer takes the current RNG
            "trainer_state_extra": None,
            "hf_weights": None,  # the checkpointer's default layout for the strategy
        },
    )
    assert model.resume_from_checkpoint("ckpt", resume_only_model=True)["cur_step"] == 7
    assert model.cur_step == 0  # only the weights: the counters start over
    assert model.resume_from_checkpoint("ckpt")["cur_step"] == 7
    assert (model.cur_step, model.gradient_accumulation_steps) == (7, 2)
    assert model.export("exported", merged=True) == "exported"
    assert recorder.calls[-1] == ("export", {"merged": True})
