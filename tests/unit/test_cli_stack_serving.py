"""`twinkle-jobs up`'s serving host and GPUs: it leases one of a pool of two or more (the default),
none on a machine with fewer (it would hold the only GPU training needs for as long as the stack
runs), and what the operator set (TWINKLE_SERVING_GPUS) wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcore.settings import Settings
from twinkle_cli.stack import LocalStack


@pytest.mark.parametrize(
    ("pool", "chosen", "gpus_arg"),
    [("0,1", None, []), ("0", None, ["--gpus", "0"]), ("", None, ["--gpus", "0"]), ("0", 1, [])],
)
def test_a_local_stack_serves_on_the_cpu_unless_a_gpu_is_to_spare(
    tmp_path: Path, pool: str, chosen: int | None, gpus_arg: list[str]
) -> None:
    fields: dict[str, object] = {"data_dir": tmp_path, "worker_gpus": pool}
    if chosen is not None:
        fields["serving_gpus"] = chosen
    args = LocalStack(Settings(**fields))._serve_args()  # type: ignore[arg-type]
    assert args[0] == "serve"
    assert [a for i, a in enumerate(args) if a == "--gpus" or args[i - 1] == "--gpus"] == gpus_arg
