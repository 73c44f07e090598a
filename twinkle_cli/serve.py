"""`twinkle-jobs serve`: run an inference host (serving/) that the API server relays
`/v1/chat/completions` and `/v1/completions` to. Options override the TWINKLE_SERVING_* settings."""

from __future__ import annotations

from typing import Any

import click

from jobcore.settings import get_settings


@click.command()
@click.option("--host", default=None, help="Interface to listen on [TWINKLE_SERVING_HOST, 127.0.0.1]")
@click.option("--port", default=None, type=int, help="Port; 0 picks a free one [TWINKLE_SERVING_PORT, 8001]")
@click.option(
    "--url", default=None, help="URL the API server reaches this host at [default: http://host:port]"
)
@click.option("--engine", type=click.Choice(["auto", "transformers", "vllm"]), default=None)
@click.option("--slots", type=click.IntRange(min=1), default=None, help="Generations at once")
@click.option(
    "--memory-bytes", type=click.IntRange(min=1), default=None, help="Bound on loaded models' bytes"
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=None,
    help="GPUs to lease from this machine's pool; 0: serve on the CPU [TWINKLE_SERVING_GPUS, 1]",
)
def serve(
    host: str | None,
    port: int | None,
    url: str | None,
    engine: str | None,
    slots: int | None,
    memory_bytes: int | None,
    gpus: int | None,
) -> None:
    """Run an inference host: loads fine-tuned checkpoints on demand and keeps the recent ones warm."""
    from serving.host import run_host

    chosen = {
        "host": host,
        "port": port,
        "url": url,
        "engine": engine,
        "slots": slots,
        "memory_bytes": memory_bytes,
        "gpus": gpus,
    }
    update: dict[str, Any] = {f"serving_{name}": value for name, value in chosen.items() if value is not None}
    run_host(get_settings().model_copy(update=update))
