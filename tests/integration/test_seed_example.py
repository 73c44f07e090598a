"""The seed's usage example, read from ../shared/seed/TransformersModel.md and run as written.

Only the `...` placeholders are filled (a dataset, a LoRA config, an optimizer, the loop's
arguments); every other character of the example is the seed's, including its `twinkle` imports,
`ms://Qwen/Qwen3.5-4B`, `DeviceMesh.from_sizes(dp_size=2, fsdp_size=2)`, the default strategy,
`remote_group='actor'` and `gradient_accumulation_steps=16`. The hub id is served by a local
stand-in for the `modelscope` package (no network). A short set-up before the example (seeding,
the data set) and a save after it are ours. It runs twice: under `torchrun --nproc_per_node 4`
(gloo; `remote_group` is ignored there) and as a Ray driver (four actors). Both train, the loss
falls, and both give the same adapter bit for bit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dist_scripts.launch import REPO_ROOT, torch_env, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED_DOC = REPO_ROOT.parent / "shared" / "seed" / "TransformersModel.md"
HUB_ID = "Qwen/Qwen3.5-4B"
ADAPTER = "adapter_model.safetensors"

# The example's placeholders in order of appearance, and what fills each.
FILLS = (
    "train_dataset, batch_size=4, device_mesh=DeviceMesh.from_sizes(dp_size=2, fsdp_size=2), "
    "remote_group='actor'",  # DataLoader(...)
    "'lora', lora_config",  # model.add_adapter_to_model(...)
    "optimizer_cls='AdamW', lr=1e-2",  # model.set_optimizer(..., adapter_name='...')
    "lora",  # ... adapter_name='...'
    "inputs=data, adapter_name='lora'",  # model.forward_backward(...)
    "max_grad_norm=1.0, adapter_name='lora'",  # model.clip_grad_and_step(..., gradient_accumulation_steps=16)
)

# Ours, before the example: the run's mode and seed, and the data set its DataLoader reads.
SET_UP = """
import sys
from pathlib import Path

from transformers import AutoTokenizer

import twinkle
from twinkle.dataset import Dataset

out, data_file, tokenizer_dir, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if mode == "ray":
    twinkle.initialize(
        mode="ray", seed=0, num_cpus=4, num_gpus=0, include_dashboard=False,
        object_store_memory=100 * 1024**2, log_to_driver=False,
    )
else:
    twinkle.initialize(mode="local", seed=0)
train_dataset = Dataset(data_file, AutoTokenizer.from_pretrained(tokenizer_dir), max_length=32)
lora_config = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}
"""

# Ours, after the example: keep what it trained.
SAVE = """
model.save("final", output_dir=str(out), adapter_name="lora")
twinkle.shutdown()
"""

# A stand-in for the `modelscope` package: its snapshot_download copies a local model and logs
# the call, so the library's real ms:// path (cache, one download per node) runs without a hub.
FAKE_MODELSCOPE = """
import os
import shutil


def snapshot_download(model_id, local_dir=None, **kwargs):
    with open(os.environ["FAKE_MODELSCOPE_LOG"], "a") as log:
        log.write(model_id + "\\n")
    shutil.copytree(os.environ["FAKE_MODELSCOPE_SOURCE"], local_dir, dirs_exist_ok=True)
    return local_dir
"""


def seed_example() -> str:
    """The code block under "Usage example:" in the seed's TransformersModel.md, verbatim."""
    if not SEED_DOC.is_file():
        pytest.skip(f"the seed's document is not beside this checkout ({SEED_DOC})")
    usage = SEED_DOC.read_text().split("Usage example:", 1)[1]
    match = re.search(r"```python\n(.*?)```", usage, re.DOTALL)
    assert match, "no python block after 'Usage example:'"
    return match.group(1)


def fill_placeholders(code: str, fills: tuple[str, ...]) -> str:
    parts = code.split("...")
    assert len(parts) == len(fills) + 1, (
        f"the example has {len(parts) - 1} placeholders, we fill {len(fills)}"
    )
    filled = "".join(part + fill for part, fill in zip(parts, fills, strict=False)) + parts[-1]
    # Nothing but the placeholders changed: removing the fills gives the seed's text back.
    assert filled.count("...") == 0
    return filled


def write_driver(path: Path) -> Path:
    path.write_text(
        textwrap.dedent(SET_UP) + fill_placeholders(seed_example(), FILLS) + textwrap.dedent(SAVE)
    )
    return path


