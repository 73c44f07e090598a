"""The torchrun command line and environment of one job attempt (an argument list, never a shell)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUNNER = "twinkle_core.train"
DEFAULT_TORCHRUN = "twinkle-torchrun"  # worker/torchrun_entry.py; jobcore.settings' default
DEFAULT_JOIN_TIMEOUT_SECONDS = 300.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttemptPaths:
    """Where an attempt's files go. Nodes other than 0 of a multi-node job log under
    `logs/attempt-<k>-ranks/node-<i>/`, which the server's log reader attributes to attempt k."""

    job_dir: Path
    attempt: int
    node_rank: int | None = None  # None: a single-node job

    @property
    def spec(self) -> Path:
        return self.job_dir / "spec.json"

    @property
    def logs(self) -> Path:
        return self.job_dir / "logs"

    @property
    def log(self) -> Path:
        if self.node_rank:
            return self.rank_logs / "torchrun.log"
        return self.logs / f"attempt-{self.attempt}.log"

    @property
    def rank_logs(self) -> Path:
        ranks = self.logs / f"attempt-{self.attempt}-ranks"
        return ranks if self.node_rank is None else ranks / f"node-{self.node_rank}"


@dataclass(frozen=True)
class Rendezvous:
    """How the nodes of a multi-node attempt find each other: torch's c10d rendezvous, hosted by
    node 0's torchrun at the address and port node 0 published in its `gang_members` row."""

    nnodes: int
    node_rank: int
    address: str
    port: int
    # How long torchrun waits for every node to reach the rendezvous (torch's `join_timeout`);
    # past it torchrun exits non-zero and the attempt fails as an infra error.
    join_timeout_seconds: float = DEFAULT_JOIN_TIMEOUT_SECONDS

    @property
    def local_addr(self) -> str:
        """The name this node gives itself in the rendezvous.

        c10d assigns node ranks by sorting the nodes' (local address, pid) pairs, not by
        `--node-rank`. Node 0 must hold global rank 0 (its supervisor ingests progress.jsonl and
        its rank 0 writes the checkpoints), so node 0 names itself by its published address and
        node i by that address plus a suffix, which sorts after it (and the suffixes in node
        order). torch uses the name as an address only on the node that gets rank 0 (it hosts
        the process group's store there): always node 0, whose name is its real address.
        """
        if self.node_rank == 0:
            return self.address
        return f"{self.address}~node{self.node_rank:05d}"

    def torchrun_args(self, run_id: str) -> list[str]:
        conf = f"is_host={int(self.node_rank == 0)},join_timeout={max(1, round(self.join_timeout_seconds))}"
        return [
            "--nnodes",
            str(self.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{self.address}:{self.port}",
            "--rdzv-id",
            run_id,
            # Node 0's torchrun hosts the c10d store (on the published port); the others connect.
            "--rdzv-conf",
            conf,
            "--local-addr",
            self.local_addr,
        ]


def resolve_torchrun(configured: str) -> str:
    """An absolute torchrun path: PATH first, then next to this interpreter (a venv not on PATH).

    The default, `twinkle-torchrun`, is an entry point of this package: an editable install made
    before it existed has no such script until it is installed again, so torchrun itself is
    used then (with a warning) rather than failing every job."""
    found = _executable(configured)
    if found is None and configured == DEFAULT_TORCHRUN:
        found = _executable("torchrun")
        if found is not None:
            log.warning(
                "%s is not installed (reinstall the package: pip install -e .); using %s",
                DEFAULT_TORCHRUN,
                found,
            )
    if found is None:
        raise FileNotFoundError(f"torchrun executable '{configured}' not found (TWINKLE_TORCHRUN)")
    return found


def _executable(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    sibling = Path(sys.executable).parent / name
    return str(sibling) if sibling.exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def runner_target(runner: str) -> list[str]:
    """`-m module` for a module name, the path itself for a script (a `.py` file)."""
    return [runner] if runner.endswith(".py") else ["-m", runner]


def torchrun_argv(
    torchrun: str,
    nproc_per_node: int,
    paths: AttemptPaths,
    resume_from: str | None,
    runner: str,
    rendezvous: Rendezvous | None = None,
) -> list[str]:
    if rendezvous is None:
        rdzv = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    else:
        rdzv = rendezvous.torchrun_args(run_id=f"{paths.job_dir.name}-{paths.attempt}")
    argv = [
        torchrun,
        "--nproc_per_node",
        str(nproc_per_node),
        *rdzv,
        # Per-rank logs under logs/attempt-<k>-ranks, also teed into the attempt log.
        "--log-dir",
        str(paths.rank_logs),
        "--redirects",
        "3",
        "--tee",
        "3",
        *runner_target(runner),
        str(paths.spec),
    ]
    if resume_from:
        argv += ["--resume-from", resume_from]
    return argv


def runner_env(job_id: str, job_dir: Path, gpu_ids: list[str]) -> dict[str, str]:
    env = dict(os.environ)  # HF_HUB_OFFLINE and friends pass through
    env["PYTHONUNBUFFERED"] = "1"
    env["TWINKLE_JOB_ID"] = job_id
    env["TWINKLE_JOB_DIR"] = str(job_dir)
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    # Ranks share the machine's cores (on CPU they are the compute): one thread each unless the
    # operator says otherwise, to avoid oversubscription.
    env.setdefault("OMP_NUM_THREADS", "1")
    # Teed lines carry the global rank, which (unlike the local rank) is unambiguous across nodes.
    env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:")
    return env
