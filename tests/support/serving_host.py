"""A real serving host for tests: tiny checkpoints trained in-process, and the host's HTTP app run
by uvicorn in a thread (no subprocess, no registration), for tests of serving/ and of whatever
talks to it.

`make_checkpoint` trains a tiny model for two steps with twinkle_core's own TransformersModel and
saves it as the runner does (`<jobs root>/<job>/checkpoints/step-2`, COMPLETE marker last), full
or LoRA; `copied_checkpoint` makes a saved model a complete checkpoint as it is, with no training.
`running_host` serves an app on a free port and yields its URL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SECRET = "test-serving-secret"
TEXTS = ["the cat likes small boats.", "a robot builds long books.", "our team reads old maps."]


def copied_checkpoint(model_dir: Path, jobs_root: Path, job: str = "job-1") -> Path:
    """`model_dir` copied into `<jobs root>/<job>/checkpoints/step-1`, made complete."""
    import shutil

    from twinkle_core import checkpoint as ckpt

    final = ckpt.step_dir(jobs_root / job / ckpt.CHECKPOINTS_DIR, 1)
    final.parent.mkdir(parents=True)
    temp = ckpt.temp_dir_for(final)
    shutil.copytree(model_dir, temp)
    return ckpt.finalize(temp, final)


def build_long_context_model(out_dir: Path, tokenizer_dir: Path, max_positions: int = 4096) -> Path:
    """The tiny Llama with a long context (so that a generation can be made to run for seconds),
    with the tokenizer of `tokenizer_dir` (the session's tiny model: training one costs seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle_core.assets import tiny_llama_config

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.save_pretrained(str(out_dir))
    config = tiny_llama_config(len(tokenizer))
    config.max_position_embeddings = max_positions
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(out_dir))
    return out_dir


def make_checkpoint(
    model_dir: Path,
    jobs_root: Path,
    job: str,
    *,
    lora: bool,
    seed: int = 0,
    config: dict[str, Any] | None = None,
) -> Path:
    """`config`: overrides of the stored config, as a job's `model.config` gives them."""
    import torch

    from twinkle_core.model import TransformersModel

    torch.manual_seed(seed)
    model = TransformersModel(model_id=str(model_dir), config=config, mixed_precision="no")
    adapter = None
    if lora:
        adapter = "default"
        # Non-zero from the first step on (lr high): a merged adapter visibly changes the output.
        model.add_adapter_to_model(
            adapter, {"r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
        )
    model.set_optimizer("adamw", lr=5e-2)
    encoded = model.tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    for _ in range(2):
        model.forward_backward(inputs={**encoded, "labels": labels}, adapter_name=adapter)
        model.clip_grad_and_step(adapter_name=adapter)
    return Path(model.save("step-2", output_dir=jobs_root / job / "checkpoints"))


def twinkle_key(checkpoint: Path, name: str, base_model: Path | None = None, **base: Any) -> dict[str, Any]:
    """`base`: how the job built its base (`base_model_cls`, `base_config`, `base_kwargs`)."""
    return {
        "checkpoint": str(checkpoint),
        "base_model": str(base_model) if base_model else None,
        "model": name,
        **base,
    }


@contextmanager
def running_host(app: Any) -> Iterator[str]:
    import uvicorn

    from serving.host import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the serving host did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
