"""The job runner: `torchrun ... -m twinkle_core.train <job_dir>/spec.json [--resume-from DIR]`.

Exit contract (the worker relies on it):
- 0 after `done`, or after `stopped` for a pause (SIGUSR1);
- 143 after `stopped` for a termination (SIGTERM), a checkpoint having been written first;
- 2 after an `error` event of kind "user" (bad spec, missing or malformed data, invalid argument,
  out of memory before the first optimizer step);
- 1 after an `error` event of kind "infra" (anything else).
Under torchrun only the ranks' exit codes follow this; torchrun itself exits 1 when any rank
fails, so a supervisor reads the error kind from progress.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import random
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from twinkle_core.progress import ProgressWriter
    from twinkle_core.spec import JobSpec
    from twinkle_core.trackers import Trackers

EXIT_OK = 0
EXIT_INFRA = 1
EXIT_USER = 2
EXIT_TERMINATED = 143

logger = logging.getLogger("twinkle_core.train")


class StopRequest:
    """Set by signal handlers (a flag only: a handler must never block or run collectives)."""

    def __init__(self) -> None:
        self.pause = False
        self.terminate = False

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_pause)
        signal.signal(signal.SIGTERM, self._on_terminate)

    def _on_pause(self, signum: int, frame: FrameType | None) -> None:
        self.pause = True

    def _on_terminate(self, signum: int, frame: FrameType | None) -> None:
        self.terminate = True


class UserError(ValueError):
    """A problem with what the user submitted; the job fails without retry."""


@dataclass
class _Tracking:
    """Progress that survives a resume through trainer_state.json."""

    best_eval_loss: float | None = None
    best_checkpoint: str | None = None
    evals_without_improvement: int = 0
    last_eval_step: int | None = None
    last_eval_loss: float | None = None
    last_saved_step: int | None = None
    last_loss: float | None = None  # the training loss of the last optimizer step, for checkpoints
    boundary_consumed: int = 0  # consumed_train_samples at the last optimizer-step boundary
    window_tokens: int = 0
    window_samples: int = 0
    window_start: float = field(default_factory=time.perf_counter)

    def extra_state(self) -> dict[str, Any]:
        return {
            "best_eval_loss": self.best_eval_loss,
            "best_checkpoint": self.best_checkpoint,
            "evals_without_improvement": self.evals_without_improvement,
            "eval_loss": self.last_eval_loss,
        }


class JobRunner:
    def __init__(
        self,
        spec: JobSpec,
        job_dir: Path,
        progress: ProgressWriter,
        stop: StopRequest,
        resume_from: Path | None,
    ) -> None:
        self.spec = spec
        self.job_dir = job_dir
        self.progress = progress
        self.stop = stop
        self.resume_from = resume_from
        from twinkle_core.checkpoint import CHECKPOINTS_DIR

        self.checkpoint_root = job_dir / CHECKPOINTS_DIR
        self.first_step_done = False
        self.tracking = _Tracking()
        self.trackers: Trackers | None = None
        self.stopped = False

    # ----------------------------------------------------------------------------- setup
    def build(self) -> None:
        import numpy as np
        import torch

        from twinkle_core.dataloader import DataLoader
        from twinkle_core.dataset import Dataset
        from twinkle_core.hub import resolve_model_id
        from twinkle_core.mesh import DeviceMesh
        from twinkle_core.model import TransformersModel

        spec = self.spec
        seed = spec.training.seed
        # The same seed on every rank before the model exists: identical init, reproducible runs.
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        section = spec.model
        mesh = None
        if section.device_mesh is not None:
            dp = None if section.device_mesh.dp_size == -1 else section.device_mesh.dp_size
            mesh = DeviceMesh.from_sizes(dp_size=dp, fsdp_size=section.device_mesh.fsdp_size)
        try:
            self.model = TransformersModel(
                model_cls=section.model_cls,
                model_id=section.model_id,
                config=section.config,
                device_mesh=mesh,
                mixed_precision=section.mixed_precision,
                strategy=section.strategy,
                ddp_config=section.ddp_config,
                fsdp_config=section.fsdp_config,
                grad_scaler_config=section.grad_scaler_config,
                memory_efficient_init=section.memory_efficient_init,
                **section.kwargs,
            )
        except OSError as exc:
            user_error = incomplete_model_directory(section.model_id, exc)
            if user_error is None:
                raise
            raise user_error from exc
        model = self.model
        if section.tokenizer_id is not None:
            model.set_tokenizer(resolve_model_id(section.tokenizer_id))
        if model.tokenizer is None:
            raise UserError("model.tokenizer_id: no tokenizer found with the model; name one in tokenizer_id")
        if spec.adapter is not None:
            adapter = spec.adapter
            model.add_adapter_to_model(
                adapter.adapter_name,
                {
                    "r": adapter.r,
                    "lora_alpha": adapter.lora_alpha,
                    "lora_dropout": adapter.lora_dropout,
                    "target_modules": adapter.target_modules,
                },
            )
        data = spec.data
        train_set = Dataset(
            self.data_source(data.train_file, "data.train_file", data.split or "train"),
            model.tokenizer,
            data_format=data.format,
            max_length=data.max_length,
            packing=data.packing,
        )
        self.train_loader = DataLoader(
            train_set, batch_size=spec.training.batch_size, device_mesh=model.device_mesh, seed=seed
        )
        # Sample prompts are user messages through the chat template when the model learns chats.
        self.chat_samples = train_set.data_format == "chat"
        self.eval_loader = None
        validation: Any = None
        if data.validation_file is not None:
            validation = self.data_source(
                data.validation_file, "data.validation_file", data.validation_split or "validation"
            )
        elif data.validation_split is not None:  # another split of the training dataset
            validation = self.data_source(data.train_file, "data.validation_split", data.validation_split)
        if validation is not None:
            eval_set = Dataset(
                validation,
                model.tokenizer,
                data_format=data.format,
                max_length=data.max_length,
                packing=data.packing,
            )
            self.eval_loader = DataLoader(
                eval_set,
                batch_size=spec.training.batch_size,
                device_mesh=model.device_mesh,
                shuffle=False,
                drop_last=False,
            )
        accumulation = spec.training.gradient_accumulation_steps
        self.steps_per_epoch = len(self.train_loader) // accumulation
        if self.steps_per_epoch < 1:
            raise UserError(
                f"training.gradient_accumulation_steps ({accumulation}) exceeds the {len(self.train_loader)} "
                f"batches of size {spec.training.batch_size} in one epoch of data.train_file"
            )
        self.total_steps = spec.training.max_steps or math.ceil(
            spec.training.num_epochs * self.steps_per_epoch
        )
        from twinkle_core.spec import MAX_COUNT

        if self.total_steps > MAX_COUNT:
            raise UserError(
                f"training.num_epochs ({spec.training.num_epochs}) x {self.steps_per_epoch} steps per epoch "
                f"makes {self.total_steps} steps, more than {MAX_COUNT}"
            )
        self._set_optimizer()
        model.set_gradient_accumulation_steps(accumulation)

    def data_source(self, location: str, field_name: str, split: str) -> Any:
        """A data file's path, or a hub dataset's split loaded with `datasets` (columns renamed)."""
        from twinkle_core.dataset.hub import is_hub_dataset, load_hub_dataset

        if not is_hub_dataset(location):
            if location.startswith(("hf://", "ms://")):
                raise UserError(
                    f"{field_name}: {location} is not a dataset; hub data is hf://datasets/org/name"
                )
            return _existing_file(location, field_name)
        return load_hub_dataset(location, split, self.spec.data.columns, field=field_name)

    def _set_optimizer(self) -> None:
        spec, model = self.spec, self.model
        opt = spec.optimizer
        kwargs: dict[str, Any] = {"lr": opt.lr, "weight_decay": opt.weight_decay}
        if opt.name in ("adamw", "adam"):
            kwargs.update(betas=tuple(opt.betas), eps=opt.eps)
        adapter_name = spec.adapter.adapter_name if spec.adapter else None
        model.set_optimizer(opt.name, adapter_name=adapter_name, **kwargs)
        sched = spec.scheduler
        if sched.warmup_steps >= self.total_steps and sched.warmup_steps > 0:
            raise UserError(
                f"scheduler.warmup_steps ({sched.warmup_steps}) must be below the total steps "
                f"({self.total_steps})"
            )
        if sched.name == "constant":
            model.set_lr_scheduler("constant_with_warmup", num_warmup_steps=sched.warmup_steps)
        elif sched.name == "linear":
            model.set_lr_scheduler(
                "linear", num_warmup_steps=sched.warmup_steps, num_training_steps=self.total_steps
            )
        else:
            model.set_lr_scheduler(
                "cosine_with_min_lr",
                num_warmup_steps=sched.warmup_steps,
                num_training_steps=self.total_steps,
                scheduler_specific_kwargs={"min_lr_rate": sched.min_lr_ratio},
            )

    def restore(self) -> None:
        from twinkle_core.checkpoint import read_trainer_state

        if self.resume_from is None:
            return
        resumed = self.model.resume_from_checkpoint(self.resume_from)
        if resumed["gradient_accumulation_steps"] != self.spec.training.gradient_accumulation_steps:
            raise UserError(
                "training.gradient_accumulation_steps differs from the checkpoint's "
                f"({resumed['gradient_accumulation_steps']}): exact resume needs the same value"
            )
        self.train_loader.resume_from_checkpoint(resumed["consumed_train_samples"])
        state = read_trainer_state(self.resume_from)
        tracking = self.tracking
        tracking.best_eval_loss = state.get("best_eval_loss")
        tracking.best_checkpoint = state.get("best_checkpoint")
        tracking.evals_without_improvement = int(state.get("evals_without_improvement") or 0)
        tracking.last_saved_step = self.model.cur_step
        tracking.boundary_consumed = resumed["consumed_train_samples"]

    def check_trackers(self) -> None:
        """Before any weights are read: a tracker library missing here is the user's to fix."""
        from twinkle_core.trackers import check_available

        try:
            check_available(self.spec.training.report_to)
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def open_trackers(self) -> Trackers:
        from twinkle_core.trackers import Trackers, open_trackers

        names = self.spec.training.report_to
        if not names or not self.progress.enabled:  # rank 0 alone writes metrics
            return Trackers()
        return open_trackers(
            names,
            self.job_dir,
            os.environ.get("TWINKLE_JOB_ID") or self.job_dir.name,
            start_step=self.model.cur_step,
            config=self.spec.model_dump(mode="json"),
        )

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        if self.trackers is not None:
            self.trackers.log_metrics(step, {k: float(v) for k, v in metrics.items() if v is not None})

    # ------------------------------------------------------------------------------ loop
    def run(self) -> int:
        self.check_trackers()
        self.build()
        self.restore()
        self.trackers = self.open_trackers()
        status = "failed"
        try:
            code = self.train()
            status = "killed" if self.stopped else "finished"
            return code
        finally:
            self.trackers.close(status)

    def train(self) -> int:
        model, spec = self.model, self.spec
        self.progress.emit(
            "started",
            total_steps=self.total_steps,
            world_size=model.info.world_size,
            resumed_from=str(self.resume_from) if self.resume_from else None,
            start_step=model.cur_step,
        )
        accumulation = spec.training.gradient_accumulation_steps
        self.tracking.window_start = time.perf_counter()
        stop_training = model.cur_step >= self.total_steps
        while not stop_training:
            for batch in self.train_loader:
                model.forward_backward(inputs=batch)
                self.tracking.window_samples += int(batch["input_ids"].shape[0]) * model.info.world_size
                result = model.clip_grad_and_step(
                    max_grad_norm=spec.training.max_grad_norm, gradient_accumulation_steps=accumulation
                )
                if result is None:
                    # Inside a window: a stop request is honoured now rather than after the rest of
                    # the window, which may take longer than the grace period.
                    outcome = self.check_stop()
                    if outcome is not None:
                        return outcome
                    continue
                self.first_step_done = True
                self.tracking.boundary_consumed = self.train_loader.get_state()["consumed_train_samples"]
                outcome = self.after_step(result)
                if outcome is not None:
                    return outcome
                if model.cur_step >= self.total_steps or self.early_stop():
                    stop_training = True
                    break
        return self.finish()

    def after_step(self, result: dict[str, Any]) -> int | None:
        model, training = self.model, self.spec.training
        step = model.cur_step
        tracking = self.tracking
        tracking.window_tokens += int(result["num_tokens"])
        tracking.last_loss = float(result["loss"])
        if step % training.log_every == 0 or step == self.total_steps:
            elapsed = max(time.perf_counter() - tracking.window_start, 1e-9)
            tokens_per_second = tracking.window_tokens / elapsed
            self.progress.emit(
                "step",
                step=step,
                total_steps=self.total_steps,
                epoch=self.epoch(),
                loss=result["loss"],
                lr=result["lr"],
                grad_norm=result["grad_norm"],
                tokens_per_second=tokens_per_second,
                samples_per_second=tracking.window_samples / elapsed,
            )
            self.log_metrics(
                step,
                {
                    "train/loss": result["loss"],
                    "train/lr": result["lr"],
                    "train/grad_norm": result["grad_norm"],
                    "train/tokens_per_second": tokens_per_second,
                },
            )
            tracking.window_tokens = tracking.window_samples = 0
            tracking.window_start = time.perf_counter()
        if training.eval_every and step % training.eval_every == 0:
            self.evaluate()
        if training.sample_every and step % training.sample_every == 0:
            self.sample()
        # A new best eval gets its checkpoint even between save_every steps, so best.json always
        # names the weights that scored best (eval_every and save_every need not align).
        new_best = tracking.last_eval_step == step and tracking.evals_without_improvement == 0
        if new_best or (training.save_every and step % training.save_every == 0):
            self.save_checkpoint()
        return self.check_stop()

    def epoch(self) -> float:
        loader = self.train_loader
        return loader.get_state()["consumed_train_samples"] / loader.samples_per_epoch

    def check_stop(self) -> int | None:
        """After every micro-batch every rank agrees on a stop request, saves, and leaves.

        Inside an accumulation window the checkpoint is that of the last step boundary (weights,
        optimizer and data position are still those; `TransformersModel.save` takes the RNG state
        of the window's start), so the window is replayed after a resume and nothing is lost but
        its compute. The grace period then has to cover one micro-batch and a checkpoint.
        """
        import torch

        from twinkle_core.model.distributed import all_reduce_

        flags = torch.tensor([int(self.stop.pause), int(self.stop.terminate)], device=self.model.info.device)
        all_reduce_(flags, op=torch.distributed.ReduceOp.MAX)
        pause, terminate = bool(flags[0]), bool(flags[1])
        if not (pause or terminate):
            return None
        path = self.save_checkpoint()
        self.stopped = True
        reason = "terminate" if terminate else "pause"
        self.progress.emit("stopped", step=self.model.cur_step, reason=reason, checkpoint=path)
        return EXIT_TERMINATED if terminate else EXIT_OK

    def early_stop(self) -> bool:
        patience = self.spec.training.early_stopping_patience
        return patience is not None and self.tracking.evals_without_improvement >= patience

    def evaluate(self) -> float | None:
        import torch

        from twinkle_core.model.distributed import all_reduce_

        if self.eval_loader is None:
            return None
        sums = torch.zeros(2, dtype=torch.float64, device=self.model.info.device)
        for batch in self.eval_loader:
            loss_sum, tokens = self.model.eval_loss_sums(batch)
            sums[0] += loss_sum
            sums[1] += tokens
        all_reduce_(sums)
        eval_loss = float(sums[0] / max(float(sums[1]), 1.0))
        step = self.model.cur_step
        tracking = self.tracking
        tracking.last_eval_step, tracking.last_eval_loss = step, eval_loss
        if tracking.best_eval_loss is None or eval_loss < tracking.best_eval_loss:
            tracking.best_eval_loss = eval_loss
            tracking.best_checkpoint = None  # set when this step's checkpoint is written
            tracking.evals_without_improvement = 0
        else:
            tracking.evals_without_improvement += 1
        self.progress.emit("eval", step=step, eval_loss=eval_loss)
        self.log_metrics(step, {"eval/loss": eval_loss})
        return eval_loss

    def sample(self) -> None:
        """Greedy completions of `training.sample_prompts` with the current weights, on every rank.

        Called at an optimizer-step boundary only. `TransformersModel.generate` runs in eval mode
        and restores the RNG states, so a run with samples trains exactly like one without.
        """
        training = self.spec.training
        completions = self.model.generate(
            training.sample_prompts,
            max_new_tokens=training.sample_max_new_tokens,
            adapter_name=self.spec.adapter.adapter_name if self.spec.adapter else None,
            chat=self.chat_samples,
        )
        self.progress.emit(
            "sample",
            step=self.model.cur_step,
            samples=[
                {"prompt": prompt, "completion": completion}
                for prompt, completion in zip(training.sample_prompts, completions, strict=True)
            ],
        )

    def save_checkpoint(self, hf_weights: bool | None = None) -> str:
        """Checkpoint this step. `hf_weights` as `TransformersModel.save` takes it: None lets an
        FSDP2 job write its shards alone (fast; consolidated when first read), True writes the HF
        weights (the final checkpoint)."""
        from twinkle_core import checkpoint as ckpt

        model, tracking = self.model, self.tracking
        step = model.cur_step
        final = ckpt.step_dir(self.checkpoint_root, step)
        if tracking.last_saved_step == step and ckpt.is_complete(final):
            if hf_weights and model.info.is_main:
                ckpt.hf_model_dir(final)  # saved sharded a moment ago: consolidate it now
            return str(final)
        evaluated_now = tracking.last_eval_step == step
        is_best = evaluated_now and tracking.best_eval_loss == tracking.last_eval_loss
        if is_best:
            tracking.best_checkpoint = str(final)
        path = model.save(
            final.name,
            output_dir=self.checkpoint_root,
            adapter_name=self.spec.adapter.adapter_name if self.spec.adapter else None,
            save_optimizer=True,
            consumed_train_samples=tracking.boundary_consumed,
            trainer_state_extra=tracking.extra_state(),
            hf_weights=hf_weights,
        )
        tracking.last_saved_step = step
        # The step's training loss (none when nothing trained since a resume), and its eval loss
        # when it was evaluated at this step.
        metrics: dict[str, float] = {}
        if tracking.last_loss is not None:
            metrics["loss"] = tracking.last_loss
        if evaluated_now and tracking.last_eval_loss is not None:
            metrics["eval_loss"] = tracking.last_eval_loss
        if model.info.is_main:
            if is_best:
                assert tracking.best_eval_loss is not None
                ckpt.write_best(
                    self.checkpoint_root, ckpt.BestCheckpoint(path, step, tracking.best_eval_loss)
                )
            ckpt.prune_checkpoints(self.checkpoint_root, self.spec.training.save_total_limit)
        self.progress.emit("checkpoint", step=step, path=path, metrics=metrics, is_best=is_best)
        return path

    def finish(self) -> int:
        if self.eval_loader is not None and self.tracking.last_eval_step != self.model.cur_step:
            self.evaluate()
        # The final checkpoint is what users load, serve and export: it carries the HF weights.
        path = self.save_checkpoint(hf_weights=True)
        self.progress.emit("done", step=self.model.cur_step, final_checkpoint=path)
        return EXIT_OK


