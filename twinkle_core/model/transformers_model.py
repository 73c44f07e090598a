"""TransformersModel: a transformers causal LM trained with DDP or FSDP2, with exact resume.

Lifecycle: construct (validates every argument, loads or initialises the weights) -> optionally
`add_adapter_to_model` -> `set_optimizer` (wraps the model for its strategy) -> `forward_backward`
+ `clip_grad_and_step` per micro-batch -> `save` / `resume_from_checkpoint`.

Loss normalisation: each micro-batch contributes the *sum* of its token losses, so that N
micro-batches of an accumulation window weigh every token equally, exactly like one batch N times
larger. The backward pass runs on that sum and the optimizer step multiplies the gradients by
world_size / window_tokens (the window's token count over every rank), which makes the gradient
the token mean over the whole window and every rank (applied in the same pass as the clipping
coefficient). The window's loss and token totals are
summed over the ranks by one all-reduce, started after the last micro-batch's forward pass and
in flight during its backward pass: the only collective the token weighting adds to a step.
Under fp16 the backward pass divides by the global token count of the window's first micro-batch
instead (reduced during its forward pass), because fp16 gradients of a token sum would overflow
where those of a mean do not.

The wrapper owns the model, its strategy and the accumulation window; the optimizer, scheduler and
grad scaler live in an `OptimizerBundle` (`optim.py`) and checkpoints are written and read by a
`Checkpointer` (`checkpointer.py`). Their former attributes and methods here delegate to them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from twinkle_core import checkpoint as ckpt
from twinkle_core.hub import resolve_model_id
from twinkle_core.mesh import DeviceMesh
from twinkle_core.model import adapters, state_io
from twinkle_core.model.checkpointer import Checkpointer, HFCheckpointer, looks_like_checkpoint
from twinkle_core.model.distributed import DistInfo, all_reduce_, barrier, init_distributed
from twinkle_core.model.loading import build_config, load_model, load_tokenizer, resolve_model_cls
from twinkle_core.model.optim import OptimizerBundle, one_of
from twinkle_core.model.precision import (
    autocast,
    check_fp8_layers,
    check_precision,
    convert_to_fp8,
    make_grad_scaler,
)
from twinkle_core.model.strategies import Strategy, make_strategy

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
_NON_MODEL_KEYS = frozenset({"labels", "num_tokens"})


@dataclass
class _Window:
    """Bookkeeping of the current gradient-accumulation window on this rank."""

    micro_batches: int = 0
    loss_sum: float = 0.0
    tokens: int = 0
    # What the backward pass multiplied the token-loss sum by, and the numerator of the step's
    # gradient factor (numerator / window tokens): 1 and world_size, or under fp16
    # world_size / first_tokens and first_tokens (the first micro-batch's global token count).
    loss_multiplier: float = 1.0
    grad_numerator: float = 1.0
    reduced: bool = False  # the window's totals are summed and its gradient factor is known
    # What the gradients still have to be multiplied by to be the window's token mean: applied
    # together with the clipping coefficient (one pass over the gradients), or before the step.
    grad_factor: float = 1.0
    global_loss: float | None = None
    global_tokens: int = 0
    totals: torch.Tensor | None = None  # [loss sum, tokens] of the window, summed over the ranks
    totals_reduction: Any = None  # the all-reduce of `totals` in flight
    totals_micro_batches: int = 0  # how many micro-batches `totals` covers
    rng: dict[str, Any] | None = None  # this rank's RNG state when the window began (for `save`)


def _start_all_reduce(tensor: torch.Tensor) -> Any:
    """An asynchronous SUM all-reduce (None in a single process, where there is nothing to sum)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return dist.all_reduce(tensor, async_op=True)
    return None


def _local_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The local shards of DTensors (FSDP2), the tensors themselves otherwise: an elementwise
    in-place op on them is one on the DTensors, without DTensor's per-op dispatch."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def _model_files(model_id: str) -> tuple[Path, Path]:
    """The directory `model_id` names and where its HF files are: itself, or for a complete
    checkpoint `twinkle_core.checkpoint.hf_model_dir` (a sharded one consolidated on first use)."""
    path = resolve_model_id(model_id)
    return path, (ckpt.hf_model_dir(path) if ckpt.is_complete(path) else path)


