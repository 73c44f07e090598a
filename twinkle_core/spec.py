"""JobSpec: the schema of a training job, shared by the server, the worker and the runner.

The `model` section carries the arguments of `TransformersModel` under their own names, so a
spec reads like the Python call it becomes. Every section forbids unknown keys: a typo in a
spec is an error that names the field, never a silently ignored setting.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from twinkle_core.dataset.hub import SPLIT, is_hub_dataset
from twinkle_core.options import MixedPrecision, Strategy, check_precision_for_strategy
from twinkle_core.trackers import TrackerName

DataFormat = Literal["auto", "chat", "prompt_completion", "text"]
RecordField = Literal["messages", "prompt", "completion", "text"]
DatasetSplit = Annotated[str, StringConstraints(pattern=SPLIT.pattern)]
ColumnName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Launcher = Literal["torchrun", "ray", "slurm"]
SamplePrompt = Annotated[str, StringConstraints(min_length=1, max_length=2000)]


# numpy's and torch's seeds are 32-bit: a larger one fails only when the run starts.
MAX_SEED = 2**32 - 1
# The most any step or count may be: the jobs table records steps in 32-bit integer columns, so a
# larger max_steps would be accepted and fail only when the worker records its progress.
MAX_COUNT = 2**31 - 1


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class DeviceMeshSpec(_Section):
    """Sizes of the device mesh; their product must equal the job's world size."""

    dp_size: int = Field(default=-1, description="Data-parallel replicas; -1 fills the rest of the world")
    fsdp_size: int = Field(default=1, ge=1, le=MAX_COUNT, description="Ranks each FSDP shard group spans")

    @model_validator(mode="after")
    def _check(self) -> DeviceMeshSpec:
        if self.dp_size == 0 or self.dp_size < -1:
            raise ValueError("dp_size must be a positive integer or -1 (fill the world)")
        return self


class ModelSection(_Section):
    """The arguments of `TransformersModel`, by their seed names."""

    model_cls: str = Field(
        default="AutoModelForCausalLM", description="A transformers class name, e.g. AutoModelForCausalLM"
    )
    model_id: str | None = Field(
        default=None,
        description="A local directory under an allowed root, hf://org/name, ms://org/name, a bare hub "
        "id, or a fine-tuned model of the project by its name (ft:..., JOB_ID:ckpt-STEP) to train on from",
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description="Config fields: the whole config without model_id, overrides of the stored one with it",
    )
    device_mesh: DeviceMeshSpec | None = None
    mixed_precision: MixedPrecision = "bf16"
    strategy: Strategy = "accelerate"
    ddp_config: dict[str, Any] = Field(default_factory=dict)
    fsdp_config: dict[str, Any] = Field(default_factory=dict)
    grad_scaler_config: dict[str, Any] = Field(default_factory=dict)
    memory_efficient_init: bool = False
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for from_pretrained / from_config"
    )
    tokenizer_id: str | None = Field(default=None, description="Tokenizer location; default: model_id")

    @field_validator("strategy")
    @classmethod
    def _strategy_runs_the_precision(cls, value: str, info: ValidationInfo) -> str:
        # One rule for the API, `jobs validate` and the library (twinkle_core.options).
        check_precision_for_strategy(info.data.get("mixed_precision", "bf16"), value)
        return value

    @model_validator(mode="after")
    def _model_or_config(self) -> ModelSection:
        if self.model_id is None and self.config is None:
            raise ValueError("one of model_id or config is required")
        return self


class LoraSection(_Section):
    """A LoRA adapter trained instead of the full weights (null adapter = full fine-tuning)."""

    type: Literal["lora"] = "lora"
    adapter_name: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    r: int = Field(default=8, ge=1, le=1024)
    lora_alpha: int = Field(default=16, ge=1, le=MAX_COUNT)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class DataSection(_Section):
    train_file: str = Field(
        description="An uploaded file id (file-...), an allowed local path, or a Hugging Face dataset "
        "hf://datasets/org/name"
    )
    validation_file: str | None = Field(
        default=None, description="Like train_file; a hub dataset is read at its validation_split"
    )
    format: DataFormat = "auto"
    max_length: int = Field(default=1024, ge=8, le=1_048_576)
    packing: bool = False
    split: DatasetSplit | None = Field(
        default=None, description="Hub datasets only: the split of train_file to train on (default train)"
    )
    validation_split: DatasetSplit | None = Field(
        default=None,
        description="Hub datasets only: the split to evaluate on, of validation_file when it is a hub "
        "dataset (default validation), else of train_file",
    )
    columns: dict[RecordField, ColumnName] = Field(
        default_factory=dict,
        description="Hub datasets only: our record fields (messages, prompt, completion, text) -> the "
        "dataset's column names, e.g. {prompt: question, completion: answer}; only mapped columns are kept",
    )

    @model_validator(mode="after")
    def _hub_settings_need_a_hub_dataset(self) -> DataSection:
        train_hub = is_hub_dataset(self.train_file)
        validation_hub = self.validation_file is not None and is_hub_dataset(self.validation_file)
        if self.split is not None and not train_hub:
            raise ValueError("data.split applies to a hub dataset (hf://datasets/org/name) in train_file")
        if self.columns and not (train_hub or validation_hub):
            raise ValueError("data.columns applies to hub datasets (hf://datasets/org/name) only")
        if self.validation_split is not None:
            if self.validation_file is not None and not validation_hub:
                raise ValueError("data.validation_split applies to a hub dataset; validation_file is a file")
            if self.validation_file is None and not train_hub:
                raise ValueError("data.validation_split needs a hub dataset in train_file or validation_file")
        if len(set(self.columns.values())) < len(self.columns):
            raise ValueError("data.columns: each dataset column may be mapped once")
        return self