# How transformers says that a local model directory lacks a file it needs (the weights, config.json).
_MISSING_IN_DIRECTORY = ("no file named", "does not appear to have a file named")


def incomplete_model_directory(model_id: str | None, exc: OSError) -> UserError | None:
    """The user's error for a local model directory that lacks a file transformers needs, which
    every attempt would meet; None for any other OSError (a hub download's stays infra)."""
    if model_id is None or isinstance(exc, ConnectionError | TimeoutError) or not Path(model_id).is_dir():
        return None
    if not any(words in str(exc) for words in _MISSING_IN_DIRECTORY):
        return None
    return UserError(f"model.model_id: {model_id} is not a complete model directory: {exc}")


def _existing_file(location: str, field_name: str) -> str:
    path = Path(location)
    if (location.startswith(("/", ".")) or path.suffix) and not path.exists():
        raise UserError(f"{field_name}: {location} does not exist")
    return location


# Words in a RuntimeError's message that name the machine rather than the job: device, driver
# and collective failures, which another attempt (often on another worker) may not meet.
_MACHINE_TROUBLE = ("cuda", "nccl", "gloo", "c10d", "cudnn", "cublas", "device-side")


def classify_error(exc: BaseException, first_step_done: bool) -> str:
    """'user' for what the submitter can fix (failed, not retried), 'infra' for the rest (retried).

    Before the first step, a plain Python error (TypeError from a bad `model.kwargs`, KeyError
    from a config, an ImportError for an attention backend that is not installed, a state dict
    that does not fit) comes from the spec or the model and would fail the same way on every
    retry, so it is the user's. What the machine or the network can cause stays infra:
    collective and device errors, connection and time-outs, other OS errors (a hub download, a
    full disk), and a signal. After the first step the job has proven it runs, so only the
    clearly user-made errors below are final.
    """
    import torch

    if isinstance(exc, (ValueError, FileNotFoundError, IsADirectoryError, PermissionError)):
        return "user"
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "infra" if first_step_done else "user"  # does not fit at all: a retry fails the same
    if first_step_done or not isinstance(exc, Exception):
        return "infra"  # KeyboardInterrupt and other signals-as-exceptions included
    machine = (torch.distributed.DistError, torch.AcceleratorError, ConnectionError, TimeoutError, OSError)
    if isinstance(exc, machine):
        return "infra"
    if isinstance(exc, RuntimeError) and any(word in str(exc).lower() for word in _MACHINE_TROUBLE):
        return "infra"
    return "user"


