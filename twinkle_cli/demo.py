"""`twinkle-jobs demo`: a real tiny fine-tune through the whole service.

Builds a tiny model, tokenizer and dataset in the data dir (no hub), submits a job over HTTP,
follows its events until it ends and prints where the final checkpoint is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

from jobcore.settings import Settings
from twinkle_client import APIError


def prepare_assets(settings: Settings) -> tuple[Path, Path]:
    """Tiny model + dataset inside the data dir (an allowed root by default); reused if present."""
    from twinkle_core.assets import build_tiny_model, write_text_dataset

    base = settings.data_dir / "demo"
    model_dir = base / "tiny-llama"
    if not (model_dir / "config.json").exists():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar for writing one small file tells a user nothing
        build_tiny_model(model_dir)
    dataset = base / "train.jsonl"
    if not dataset.exists():
        write_text_dataset(dataset, n=256)
    return model_dir, dataset


def demo_spec(model_dir: Path, dataset: Path, steps: int, nproc: int) -> dict[str, Any]:
    return {
        "model": {"model_id": str(model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(dataset), "max_length": 64},
        "training": {
            "max_steps": steps,
            "batch_size": 4 * nproc,
            "log_every": 1,
            "save_every": max(1, steps // 2),
        },
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": nproc},
    }


# The fields that name the demo's files: refused, the server given with --url cannot read them.
DEMO_PATH_PARAMS = ("spec.model.model_id", "spec.data.train_file")


def _hint(error: APIError, own_stack: bool) -> str:
    """What to do when another server cannot read the demo's files: they are in this machine's data dir."""
    if own_stack or error.param not in DEMO_PATH_PARAMS:
        return ""
    return (
        "\nThe demo's model and data are written in this machine's data dir (TWINKLE_DATA_DIR); a server "
        "given with --url must read that dir: run the demo with the server's TWINKLE_DATA_DIR, on its machine"
    )


def run_demo(
    url: str, token: str, settings: Settings, steps: int, nproc: int, timeout: float, *, own_stack: bool
) -> int:
    """The demo against the server at `url`; `own_stack` when the demo started that server (and
    stops it at the end), not a user's running one."""
    try:
        return _run_demo(url, token, settings, steps, nproc, timeout, own_stack=own_stack)
    except httpx.TransportError as exc:
        raise click.ClickException(f"cannot reach the server at {url}: {exc}") from exc


def _run_demo(
    url: str, token: str, settings: Settings, steps: int, nproc: int, timeout: float, *, own_stack: bool
) -> int:
    model_dir, dataset = prepare_assets(settings)
    # Printed so that a second job (from the dashboard's form or the CLI) can reuse them.
    click.echo(f"model:   {model_dir}\ndataset: {dataset}")
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
    body = {"name": "demo", "spec": demo_spec(model_dir, dataset, steps, nproc)}
    resp = client.post("/v1/jobs", json=body)
    if resp.status_code != 201:
        error = APIError.from_response(resp)
        raise click.ClickException(f"submit failed: {error}{_hint(error, own_stack)}")
    job = resp.json()
    click.echo(f"submitted {job['id']} (status {job['status']})")
    after: str | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        params: dict[str, Any] = {"limit": 100}
        if after:
            params["after"] = after
        page = client.get(f"/v1/jobs/{job['id']}/events", params=params).json()
        for event in page["data"]:
            click.echo(f"  [{event['type']:>10}] {event['message']}")
        if page["data"]:
            after = page["last_id"]
        if page.get("has_more"):
            continue
        job = client.get(f"/v1/jobs/{job['id']}").json()
        if job["terminal"]:
            break
        time.sleep(0.5)
    else:
        raise click.ClickException(f"the job did not finish within {timeout:.0f} s (status {job['status']})")
    click.echo(f"job {job['id']} {job['status']}")
    if job["status"] != "succeeded":
        click.echo(f"error: {job.get('error')}", err=True)
        return 1
    checkpoint = (job.get("latest_checkpoint") or {}).get("path")
    click.echo(f"final checkpoint: {checkpoint}")
    click.echo(f"model name: {job.get('fine_tuned_model')}")
    # What a new user does next: the same data dir keeps the job, so `up` serves it; a server the
    # user named with --url serves it already.
    chat = f"`twinkle-jobs chat {job['id']}`"
    if own_stack:
        click.echo(
            f"next: `twinkle-jobs up` (same data dir) serves the dashboard and this model; then {chat}, "
            "or any OpenAI client with that model name"
        )
    else:
        click.echo(f"next: {chat} (with TWINKLE_URL={url}), or any OpenAI client with that model name")
    return 0
