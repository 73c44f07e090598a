"""Checkpointer: writing and reading one checkpoint directory of a model, and exporting it.

A checkpoint folder holds the weights in one of two layouts (`twinkle_core.checkpoint`):

- HF: plain HF weights (the full model, or the LoRA adapter alone) at the top level, so that the
  folder also loads as a model. DDP, LoRA, and any checkpoint saved with `hf_weights=True`.
- sharded: full-parameter FSDP2 by default. Each rank writes only its own shards of the model and
  optimizer, in one DCP save (`dcp/`), with the config beside it; nothing is gathered, and a
  resume reads each rank's shards alone. `twinkle_core.checkpoint.hf_model_dir` consolidates the
  HF files on first use (inference, export, `model_id=<checkpoint>`).

Both also hold the tokenizer, and with the optimizer what an exact resume needs: the optimizer
state (in `dcp/` for the sharded layout; beside HF weights `optimizer.pt`, one file, where every
rank holds the same state (DDP, one process), else DCP in `optimizer/`, one shard per rank), the
scheduler, the fp16 scaler, each rank's RNG state, and `trainer_state.json` (progress and the
settings a resume must match). A checkpoint is written into a temporary directory and made complete
by `twinkle_core.checkpoint.finalize` (marker last, atomic rename), and only complete folders are
ever read.

`Checkpointer` is the contract the model wrapper relies on; `HFCheckpointer` implements it for
any object with the parts listed in `CheckpointedModel` (TransformersModel is one, and passes
itself to each call), so that this module does not import the wrapper.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from twinkle_core import checkpoint as ckpt
from twinkle_core.model import adapters, state_io
from twinkle_core.model.distributed import DistInfo, barrier
from twinkle_core.model.optim import OptimizerBundle
from twinkle_core.model.strategies import Strategy


class Checkpointer(Protocol):
    """Save and resume semantics. `owner` is the model wrapper whose parts are written or
    restored; every rank calls each method (they run collectives)."""

    def save(
        self,
        owner: CheckpointedModel,
        name: str,
        output_dir: str | Path,
        *,
        save_optimizer: bool,
        consumed_train_samples: int,
        window_rng: dict[str, Any] | None,
        trainer_state_extra: dict[str, Any] | None,
        hf_weights: bool | None = None,
    ) -> str:
        """Write `<output_dir>/<name>` atomically and return its path. `window_rng` is the RNG
        state of the open accumulation window's start (None outside a window: the current one).
        `hf_weights`: write HF weights (True) or the sharded layout (False); None: sharded for a
        sharded strategy's full weights, HF otherwise."""
        ...

    def resume(
        self, owner: CheckpointedModel, checkpoint_dir: str | Path, *, resume_only_model: bool
    ) -> dict[str, int]:
        """Restore a complete checkpoint: the weights, and unless `resume_only_model` also the
        optimizer, scheduler, scaler and this rank's RNG. Returns its progress
        {'cur_step', 'consumed_train_samples', 'gradient_accumulation_steps'}; applying it to the
        step counters is the caller's part."""
        ...

    def export(self, owner: CheckpointedModel, output_dir: str | Path, *, merged: bool) -> str:
        """Plain HF files of the model (or adapter, or adapter merged into the base)."""
        ...


class CheckpointedModel(Protocol):
    """The parts of a model wrapper that a checkpoint is written from and restored into.

    Read-only properties: the checkpointer reads them at each call (the model, the trained
    adapter and the tokenizer may change between calls) and never assigns them."""

    @property
    def info(self) -> DistInfo: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def wrapped(self) -> nn.Module: ...
    @property
    def config(self) -> Any: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def train_adapter(self) -> str | None: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def mixed_precision(self) -> str: ...
    @property
    def optim(self) -> OptimizerBundle: ...
    @property
    def cur_step(self) -> int: ...
    @property
    def gradient_accumulation_steps(self) -> int: ...


