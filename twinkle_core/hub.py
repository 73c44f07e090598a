"""Model id resolution: a local directory, `hf://org/name`, `ms://org/name`, or a bare hub id.

Hub models are downloaded once into a cache directory (`TWINKLE_HUB_CACHE`, default
`~/.cache/twinkle/hub`) and reused from there afterwards. A bare id goes to the hub named by
`TWINKLE_DEFAULT_HUB` ("hf" unless configured otherwise). Tests replace `download_snapshot`.
"""

from __future__ import annotations

import os
from pathlib import Path

HUB_SCHEMES = {"hf://": "hf", "ms://": "ms"}
COMPLETE_MARKER = ".twinkle-download-complete"


def hub_cache_dir() -> Path:
    return Path(os.environ.get("TWINKLE_HUB_CACHE", Path.home() / ".cache" / "twinkle" / "hub"))


def parse_model_id(model_id: str) -> tuple[str | None, str]:
    """Split a model id into (hub, repo id); hub is None for an existing local directory."""
    for prefix, hub in HUB_SCHEMES.items():
        if model_id.startswith(prefix):
            repo = model_id[len(prefix) :].strip("/")
            if repo.count("/") != 1 or not all(repo.split("/")):
                raise ValueError(f"model_id {model_id!r}: expected {prefix}org/name")
            return hub, repo
    if Path(model_id).expanduser().is_dir():
        return None, str(Path(model_id).expanduser())
    if model_id.startswith(("/", "./", "../", "~")):
        raise ValueError(f"model_id {model_id!r}: the local directory does not exist")
    default_hub = os.environ.get("TWINKLE_DEFAULT_HUB", "hf")
    if default_hub not in ("hf", "ms"):
        raise ValueError(f"TWINKLE_DEFAULT_HUB must be 'hf' or 'ms', got {default_hub!r}")
    return default_hub, model_id


def resolve_model_id(model_id: str) -> Path:
    """A local directory holding the model: the directory itself, or the hub download (cached)."""
    hub, repo = parse_model_id(model_id)
    if hub is None:
        return Path(repo)
    target = hub_cache_dir() / hub / repo.replace("/", "--")
    if (target / COMPLETE_MARKER).exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    download_snapshot(hub, repo, target)
    # The marker says the download finished; an interrupted download is fetched again.
    (target / COMPLETE_MARKER).write_text(repo)
    return target


def download_snapshot(hub: str, repo_id: str, local_dir: Path) -> None:
    """Fetch every file of `repo_id` from `hub` into `local_dir`."""
    if hub == "hf":
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo_id, local_dir=str(local_dir))
        return
    try:
        from modelscope import snapshot_download as ms_snapshot_download
    except ImportError as exc:
        raise ValueError(
            f"model_id ms://{repo_id} needs the optional dependency modelscope: "
            "pip install 'twinkle-jobs[modelscope]'"
        ) from exc
    ms_snapshot_download(repo_id, local_dir=str(local_dir))