class TrainingSection(_Section):
    max_steps: int | None = Field(
        default=None, ge=1, le=MAX_COUNT, description="Optimizer steps; wins over num_epochs"
    )
    num_epochs: float = Field(default=1.0, gt=0, le=10_000)
    batch_size: int = Field(
        default=8,
        ge=1,
        le=MAX_COUNT,
        description="Global micro-batch size, split over the data-parallel ranks",
    )
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=MAX_COUNT)
    seed: int = Field(default=42, ge=0, le=MAX_SEED)
    log_every: int = Field(default=1, ge=1, le=MAX_COUNT)
    eval_every: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    save_every: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    save_total_limit: int | None = Field(default=3, ge=1, le=MAX_COUNT)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    early_stopping_patience: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    sample_every: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="Every this many optimizer steps, generate greedily from sample_prompts with the "
        "current weights (a 'sample' event); null: off",
    )
    sample_prompts: list[SamplePrompt] = Field(
        default_factory=list,
        max_length=8,
        validate_default=True,
        description="Prompts for sample_every (at most 8, each 1..2000 characters); chat data gets "
        "the tokenizer's chat template",
    )
    sample_max_new_tokens: int = Field(default=64, ge=1, le=512, description="Tokens generated per prompt")
    report_to: list[TrackerName] = Field(
        default_factory=list,
        description="Experiment trackers that rank 0 writes the step and eval metrics to: tensorboard "
        "(event files in <job_dir>/tensorboard), mlflow (MLFLOW_TRACKING_URI, default a SQLite store "
        "in the job directory), wandb (offline under the job directory unless WANDB_API_KEY is set)",
    )

    @field_validator("sample_prompts")
    @classmethod
    def _samples_need_both(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if "sample_every" not in info.data:
            return value  # sample_every itself was invalid: that error is reported on its own
        every = info.data["sample_every"]
        if every is not None and not value:
            raise ValueError(f"sample_every ({every}) needs at least one prompt in sample_prompts")
        if every is None and value:
            raise ValueError("sample_prompts are used only with sample_every; set it or drop the prompts")
        return value

    @field_validator("report_to")
    @classmethod
    def _each_tracker_once(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"each tracker may be named once; repeated: {', '.join(repeated)}")
        return value


class OptimizerSection(_Section):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(default=1e-5, gt=0, lt=10)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)


class SchedulerSection(_Section):
    name: Literal["constant", "linear", "cosine"] = "cosine"
    warmup_steps: int = Field(default=0, ge=0, le=MAX_COUNT)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)


class ResourcesSection(_Section):
    nnodes: int = Field(default=1, ge=1, le=1024)
    nproc_per_node: int = Field(default=1, ge=1, le=64)
    launcher: Launcher = Field(
        default="torchrun",
        description="torchrun: the worker starts torchrun on its host; ray: the worker submits the "
        "same command to its Ray cluster (TWINKLE_RAY_ADDRESS) as a Ray job, one torchrun per node in a "
        "placement group when nnodes > 1",
    )

    partition: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="launcher 'slurm' (the worker submits the job with sbatch, one torchrun per "
        "allocated node; docs/scale.md) only: the Slurm partition; default: TWINKLE_SLURM_PARTITION",
    )

    @model_validator(mode="after")
    def _partition_is_slurms(self) -> ResourcesSection:
        if self.partition is not None and self.launcher != "slurm":
            raise ValueError(f"partition is for launcher 'slurm', not {self.launcher!r}")
        return self

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


class JobSpec(_Section):
    """A complete training job. Only `model.model_id` and `data.train_file` are required."""

    model: ModelSection
    adapter: LoraSection | None = None
    data: DataSection
    training: TrainingSection = Field(default_factory=TrainingSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)

    @model_validator(mode="after")
    def _check_mesh(self) -> JobSpec:
        mesh = self.model.device_mesh
        world = self.resources.world_size
        if mesh is not None:
            dp = mesh.dp_size if mesh.dp_size != -1 else world // mesh.fsdp_size
            if dp * mesh.fsdp_size != world:
                raise ValueError(
                    f"model.device_mesh: dp_size ({mesh.dp_size}) x fsdp_size ({mesh.fsdp_size}) "
                    f"must equal the world size nnodes x nproc_per_node = {world}"
                )
        dp_ranks = self.data_parallel_size
        if self.training.batch_size % dp_ranks:
            raise ValueError(
                f"training.batch_size ({self.training.batch_size}) must be divisible by the "
                f"{dp_ranks} data-parallel ranks"
            )
        return self

    @property
    def data_parallel_size(self) -> int:
        """Ranks that see different data: every rank (FSDP shards still read their own batches)."""
        return self.resources.world_size

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        return cls.model_validate(json.loads(Path(path).read_text()))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2))


def merge_spec(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in section by section, as a new dict: `{"training": {"lr":
    1}}` replaces only that field of base's `training`, and a non-mapping value replaces whole
    what it lands on. Clone's overrides and the CLI's `--set` both mean this."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_spec(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