def _decoding_arguments(module: nn.Module) -> tuple[str, dict[str, Any]]:
    """The KV-cache argument name of the causal LM under `module` (peft's base model, if any):
    `cache` since transformers 5.2x, `past_key_values` before and in remote-code models; and
    `logits_to_keep=1` where it is taken (a prompt batch's full logits can be large)."""
    get_base = getattr(module, "get_base_model", None)
    base = get_base() if callable(get_base) else module
    parameters = inspect.signature(base.forward).parameters
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    return cache_name, ({"logits_to_keep": 1} if "logits_to_keep" in parameters else {})


T = TypeVar("T")


class _OptimAttribute(Generic[T]):
    """`model.optimizer`, `.lr_scheduler`, `.grad_scaler`: the OptimizerBundle's attribute of the
    same name, readable and assignable on the model as before the bundle existed.

    A plain descriptor, not a `property`, on purpose: a RemoteHandle reads properties on every
    rank (they may run collectives) but plain attributes from rank 0, as these always were."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _OptimAttribute[T]: ...
    @overload
    def __get__(self, obj: TransformersModel, objtype: type | None = None) -> T: ...
    def __get__(self, obj: TransformersModel | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.optim, self.name)

    def __set__(self, obj: TransformersModel, value: T) -> None:
        setattr(obj.optim, self.name, value)


class TransformersModel:
    optimizer: _OptimAttribute[torch.optim.Optimizer | None] = _OptimAttribute()
    lr_scheduler: _OptimAttribute[Any] = _OptimAttribute()
    grad_scaler: _OptimAttribute[torch.amp.GradScaler | None] = _OptimAttribute()

    def __init__(
        self,
        model_cls: Any = AutoModelForCausalLM,
        model_id: str | None = None,
        config: PretrainedConfig | dict[str, Any] | None = None,
        device_mesh: DeviceMesh | None = None,
        mixed_precision: str = "bf16",
        strategy: str = "accelerate",
        ddp_config: dict[str, Any] | None = None,
        fsdp_config: dict[str, Any] | None = None,
        grad_scaler_config: dict[str, Any] | None = None,
        memory_efficient_init: bool = False,
        remote_group: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.info: DistInfo = init_distributed()
        check_precision(mixed_precision, self.info.device)
        self.mixed_precision = mixed_precision
        if remote_group is not None:
            # The seed runs models in Ray actor groups; twinkle_core runs in-process under torchrun.
            logger.warning("remote_group=%r ignored: TransformersModel runs in this process", remote_group)
        if device_mesh is None:
            device_mesh = DeviceMesh.from_sizes(world_size=self.info.world_size)
        if not isinstance(device_mesh, DeviceMesh):
            raise ValueError(f"device_mesh must be a twinkle.DeviceMesh, got {type(device_mesh).__name__}")
        device_mesh.check_world_size(self.info.world_size)
        self.device_mesh = device_mesh
        if not isinstance(memory_efficient_init, bool):
            raise ValueError("memory_efficient_init must be a bool")
        self.strategy: Strategy = make_strategy(
            strategy, device_mesh, self.info, mixed_precision, ddp_config, fsdp_config, memory_efficient_init
        )
        self.optim = OptimizerBundle(
            make_grad_scaler(mixed_precision, grad_scaler_config, self.info.device, self.strategy.sharded)
        )
        self.model_cls = resolve_model_cls(model_cls)
        self.model_dir = self._resolve_model_dir(model_id)
        self.config = build_config(config, self.model_dir)
        on_meta = memory_efficient_init and not self.info.is_main
        self.model: nn.Module = load_model(self.model_cls, self.model_dir, self.config, kwargs, on_meta)
        if mixed_precision == "fp8":
            check_fp8_layers(self.model)  # at construction: a model fp8 cannot speed up is an error
        self.tokenizer: Any = load_tokenizer(self.model_dir)
        self._wrapped: nn.Module | None = None
        self.adapter_names: list[str] = []
        self.train_adapter: str | None = None
        self.cur_step = 0
        self.gradient_accumulation_steps = 1
        self._window = _Window()
        self.checkpointer: Checkpointer = HFCheckpointer()

    # ----------------------------------------------------------------- construction helpers
    def _resolve_model_dir(self, model_id: str | None) -> Path | None:
        if model_id is None:
            return None
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"model_id must be a non-empty string, got {model_id!r}")
        # One download per node: local rank 0 fetches into the cache (and consolidates a sharded
        # checkpoint), the others then find it there.
        if self.info.local_rank == 0:
            path, weights = _model_files(model_id)
        barrier()
        if self.info.local_rank != 0:
            path, weights = _model_files(model_id)
        if looks_like_checkpoint(path) and not ckpt.is_complete(path):
            raise ValueError(
                f"model_id {model_id}: an incomplete checkpoint (no {ckpt.COMPLETE_MARKER} marker, or a "
                "temporary .tmp-/.old- directory) is never loaded"
            )
        path = weights
        if (path / state_io.ADAPTER_WEIGHTS).exists() and not (path / "config.json").exists():
            raise ValueError(
                f"model_id {model_id} is a LoRA checkpoint: build the base model and call "
                "resume_from_checkpoint on it"
            )
        return path

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The tokenizer saved into checkpoints (default: the one stored with `model_id`)."""
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer

    @property
    def wrapped(self) -> nn.Module:
        """The model as the strategy wraps it (DDP module, or the FSDP2-sharded model)."""
        if self._wrapped is None:
            if self.mixed_precision == "fp8":
                convert_to_fp8(self.model)
            if self.info.device.type != "cpu" and not self.strategy.sharded:
                self.model.to(self.info.device)
            self._wrapped = self.strategy.wrap(self.model)
        return self._wrapped

    # ----------------------------------------------------------------------------- adapters
    def add_adapter_to_model(self, adapter_name: str, config: Any = None, **kwargs: Any) -> None:
        """Add a LoRA adapter (peft `LoraConfig` or dict); several named adapters may coexist."""
        if self._wrapped is not None:
            raise ValueError("add_adapter_to_model must come before set_optimizer / forward")
        if not isinstance(adapter_name, str) or not adapter_name:
            raise ValueError("adapter_name must be a non-empty string")
        self.model = adapters.add_adapter(self.model, adapter_name, adapters.lora_config(config, kwargs))
        self.adapter_names.append(adapter_name)
        self._select_adapter(adapter_name)

    def _select_adapter(self, adapter_name: str | None) -> None:
        if adapter_name is None:
            return
        if adapter_name not in self.adapter_names:
            raise ValueError(f"adapter_name {adapter_name!r} is unknown (added: {self.adapter_names})")
        if self._wrapped is not None and adapter_name != self.train_adapter:
            raise ValueError(
                f"adapter {self.train_adapter!r} is being trained; train adapter {adapter_name!r} in its "
                "own TransformersModel (the wrapped model's trainable set is fixed)"
            )
        self.model.set_adapter(adapter_name)  # type: ignore[operator]
        self.train_adapter = adapter_name

    def _check_adapter(self, adapter_name: str | None) -> None:
        if adapter_name is not None and adapter_name != self.train_adapter:
            self._select_adapter(adapter_name)
        if adapter_name is None and self.adapter_names and self.train_adapter is None:
            raise ValueError("this model has adapters: pass adapter_name")

    # ----------------------------------------------------------------- optimizer, scheduler
    def set_optimizer(
        self,
        optimizer_cls_or_name: Any = None,
        adapter_name: str | None = None,
        *,
        optimizer_cls: Any = None,
        **kwargs: Any,
    ) -> None:
        """A `torch.optim` class or its name (default 'adamw'); `kwargs` go to its constructor.

        The optimizer is positional, or the keyword `optimizer_cls` as upstream twinkle names it."""
        chosen = one_of("optimizer", optimizer_cls_or_name, optimizer_cls, default="adamw")
        self._check_adapter(adapter_name)
        self.optim.set_optimizer(chosen, self._trainable, **kwargs)

    def set_lr_scheduler(
        self,
        scheduler_cls_or_name: Any = None,
        adapter_name: str | None = None,
        *,
        scheduler_cls: Any = None,
        **kwargs: Any,
    ) -> None:
        """A transformers schedule name (`linear`, `cosine`, ..., keyword arguments of
        `transformers.get_scheduler`) or a torch LRScheduler class (its own keywords); default
        'constant'. Positional, or the keyword `scheduler_cls` as upstream twinkle names it."""
        chosen = one_of("scheduler", scheduler_cls_or_name, scheduler_cls, default="constant")
        self._check_adapter(adapter_name)
        self.optim.set_lr_scheduler(chosen, **kwargs)

    def set_gradient_accumulation_steps(self, steps: int) -> None:
        """Announce N up front, so the first window also skips gradient sync before its last micro-batch."""
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be a positive integer, got {steps!r}")
        self.gradient_accumulation_steps = steps

    # --------------------------------------------------------------------------- forward
    def _model_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(inputs, dict) or "input_ids" not in inputs:
            raise ValueError("inputs must be a dict with at least input_ids")
        device = self.info.device
        return {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for k, v in inputs.items()
            if k not in _NON_MODEL_KEYS
        }

    def _token_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Sum of next-token cross entropies over labelled tokens, and how many there are."""
        labels = labels.to(logits.device)
        # Shift the labels, not the logits: slicing the logits would copy them (twice, with the
        # backward pass); the padded last position is ignored.
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]
        loss_sum = F.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)),
            shift_labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        return loss_sum, int((shift_labels != IGNORE_INDEX).sum())

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.strategy.uses_autocast:
            return autocast(self.mixed_precision, self.info.device)
        return contextlib.nullcontext()

    def forward(self, inputs: dict[str, Any], adapter_name: str | None = None) -> dict[str, Any]:
        """Run the model; with `labels` also the mean token loss and the token count."""
        self._check_adapter(adapter_name)
        wrapped = self.wrapped
        with self._autocast():
            outputs = wrapped(**self._model_inputs(inputs))
        result: dict[str, Any] = {"logits": outputs.logits}
        if "labels" in inputs:
            loss_sum, tokens = self._token_loss(outputs.logits, inputs["labels"])
            result.update(loss=loss_sum / max(tokens, 1), loss_sum=loss_sum, num_tokens=tokens)
        return result

    def forward_backward(self, inputs: dict[str, Any], adapter_name: str | None = None) -> dict[str, Any]:
        """Forward and backward one micro-batch; returns its mean token `loss` and `num_tokens`."""
        self._check_adapter(adapter_name)
        if "labels" not in inputs:
            raise ValueError("forward_backward needs labels in inputs")
        wrapped = self.wrapped
        wrapped.train()
        window = self._window
        if window.reduced:
            raise ValueError("forward_backward after clip_grad_norm: call step() to finish the window first")
        labels = inputs["labels"]
        count_reduction = None
        world_size = self.info.world_size
        if window.micro_batches == 0:
            # A checkpoint taken inside this window describes its start (see `save`).
            window.rng = state_io.rng_state()
            window.loss_multiplier, window.grad_numerator = 1.0, float(world_size)
            if self.optim.grad_scaler is not None:
                # fp16: the backward divisor must be the same number on every rank, so it is a
                # global count; its all-reduce runs in the background while the forward computes.
                local_tokens = int((labels[:, 1:] != IGNORE_INDEX).sum())
                count = torch.tensor([float(local_tokens)], dtype=torch.float64, device=self.info.device)
                count_reduction = _start_all_reduce(count)
        last_in_window = window.micro_batches + 1 >= self.gradient_accumulation_steps
        with self.strategy.no_sync(wrapped, sync=last_in_window):
            with self._autocast():
                outputs = wrapped(**self._model_inputs(inputs))
            loss_sum, tokens = self._token_loss(outputs.logits, labels)
            window.loss_sum += float(loss_sum.detach())
            window.tokens += tokens
            if last_in_window:
                # The window's totals, summed over the ranks while the backward pass computes.
                window.totals = torch.tensor(
                    [window.loss_sum, float(window.tokens)], dtype=torch.float64, device=self.info.device
                )
                window.totals_reduction = _start_all_reduce(window.totals)
                window.totals_micro_batches = window.micro_batches + 1
            if window.micro_batches == 0 and self.optim.grad_scaler is not None:
                if count_reduction is not None:
                    count_reduction.wait()
                first_tokens = max(float(count.item()), 1.0)
                # DDP / FSDP average gradients over the ranks; multiplying by world size makes it a sum.
                window.loss_multiplier, window.grad_numerator = world_size / first_tokens, first_tokens
            scaled = loss_sum * window.loss_multiplier if window.loss_multiplier != 1.0 else loss_sum
            scaled = self.optim.scale(scaled)
            scaled.backward()
        window.micro_batches += 1
        return {"loss": float(loss_sum.detach()) / max(tokens, 1), "num_tokens": tokens}

    # -------------------------------------------------------------------------- stepping
    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.wrapped.parameters() if p.requires_grad]

    def _reduce_window(self) -> None:
        """Sum the window's loss and tokens over the ranks, and work out the factor that makes the
        gradients the token mean of the window (once)."""
        window = self._window
        if window.reduced:
            return
        self.optim.require_optimizer()
        if window.totals_reduction is not None:
            window.totals_reduction.wait()
        totals = window.totals
        if totals is None or window.totals_micro_batches != window.micro_batches:
            # The window ended before or after the micro-batch that announced itself as its last
            # (step() called early, or accumulation steps not announced): sum its totals now.
            totals = torch.tensor(
                [window.loss_sum, float(window.tokens)], dtype=torch.float64, device=self.info.device
            )
            all_reduce_(totals)
        total_tokens = max(float(totals[1]), 1.0)
        window.global_loss = float(totals[0]) / total_tokens
        window.global_tokens = int(total_tokens)
        self.optim.unscale_()
        window.grad_factor = window.grad_numerator / total_tokens
        window.reduced = True

    def _scale_grads(self, grads: list[torch.Tensor], multiplier: float = 1.0) -> None:
        """Apply the window's pending gradient factor, times `multiplier` (clipping), in one pass."""
        factor = self._window.grad_factor * multiplier
        if factor != 1.0:
            torch._foreach_mul_(_local_tensors(grads), factor)
        self._window.grad_factor = 1.0

    def clip_grad_norm(self, max_grad_norm: float | None = 1.0, norm_type: float = 2.0) -> float:
        """Clip to `max_grad_norm` (None: only measure); returns the total norm before clipping."""
        self._reduce_window()
        grads = [p.grad for p in self._trainable() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=norm_type)
        if hasattr(norm, "full_tensor"):
            # FSDP2: the norm of the shards is partial; one all-reduce makes it the global norm, and
            # clipping with a plain number below needs no further collective.
            norm = norm.full_tensor()
        # A norm is homogeneous: that of the rescaled gradients is the factor times this one, so
        # the factor and the clipping coefficient are applied together, in one pass.
        norm = norm * self._window.grad_factor
        multiplier = 1.0
        if max_grad_norm is not None:
            # The fp32 coefficient torch.nn.utils.clip_grad_norm_ computes, as a scalar.
            coefficient = torch.clamp(float(max_grad_norm) / (norm.float() + 1e-6), max=1.0)
            multiplier = min(float(coefficient), 1.0)
        self._scale_grads(grads, multiplier)
        return float(norm)

    def step(self) -> None:
        """Optimizer step (through the grad scaler under fp16), then the scheduler; ends the window."""
        self._reduce_window()
        if self._window.grad_factor != 1.0:  # not applied by clip_grad_norm
            self._scale_grads([p.grad for p in self._trainable() if p.grad is not None])
        self.optim.step()
        self.cur_step += 1

    def zero_grad(self) -> None:
        self.optim.zero_grad()
        self._window = _Window()

    def clip_grad_and_step(
        self,
        max_grad_norm: float | None = 1.0,
        norm_type: float = 2.0,
        gradient_accumulation_steps: int = 1,
        adapter_name: str | None = None,
    ) -> dict[str, Any] | None:
        """Call after every forward_backward: steps exactly once every N micro-batches.

        Returns None inside a window; after a step, {'step', 'loss' (token mean over the window and
        all ranks), 'grad_norm', 'lr', 'num_tokens'}.
        """
        self._check_adapter(adapter_name)
        self.set_gradient_accumulation_steps(gradient_accumulation_steps)
        if self._window.micro_batches < gradient_accumulation_steps:
            return None
        grad_norm = self.clip_grad_norm(max_grad_norm, norm_type)
        window = self._window
        lr = self.current_lr()
        self.step()
        self.zero_grad()
        return {
            "step": self.cur_step,
            "loss": window.global_loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "num_tokens": window.global_tokens,
        }

    @property
    def window_micro_batches(self) -> int:
        """Micro-batches of the current, not yet stepped accumulation window."""
        return self._window.micro_batches

    def current_lr(self) -> float:
        return self.optim.current_lr()

    # ------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def eval_loss_sums(self, inputs: dict[str, Any]) -> tuple[float, int]:
        """(loss sum, token count) of one batch on this rank, in eval mode (the caller all-reduces)."""
        wrapped = self.wrapped
        was_training = wrapped.training
        wrapped.eval()
        try:
            with self._autocast():
                outputs = wrapped(**self._model_inputs(inputs))
            loss_sum, tokens = self._token_loss(outputs.logits, inputs["labels"])
        finally:
            wrapped.train(was_training)
        return float(loss_sum), tokens

    # ------------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 64,
        adapter_name: str | None = None,
        chat: bool = False,
    ) -> list[str]:
        """Greedy completions of `prompts` with the current weights, one string per prompt.

        Collective: every rank calls it with the same prompts (under FSDP2 each forward gathers
        the shards). `chat=True` renders each prompt as a user message through the tokenizer's
        chat template. Runs in eval mode (no dropout) and restores this rank's python, numpy and
        torch RNG states afterwards, so training continues exactly as if it had not been called.
        """
        if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be a non-empty list of strings")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if self.tokenizer is None:
            raise ValueError("generate needs a tokenizer: call set_tokenizer first")
        if chat and getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("chat=True needs a tokenizer with a chat template")
        self._check_adapter(adapter_name)
        wrapped = self.wrapped
        # DDP: the module it wraps (each rank holds all weights; DDP's forward would run
        # collectives). FSDP2: the sharded model itself, whose root forward gathers the shards.
        module = wrapped.module if isinstance(wrapped, nn.parallel.DistributedDataParallel) else wrapped
        rng = state_io.rng_state()
        was_training = wrapped.training
        wrapped.eval()
        try:
            with self._autocast():
                tokens = self._greedy(module, [self._prompt_ids(p, chat) for p in prompts], max_new_tokens)
        finally:
            wrapped.train(was_training)
            state_io.set_rng_state(rng)
        return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in tokens]

    def _prompt_ids(self, prompt: str, chat: bool) -> list[int]:
        if chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.tokenizer, "eos_token_id", None), self._generation_eos()):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(i for i in source if isinstance(i, int))
        return ids

    def _generation_eos(self) -> Any:
        config = getattr(self.model, "generation_config", None)
        return getattr(config, "eos_token_id", None)

    def _greedy(self, module: nn.Module, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy decoding with a KV cache, prompts left-padded into one batch.

        Every step is a forward of `module` itself (not of an inner model, as peft's and
        transformers' `generate` would run), so FSDP2's root hooks gather every shard. Ranks stop
        together: a sharded model's ranks agree (all-reduce MIN) that every sequence has ended.
        """
        device = self.info.device
        eos = torch.tensor(sorted(self._eos_ids()), dtype=torch.long, device=device)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = int(pad) if pad is not None else (int(eos[0]) if len(eos) else 0)
        width = max(len(ids) for ids in prompts)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        synced = self.strategy.sharded and dist.is_initialized() and dist.get_world_size() > 1
        finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        steps: list[torch.Tensor] = []
        cache_name, extra = _decoding_arguments(module)
        cache: Any = None
        for _ in range(max_new_tokens):
            out = module(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{cache_name: cache},
                **extra,
            )
            cache = getattr(out, cache_name)
            chosen = out.logits[:, -1, :].argmax(dim=-1)
            chosen = torch.where(finished, torch.full_like(chosen, pad), chosen)
            steps.append(chosen)
            finished |= torch.isin(chosen, eos)
            done = torch.tensor([int(bool(finished.all()))], device=device)
            if synced:
                all_reduce_(done, op=dist.ReduceOp.MIN)
            if bool(done[0]):
                break
            input_ids = chosen[:, None]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
        generated = torch.stack(steps, dim=1).tolist()
        eos_ids = set(eos.tolist())
        completions = []
        for row in generated:
            end = next((i for i, token in enumerate(row) if token in eos_ids), len(row))
            completions.append(row[:end])
        return completions

    # ------------------------------------------------------------------------ checkpoints
    def save(
        self,
        name: str,
        output_dir: str | Path = "output",
        adapter_name: str | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int = 0,
        trainer_state_extra: dict[str, Any] | None = None,
        hf_weights: bool | None = None,
    ) -> str:
        """Write a checkpoint `<output_dir>/<name>` atomically (marker last); returns its path.

        Every rank must call it. Weights are plain HF files (full model or the LoRA adapter), or,
        by default for FSDP2 full-parameter training, each rank's shards (DCP, no gather; set
        `hf_weights=True` to write the HF files instead, as for a final checkpoint, or False to
        shard under any strategy); `twinkle_core.checkpoint.hf_model_dir` gives the HF files of
        either. Plus the tokenizer; with `save_optimizer` also the sharded optimizer (DCP),
        scheduler, scaler, per-rank RNG state. `trainer_state.json` records the progress.

        A checkpoint always describes an optimizer-step boundary: called inside an accumulation
        window it saves the RNG state of the window's start, and the window's gradients (which are
        kept, training may go on) are not part of it, so a resume replays the whole window. Pass
        the `consumed_train_samples` of that boundary.
        """
        self._check_adapter(adapter_name)
        window = self._window
        return self.checkpointer.save(
            self,
            name,
            output_dir,
            save_optimizer=save_optimizer,
            consumed_train_samples=consumed_train_samples,
            window_rng=window.rng if window.micro_batches > 0 else None,
            trainer_state_extra=trainer_state_extra,
            hf_weights=hf_weights,
        )

    def resume_from_checkpoint(
        self, checkpoint_dir: str | Path, resume_only_model: bool = False, adapter_name: str | None = None
    ) -> dict[str, int]:
        """Restore weights (full or LoRA) and, unless `resume_only_model`, optimizer, scheduler,
        scaler, RNG and step counters. Returns {'cur_step', 'consumed_train_samples',
        'gradient_accumulation_steps'}."""
        self._check_adapter(adapter_name)
        progress = self.checkpointer.resume(self, checkpoint_dir, resume_only_model=resume_only_model)
        if not resume_only_model:
            self.cur_step = progress["cur_step"]
            self.gradient_accumulation_steps = progress["gradient_accumulation_steps"]
            self._window = _Window()
        return progress

    # ---------------------------------------------------------------------------- export
    def export(self, output_dir: str | Path, merged: bool = False, adapter_name: str | None = None) -> str:
        """Plain HF files: the full model, the LoRA adapter alone, or (merged=True) base + adapter
        folded into ordinary weights. Every rank must call it; rank 0 writes."""
        self._check_adapter(adapter_name)
        return self.checkpointer.export(self, output_dir, merged=merged)
