"""A tiny job trained from a hub dataset id (`hf://datasets/org/name`) with a column mapping.

No network (HF_HUB_OFFLINE=1): the dataset repository lies in the worker's hub cache, in the layout
a download leaves there (`<TWINKLE_HUB_CACHE>/datasets/org--name/data/<split>-*.parquet` and the
marker of a finished download), so the runner reads it through `datasets.load_dataset` as it would
after fetching it.
"""

from __future__ import annotations

import json
from pathlib import Path

from dist_scripts.launch import torch_env, torchrun
from test_train_runner import events, write_job

from twinkle_core.assets import demo_sentences
from twinkle_core.dataset import hub


def _rows(n: int, seed: int) -> dict[str, list[object]]:
    sentences = demo_sentences(n, seed)
    return {
        "question": [" ".join(s.split(" ")[:2]) for s in sentences],
        "answer": [" " + " ".join(s.split(" ")[2:]) for s in sentences],
        "source": ["demo"] * n,
    }


def test_job_trains_from_a_hub_dataset_with_a_column_mapping(tmp_path: Path, tiny_model_dir: Path) -> None:
    import datasets

    cache = tmp_path / "hub"
    repo = cache / "datasets" / "org--qa"
    (repo / "data").mkdir(parents=True)
    for split, rows in (("train", _rows(64, 0)), ("validation", _rows(8, 3))):
        datasets.Dataset.from_dict(rows).to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
    (repo / hub.COMPLETE_MARKER).write_text("org/qa")

    spec = write_job(tmp_path / "job", tiny_model_dir, tmp_path, training={"max_steps": 8, "eval_every": 4})
    body = json.loads(spec.read_text())
    body["data"] = {
        "train_file": "hf://datasets/org/qa",
        "validation_split": "validation",
        "columns": {"prompt": "question", "completion": "answer"},
        "max_length": 32,
    }
    spec.write_text(json.dumps(body))
    env = {**torch_env(), "TWINKLE_HUB_CACHE": str(cache), "TWINKLE_CACHE_DIR": str(tmp_path / "cache")}
    proc = torchrun(["-m", "twinkle_core.train", str(spec)], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = events(spec.parent)
    assert log[-1]["event"] == "done", log[-3:]
    losses = [e["loss"] for e in log if e["event"] == "step"]
    evals = [e["eval_loss"] for e in log if e["event"] == "eval"]
    assert len(losses) == 8 and len(evals) == 2
    assert sum(losses[-2:]) < sum(losses[:2]) and evals[1] < evals[0], (losses, evals)
    assert (tmp_path / "cache" / "hf-datasets").is_dir()  # datasets' own cache went to the worker's