def test_fill_keeps_every_line_of_the_seed() -> None:
    code = seed_example()
    filled = fill_placeholders(code, FILLS)
    pattern = re.escape(code).replace(re.escape("..."), "(.*?)")
    match = re.fullmatch(pattern, filled, re.DOTALL)
    assert match is not None and match.groups() == FILLS
    for line in (
        "from twinkle.model import TransformersModel",
        "from twinkle import DeviceMesh",
        "from twinkle.dataloader import DataLoader",
        "model = TransformersModel(model_id='ms://Qwen/Qwen3.5-4B', "
        "device_mesh=DeviceMesh.from_sizes(dp_size=2, fsdp_size=2), remote_group='actor')",
    ):
        assert line in filled.splitlines()


def _run_env(tmp: Path, tiny_model_dir: Path) -> dict[str, str]:
    fake = tmp / "fake-modules" / "modelscope"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_MODELSCOPE)
    env = torch_env()
    env.update(
        PYTHONPATH=os.pathsep.join([str(fake.parent), env["PYTHONPATH"]]),
        FAKE_MODELSCOPE_SOURCE=str(tiny_model_dir),
        FAKE_MODELSCOPE_LOG=str(tmp / "downloads.log"),
        TWINKLE_HUB_CACHE=str(tmp / "hub"),
        TWINKLE_CACHE_DIR=str(tmp / "datasets"),
        RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
    )
    return env


def _mean_loss(model_dir: Path, adapter_dir: Path | None, data_file: Path) -> float:
    """Token-mean loss of the first 64 samples, in fp32 with plain transformers (and peft)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle.dataloader import PadCollator
    from twinkle.dataset import Dataset

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset(str(data_file), tokenizer, max_length=32, cache_dir=data_file.parent / "eval-cache")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = PadCollator(pad_id)([dataset[i] for i in range(64)])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:]
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1)))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from twinkle.assets import write_text_dataset

    # 256 samples: a global batch of 4 and 16 micro-batches a step make 4 optimizer steps.
    return write_text_dataset(tmp_path_factory.mktemp("seed-data") / "train.jsonl", n=256)


def _trained_adapter(tmp: Path, tiny_model_dir: Path, data_file: Path, mode: str) -> dict[str, object]:
    from safetensors.torch import load_file

    adapter = tmp / "final"
    assert (adapter / ADAPTER).is_file(), f"{mode}: no adapter saved"
    # The ms:// id went through the hub code path: downloaded once (one node), then from the cache.
    assert (tmp / "downloads.log").read_text().splitlines() == [HUB_ID]
    base = _mean_loss(tiny_model_dir, None, data_file)
    trained = _mean_loss(tiny_model_dir, adapter, data_file)
    assert trained < base - 0.1, f"{mode}: the loss did not fall ({base:.4f} -> {trained:.4f})"
    return dict(load_file(str(adapter / ADAPTER)))


@pytest.fixture(scope="module")
def torchrun_adapter(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, data_file: Path
) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("seed-torchrun")
    driver = write_driver(tmp / "seed_example.py")
    env = _run_env(tmp, tiny_model_dir)
    command = [str(driver), str(tmp), str(data_file), str(tiny_model_dir), "local"]
    proc = torchrun(command, nproc=4, env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # The default strategy on CPU says once that it shards through native FSDP2.
    assert proc.stderr.count("strategy='accelerate' runs as native FSDP2") == 1, proc.stderr[-3000:]
    return _trained_adapter(tmp, tiny_model_dir, data_file, "torchrun")


def test_seed_example_trains_under_torchrun(torchrun_adapter: dict[str, object]) -> None:
    assert torchrun_adapter


def test_seed_example_trains_as_a_ray_driver(
    tmp_path: Path, tiny_model_dir: Path, data_file: Path, torchrun_adapter: dict[str, object]
) -> None:
    pytest.importorskip(
        "ray", reason="ray is not installed (optional group: pip install 'twinkle-jobs[ray]')"
    )
    import torch

    driver = write_driver(tmp_path / "seed_example.py")
    env = _run_env(tmp_path, tiny_model_dir)
    command = [sys.executable, str(driver), str(tmp_path), str(data_file), str(tiny_model_dir), "ray"]
    proc = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-6000:]
    ray_adapter = _trained_adapter(tmp_path, tiny_model_dir, data_file, "ray")
    # Four actors fed by one driver-side DataLoader train exactly what four torchrun ranks train.
    assert ray_adapter.keys() == torchrun_adapter.keys()
    different = [k for k in ray_adapter if not torch.equal(ray_adapter[k], torchrun_adapter[k])]  # type: ignore[arg-type]
    assert not different, f"Ray and torchrun adapters differ: {different[:5]}"
