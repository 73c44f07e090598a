"""Launch a script or module under torchrun from a test, with a hub-free, single-threaded env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent


def torch_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    return env


def torchrun(
    args: list[str],
    nproc: int = 2,
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun --nproc_per_node=<nproc> <args>` (in `env`, default `torch_env()`); returns the
    completed process (output captured)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--standalone",
        *args,
    ]
    return subprocess.run(
        command, env=env or torch_env(), cwd=cwd or REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )
