"""OptimizerBundle: the optimizer, its LR scheduler and the fp16 gradient scaler of one model.

The three are stepped together and only together (scaler -> optimizer -> scheduler), so they live
in one small object that the model wrapper delegates to; the checkpointer saves and restores each
of them. Names and classes the user gives (`'adamw'`, `torch.optim.SGD`, `'cosine'`, a torch
LRScheduler class) are resolved here, with a ValueError for anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

# Lower-case names accepted for the common optimizers (any other torch.optim class name works too).
_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


class OptimizerBundle:
    def __init__(self, grad_scaler: torch.amp.GradScaler | None = None) -> None:
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None  # a torch LRScheduler (transformers' schedules are LambdaLR)
        self.grad_scaler = grad_scaler  # only under mixed_precision='fp16'

    def set_optimizer(
        self, optimizer: Any, params: Callable[[], Iterable[torch.nn.Parameter]], **kwargs: Any
    ) -> None:
        """Build `optimizer` (a class or its name) over `params()` with `kwargs`.

        `params` is called only once the name resolved: collecting them wraps the model for its
        strategy, which cannot be undone, so a misspelt optimizer must fail before that."""
        resolved = resolve_optimizer(optimizer)
        trainable = list(params())
        if not trainable:
            raise ValueError("the model has no trainable parameters")
        try:
            self.optimizer = resolved(trainable, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"optimizer arguments: {exc}") from exc

    def set_lr_scheduler(self, scheduler: Any, **kwargs: Any) -> None:
        """A transformers schedule name (keywords of `transformers.get_scheduler`) or a torch
        LRScheduler class (its own keywords)."""
        if self.optimizer is None:
            raise ValueError("set_optimizer must come before set_lr_scheduler")
        try:
            if isinstance(scheduler, str):
                from transformers import get_scheduler
                from transformers.trainer_utils import SchedulerType

                names = {s.value for s in SchedulerType}
                if scheduler not in names:
                    raise ValueError(f"unknown scheduler {scheduler!r} (known: {sorted(names)})")
                self.lr_scheduler = get_scheduler(scheduler, optimizer=self.optimizer, **kwargs)
            else:
                self.lr_scheduler = scheduler(self.optimizer, **kwargs)
        except TypeError as exc:
            raise ValueError(f"lr scheduler arguments: {exc}") from exc

    def require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise ValueError("set_optimizer must come before stepping")
        return self.optimizer

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: scaled under fp16 so small gradients survive."""
        return self.grad_scaler.scale(loss) if self.grad_scaler is not None else loss

    def unscale_(self) -> None:
        """Bring fp16-scaled gradients back to their true size (before rescaling or clipping)."""
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.require_optimizer())

    def step(self) -> None:
        """Optimizer step (through the grad scaler under fp16, which may skip it), then the scheduler."""
        assert self.optimizer is not None
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def current_lr(self) -> float:
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])


def one_of(what: str, positional: Any, keyword: Any, default: str) -> Any:
    """The class or name given positionally or as `<what>_cls=`; both at once is ambiguous."""
    if positional is not None and keyword is not None:
        raise ValueError(
            f"{what}: pass the class or name once, positionally or as {what}_cls=, not both "
            f"(got {positional!r} and {what}_cls={keyword!r})"
        )
    chosen = keyword if keyword is not None else positional
    return default if chosen is None else chosen


def resolve_optimizer(optimizer: Any) -> type[torch.optim.Optimizer]:
    if isinstance(optimizer, str):
        name = _OPTIMIZERS.get(optimizer.lower(), optimizer)
        resolved = getattr(torch.optim, name, None)
        if not isinstance(resolved, type) or not issubclass(resolved, torch.optim.Optimizer):
            raise ValueError(f"optimizer {optimizer!r} is not a torch.optim optimizer")
        return resolved
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer
    raise ValueError(f"optimizer must be a torch.optim.Optimizer class or its name, got {optimizer!r}")