def main(argv: list[str] | None = None) -> int:
    # Handlers first: a pause or terminate arriving while the model loads must not kill the rank.
    stop = StopRequest()
    stop.install()
    parser = argparse.ArgumentParser(prog="python -m twinkle_core.train")
    parser.add_argument("spec", type=Path, help="<job_dir>/spec.json (the job directory is its parent)")
    parser.add_argument("--resume-from", type=Path, default=None, help="a complete checkpoint directory")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s rank" + os.environ.get("RANK", "0") + " %(message)s"
    )
    from twinkle_core.progress import ProgressWriter

    job_dir = args.spec.resolve().parent
    is_main = int(os.environ.get("RANK", "0")) == 0
    progress = ProgressWriter(job_dir, enabled=is_main, echo=True)
    runner: JobRunner | None = None
    try:
        from twinkle_core.spec import JobSpec

        if not args.spec.is_file():
            raise UserError(f"spec file {args.spec} does not exist")
        try:
            spec = JobSpec.load(args.spec)
        except ValueError as exc:
            raise UserError(f"invalid job spec: {exc}") from exc
        _quiet_libraries()
        runner = JobRunner(spec, job_dir, progress, stop, args.resume_from)
        return runner.run()
    except SystemExit:
        raise
    except BaseException as exc:  # every failure must become an error event
        kind = classify_error(exc, runner.first_step_done if runner else False)
        traceback.print_exc()
        progress.emit("error", kind=kind, message=f"{type(exc).__name__}: {exc}"[:4000])
        return EXIT_USER if kind == "user" else EXIT_INFRA
    finally:
        progress.close()
        _shutdown_process_group()


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    silence_library_deprecations()


def silence_library_deprecations() -> None:
    """Leave out of a rank's log the warnings one library raises about another's API, which no
    user can act on: peft's PeftModel reads `is_gradient_checkpointing`, deprecated in transformers
    5, so every LoRA job's log carried a FutureWarning per rank. The runner's process only; the
    library never changes the filters of a user's own script."""
    warnings.filterwarnings(
        "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )


def _shutdown_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run(argv: list[str] | None = None) -> NoReturn:
    """The process entry point: `main`, then leave without the interpreter's teardown.

    Under load on CPU a rank has aborted in C++ static destruction ("terminate called without an
    active exception") after its final checkpoint and `done` event, turning a finished job into
    a failed attempt. By then `main` has closed the progress file and destroyed the process
    group; all that is left to flush is Python's own buffers and logging handlers.
    """
    code = main(argv)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
