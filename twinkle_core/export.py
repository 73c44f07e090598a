"""Export a training checkpoint as a standalone Hugging Face model folder.

Three kinds, chosen by the caller:

- `full`: a full fine-tune's weights as saved (config, safetensors, generation config);
- `merged`: a LoRA adapter folded into its base model (`merge_and_unload`), saved in the dtype the
  base is stored in (a bf16 base stays bf16: an export twice the base's size helps nobody);
- `adapter`: the adapter alone (`adapter_config.json` + `adapter_model.safetensors`), with
  `base_model_name_or_path` rewritten to a name a user can load it on (`base_model_name`).

Every kind also carries the checkpoint's tokenizer (and so its chat template) and a README model
card naming the job, the step and the base. Nothing of the training state (optimizer, RNG,
scheduler, trainer_state.json, the COMPLETE marker) is copied, and the folder is written under a
temporary name and renamed into place, so a reader never sees half an export.

Run as `python -m twinkle_core.export <request.json>` by the worker (a process of its own: the
worker stays free of torch and a crash or OOM here ends this process only), or call
`export_checkpoint` directly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from twinkle_core import checkpoint as ckpt

ExportKind = Literal["full", "merged", "adapter"]
EXPORT_KINDS: tuple[str, ...] = ("full", "merged", "adapter")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# The files of a full model's weights, as save_pretrained writes them.
MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")


@dataclass
class ExportRequest:
    checkpoint_dir: str
    output_dir: str
    kind: ExportKind
    # LoRA only: the base model as the job's spec names it (a local dir, hf://org/name, a hub id),
    # with the spec's model_cls, config overrides and from_pretrained kwargs it was trained with.
    base_model: str | None = None
    base_model_name: str | None = None  # what adapter_config.json and the card call the base
    model_cls: str = "AutoModelForCausalLM"
    config: dict[str, Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    # For the model card.
    job_id: str = ""
    job_name: str | None = None
    step: int | None = None

    @classmethod
    def read(cls, path: str | Path) -> ExportRequest:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))


def public_base_name(model_id: str | None) -> str | None:
    """What an adapter's `base_model_name_or_path` says: the hub repo id for a hub model
    (`hf://org/name` and a bare `org/name` give `org/name`, `ms://org/name` too: a ModelScope id),
    the directory as the job named it for a local model (a path on the service's machines: load
    your copy of it), None for a base built from a config alone."""
    if model_id is None:
        return None
    for prefix in ("hf://", "ms://"):
        if model_id.startswith(prefix):
            return model_id[len(prefix) :].strip("/")
    return model_id


def export_checkpoint(request: ExportRequest) -> Path:
    """Write the export into `request.output_dir` (replacing nothing: it must not exist yet)."""
    source = Path(request.checkpoint_dir)
    if request.kind not in EXPORT_KINDS:
        raise ValueError(f"kind must be one of {EXPORT_KINDS}, got {request.kind!r}")
    # The checkpoint's plain HF files (a sharded checkpoint is consolidated there first).
    weights = ckpt.hf_model_dir(source)
    adapter = (weights / ADAPTER_CONFIG).is_file()
    if adapter and request.kind == "full":
        raise ValueError(f"{source} holds a LoRA adapter: export it 'merged' or as the 'adapter'")
    if not adapter and request.kind != "full":
        raise ValueError(f"{source} holds a full model: there is no adapter to merge or export alone")
    target = Path(request.output_dir)
    if target.exists():
        raise ValueError(f"{target} exists already")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        partial.mkdir()
        if request.kind == "full":
            _copy_model_files(weights, partial)
        elif request.kind == "merged":
            _merge_into_base(request, weights, partial)
        else:
            _copy_adapter(request, weights, partial)
        _save_tokenizer(weights, partial)
        (partial / "README.md").write_text(model_card(request))
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _copy_model_files(weights: Path, out: Path) -> None:
    copied = [
        path for pattern in MODEL_FILE_PATTERNS for path in sorted(weights.glob(pattern)) if path.is_file()
    ]
    if not any(p.name.endswith(".safetensors") for p in copied):
        raise ValueError(f"{weights} has no safetensors weights")
    for path in copied:
        shutil.copy2(path, out / path.name)
    if not (out / "generation_config.json").is_file():
        # A model saved before generation configs existed still gets one (from its config), so
        # `generate` on the export behaves as on the model it came from.
        from transformers import AutoConfig, GenerationConfig

        config = AutoConfig.from_pretrained(str(out))
        GenerationConfig.from_model_config(config).save_pretrained(str(out))


def _load_base(request: ExportRequest) -> Any:
    """The base model as the job built it (`load_base_model`: same class, config overrides and
    kwargs), in the dtype it is stored in unless the job's kwargs chose one, on the CPU."""
    from twinkle_core.hub import resolve_model_id
    from twinkle_core.model.loading import load_base_model

    if request.base_model is None:
        raise ValueError(
            "the job built its base model from a config alone: there are no base weights to merge into"
        )
    return load_base_model(
        resolve_model_id(request.base_model), request.model_cls, request.config, request.kwargs
    )