class HFCheckpointer:
    """The checkpoint layout described in this module's docstring.

    Stateless: the model wrapper is passed to each call rather than held, so that the wrapper
    (which holds its checkpointer) and the checkpointer form no reference cycle that would keep a
    dropped model's memory alive until the garbage collector runs."""

    # ---------------------------------------------------------------------------------- save
    def save(
        self,
        owner: CheckpointedModel,
        name: str,
        output_dir: str | Path,
        *,
        save_optimizer: bool,
        consumed_train_samples: int,
        window_rng: dict[str, Any] | None,
        trainer_state_extra: dict[str, Any] | None,
        hf_weights: bool | None = None,
    ) -> str:
        info, optim = owner.info, owner.optim
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"checkpoint name {name!r} must be a plain directory name")
        if save_optimizer and optim.optimizer is None:
            raise ValueError("save_optimizer=True needs set_optimizer first")
        final = Path(output_dir) / name
        temp = ckpt.temp_dir_for(final)
        if info.is_main:
            shutil.rmtree(temp, ignore_errors=True)
            temp.mkdir(parents=True)
        barrier()
        sharded = self._sharded_layout(owner, hf_weights)
        if sharded:
            # Model and optimizer in one DCP save: one planning round, each rank its own shards.
            state_io.save_sharded(
                owner.wrapped, optim.optimizer if save_optimizer else None, temp / state_io.SHARDED_DIR
            )
            if info.is_main:
                self._save_model_files(owner, temp)
        else:
            self._save_weights(owner, temp)
        if save_optimizer:
            assert optim.optimizer is not None
            if not sharded:
                self._save_optimizer(owner, optim.optimizer, temp)
            # Taken here, after the optimizer's state dict, exactly where it always was.
            rng = window_rng if window_rng is not None else state_io.rng_state()
            torch.save(rng, temp / state_io.rng_file(info.rank))
            if info.is_main:
                if optim.lr_scheduler is not None:
                    torch.save(optim.lr_scheduler.state_dict(), temp / state_io.SCHEDULER_FILE)
                if optim.grad_scaler is not None:
                    torch.save(optim.grad_scaler.state_dict(), temp / state_io.SCALER_FILE)
        barrier()
        if info.is_main:
            state = {
                "format_version": ckpt.TRAINER_STATE_FORMAT_VERSION,
                "cur_step": owner.cur_step,
                "consumed_train_samples": int(consumed_train_samples),
                "gradient_accumulation_steps": owner.gradient_accumulation_steps,
                "world_size": info.world_size,
                "seed": torch.initial_seed(),
                "strategy": owner.strategy.name,
                "mixed_precision": owner.mixed_precision,
                "adapter_name": owner.train_adapter,
                "has_optimizer": save_optimizer,
                "weights": "sharded" if sharded else "hf",
                **(trainer_state_extra or {}),
            }
            (temp / ckpt.TRAINER_STATE_FILE).write_text(json.dumps(state, indent=2))
            ckpt.finalize(temp, final)
        barrier()
        return str(final)

    @staticmethod
    def _sharded_layout(owner: CheckpointedModel, hf_weights: bool | None) -> bool:
        if hf_weights is not None and not isinstance(hf_weights, bool):
            raise ValueError(f"hf_weights must be True, False or None, got {hf_weights!r}")
        if owner.train_adapter is not None:
            return False  # an adapter is small: always its plain HF files
        return not hf_weights if hf_weights is not None else owner.strategy.sharded

    @staticmethod
    def _save_optimizer(owner: CheckpointedModel, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """The optimizer beside HF weights: one file where every rank holds the same state (DDP, one
        process), else DCP (FSDP2 with `hf_weights=True`), each rank its own shard."""
        if owner.strategy.sharded:
            state_io.save_optimizer(owner.wrapped, optimizer, directory / state_io.OPTIMIZER_DIR)
            return
        # The last rank writes it: under DDP not rank 0, which writes the HF weights meanwhile.
        info = owner.info
        state_io.save_replicated_optimizer(
            owner.wrapped,
            optimizer,
            directory / state_io.OPTIMIZER_FILE,
            write=info.rank == info.world_size - 1,
        )

    def _save_model_files(self, owner: CheckpointedModel, directory: Path) -> None:
        """What a sharded checkpoint needs beside its shards to become an HF folder: the config,
        the generation config and the tokenizer (rank 0)."""
        model = base_model(owner.model)
        model.config.save_pretrained(str(directory))
        generation = getattr(model, "generation_config", None)
        if generation is not None and model.can_generate():
            generation.save_pretrained(str(directory))
        if owner.tokenizer is not None:
            owner.tokenizer.save_pretrained(str(directory))

    def _save_weights(self, owner: CheckpointedModel, directory: Path) -> None:
        full_state = state_io.full_model_state_dict(owner.wrapped)
        if not owner.info.is_main:
            return
        if owner.train_adapter is not None:
            mapping = adapters.adapter_key_map(owner.model, owner.train_adapter)
            adapters.save_adapter(
                owner.model, owner.train_adapter, adapters.adapter_state(full_state, mapping), directory
            )
        else:
            base_model(owner.model).save_pretrained(str(directory), state_dict=full_state)
        if owner.tokenizer is not None:
            owner.tokenizer.save_pretrained(str(directory))

    # -------------------------------------------------------------------------------- resume
    def resume(
        self, owner: CheckpointedModel, checkpoint_dir: str | Path, *, resume_only_model: bool
    ) -> dict[str, int]:
        info, optim = owner.info, owner.optim
        path = Path(checkpoint_dir)
        if not ckpt.is_complete(path):
            raise ValueError(f"{path} is not a complete checkpoint (no {ckpt.COMPLETE_MARKER} marker)")
        state = ckpt.read_trainer_state(path)
        if not resume_only_model and state.get("world_size") != info.world_size:
            raise ValueError(
                f"checkpoint {path} was saved by {state.get('world_size')} ranks and this job has "
                f"{info.world_size}: exact resume needs the same world size (per-rank RNG and data "
                "order); use resume_only_model=True to start over from its weights"
            )
        progress = {
            "cur_step": int(state["cur_step"]),
            "consumed_train_samples": int(state["consumed_train_samples"]),
            "gradient_accumulation_steps": int(state["gradient_accumulation_steps"]),
        }
        sharded = (path / state_io.SHARDED_DIR).is_dir() and not ckpt.has_hf_weights(path)
        if not resume_only_model:
            if optim.optimizer is None:
                raise ValueError(
                    "set_optimizer (and set_lr_scheduler) must come before resume_from_checkpoint"
                )
            if not state.get("has_optimizer") or not _has_optimizer_state(path, sharded):
                raise ValueError(
                    f"checkpoint {path} has no optimizer state (saved with save_optimizer=False)"
                )
        # Before the first optimizer step (a stop inside the first window) the saved optimizer state
        # is empty, which is what a fresh optimizer already holds; DCP has no keys to load then.
        with_optimizer = not resume_only_model and progress["cur_step"] > 0
        if sharded:
            if owner.train_adapter is not None:
                raise ValueError(
                    f"{path} holds full weights but this model trains adapter {owner.train_adapter!r}"
                )
            state_io.load_sharded(
                owner.wrapped, optim.optimizer if with_optimizer else None, path / state_io.SHARDED_DIR
            )
        else:
            self._load_weights(owner, path)
            if with_optimizer:
                assert optim.optimizer is not None
                self._load_optimizer(owner, optim.optimizer, path)
        if resume_only_model:
            return progress
        if optim.lr_scheduler is not None:
            scheduler_file = path / state_io.SCHEDULER_FILE
            if not scheduler_file.is_file():
                raise ValueError(f"checkpoint {path} has no scheduler state but a scheduler is set")
            optim.lr_scheduler.load_state_dict(torch.load(scheduler_file, weights_only=False))
        if optim.grad_scaler is not None:
            scaler_file = path / state_io.SCALER_FILE
            if not scaler_file.is_file():
                # Resuming fp16 with a fresh scale would change the loss scaling (and which steps
                # are skipped) from this step on: not an exact resume.
                raise ValueError(
                    f"checkpoint {path} has no {state_io.SCALER_FILE} (saved with mixed_precision="
                    f"{state.get('mixed_precision')!r}); resuming mixed_precision='fp16' exactly needs the "
                    "gradient scaler's state"
                )
            optim.grad_scaler.load_state_dict(torch.load(scaler_file, weights_only=False))
        state_io.set_rng_state(torch.load(path / state_io.rng_file(info.rank), weights_only=False))
        return progress

    @staticmethod
    def _load_optimizer(owner: CheckpointedModel, optimizer: torch.optim.Optimizer, path: Path) -> None:
        """The optimizer beside HF weights, from whichever of `_save_optimizer`'s two forms the
        checkpoint holds (a DDP checkpoint written before the single file holds the DCP one)."""
        file = path / state_io.OPTIMIZER_FILE
        if file.is_file():
            state_io.load_replicated_optimizer(
                owner.wrapped, optimizer, file, owner.info.device, sharded=owner.strategy.sharded
            )
        else:
            state_io.load_optimizer(owner.wrapped, optimizer, path / state_io.OPTIMIZER_DIR)

    def _load_weights(self, owner: CheckpointedModel, path: Path) -> None:
        wrapped = owner.wrapped
        if (path / state_io.ADAPTER_WEIGHTS).is_file():
            if owner.train_adapter is None:
                raise ValueError(f"{path} holds a LoRA adapter: add_adapter_to_model before resuming")
            from safetensors.torch import load_file

            saved = load_file(str(path / state_io.ADAPTER_WEIGHTS))
            mapping = adapters.adapter_key_map(owner.model, owner.train_adapter)
            if set(saved) != set(mapping):
                raise ValueError(
                    f"{path}: the adapter's weights do not match adapter {owner.train_adapter!r}"
                )
            state = {mapping[k]: v for k, v in saved.items()}
            state_io.load_full_model_state_dict(wrapped, state, strict=False)
            return
        if owner.train_adapter is not None:
            raise ValueError(
                f"{path} holds full weights but this model trains adapter {owner.train_adapter!r}"
            )
        state = state_io.read_safetensors_dir(path)
        state_io.load_full_model_state_dict(wrapped, state, strict=not owner.config.tie_word_embeddings)

    # -------------------------------------------------------------------------------- export
    def export(self, owner: CheckpointedModel, output_dir: str | Path, *, merged: bool) -> str:
        directory = Path(output_dir)
        full_state = state_io.full_model_state_dict(owner.wrapped)
        if owner.info.is_main:
            directory.mkdir(parents=True, exist_ok=True)
            if owner.train_adapter is None:
                base_model(owner.model).save_pretrained(str(directory), state_dict=full_state)
            elif merged:
                weights = adapters.merged_state(full_state, owner.model, owner.train_adapter)
                base_model(owner.model).save_pretrained(str(directory), state_dict=weights)
            else:
                mapping = adapters.adapter_key_map(owner.model, owner.train_adapter)
                adapters.save_adapter(
                    owner.model, owner.train_adapter, adapters.adapter_state(full_state, mapping), directory
                )
            if owner.tokenizer is not None:
                owner.tokenizer.save_pretrained(str(directory))
        barrier()
        return str(directory)


def base_model(model: nn.Module) -> Any:
    """The transformers model under a peft wrapper (or the model itself): what save_pretrained is on."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def _has_optimizer_state(path: Path, sharded: bool) -> bool:
    if sharded:
        return (path / state_io.SHARDED_DIR).is_dir()
    return (path / state_io.OPTIMIZER_FILE).is_file() or (path / state_io.OPTIMIZER_DIR).is_dir()


def looks_like_checkpoint(path: Path) -> bool:
    """A directory written by `save` (complete or not): a temporary name or training-state files."""
    if path.name.startswith((".tmp-", ".old-")):
        return True
    markers = (
        ckpt.TRAINER_STATE_FILE,
        state_io.OPTIMIZER_FILE,
        state_io.OPTIMIZER_DIR,
        state_io.SHARDED_DIR,
        state_io.SCHEDULER_FILE,
        state_io.SCALER_FILE,
    )
    return any((path / name).exists() for name in markers) or any(path.glob("rng_state_*.pth"))