def _merge_into_base(request: ExportRequest, weights: Path, out: Path) -> None:
    from peft import PeftModel

    base = _load_base(request)
    peft_model = PeftModel.from_pretrained(base, str(weights))
    merged = peft_model.merge_and_unload()
    # A name a reader can use, not a path on the machine that did the export.
    merged.config.name_or_path = request.base_model_name or ""
    merged.save_pretrained(str(out))
    if not (out / "generation_config.json").is_file():
        merged.generation_config.save_pretrained(str(out))


def _copy_adapter(request: ExportRequest, weights: Path, out: Path) -> None:
    shutil.copy2(weights / ADAPTER_WEIGHTS, out / ADAPTER_WEIGHTS)
    config = json.loads((weights / ADAPTER_CONFIG).read_text())
    # Training saved the path the runner loaded the base from (a hub cache dir, a directory on a
    # worker); the export names the base as the job's spec did, which a user can resolve.
    config["base_model_name_or_path"] = request.base_model_name
    config["inference_mode"] = True
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _save_tokenizer(weights: Path, out: Path) -> None:
    """The checkpoint's tokenizer (and with it the chat template), as save_pretrained writes it."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(weights))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{weights}: no tokenizer saved with the checkpoint ({exc})") from exc
    tokenizer.save_pretrained(str(out))


def model_card(request: ExportRequest) -> str:
    base = request.base_model_name
    what = {
        "full": "the full fine-tuned model",
        "merged": "a LoRA adapter merged into its base model",
        "adapter": "a LoRA adapter alone (load it on its base model)",
    }[request.kind]
    front = ["---", f"library_name: {'peft' if request.kind == 'adapter' else 'transformers'}"]
    if base and _is_hf_hub_id(request.base_model):
        # The Hub's card metadata links a base by its repo id; a local path there would be refused.
        front.append(f"base_model: {json.dumps(base)}")
    front += ["tags:", "- twinkle-jobs", "- fine-tuned", "---", ""]
    title = request.job_name or request.job_id
    lines = [
        f"# {title} (step {request.step})",
        "",
        f"Exported by Twinkle Jobs on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}: {what}.",
        "",
        f"- job: `{request.job_id}`" + (f" ({request.job_name})" if request.job_name else ""),
        f"- checkpoint: step {request.step}",
        f"- base model: `{base}`" if base else "- base model: built from a config (no pretrained base)",
        "",
        "## Use",
        "",
        "```python",
    ]
    if request.kind == "adapter":
        lines += [
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f"base = AutoModelForCausalLM.from_pretrained({json.dumps(base or '<the base model>')})",
            'model = PeftModel.from_pretrained(base, "path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    else:
        lines += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    lines += ["```", ""]
    return "\n".join(front + lines)


def _is_hf_hub_id(model_id: str | None) -> bool:
    """`hf://org/name` or a bare `org/name` (not a path): a Hugging Face Hub repo id."""
    if model_id is None or model_id.startswith("ms://"):
        return False
    if model_id.startswith("hf://"):
        return True
    return not model_id.startswith(("/", ".", "~")) and model_id.count("/") == 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a checkpoint as a Hugging Face model folder")
    parser.add_argument("request", help="an ExportRequest as JSON")
    args = parser.parse_args(argv)
    # Its output is a log a person reads (an export's, a job's attempt log for a merged base):
    # no progress bars, nor one library's warnings about another's API.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from twinkle_core.train import silence_library_deprecations

    silence_library_deprecations()
    try:
        export_checkpoint(ExportRequest.read(args.request))
    except ValueError as exc:  # a user error: the message is what the export's `error` says
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
