"""What the worker hands a multi-node Ray job, without Ray: the plan its driver reads, the file the
worker asks for a pause through, and each node's torchrun command.

A Ray job of `nnodes > 1` runs `python -m worker.ray_gang <plan>` as its entrypoint (see
worker.ray_gang). The plan and the signal file live in the job directory, which the worker and
the Ray nodes share already (progress.jsonl is read from there; see docs/ray.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from worker.launch import Rendezvous

# Options of our torchrun command (worker.launch.torchrun_argv) that a node replaces with its own:
# the single-node rendezvous the supervisor wrote, and the log directory (one per node).
NODE_OPTIONS = frozenset(
    {
        "--nnodes",
        "--node-rank",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--rdzv-conf",
        "--local-addr",
    }
)
LOG_DIR_OPTION = "--log-dir"
# Set in each node's torchrun environment: which node of the gang this is (tests, debugging).
NODE_RANK_ENV = "TWINKLE_RAY_NODE_RANK"


@dataclass(frozen=True)
class GangPlan:
    """One attempt of a multi-node Ray job, as its driver needs it."""

    job_id: str
    attempt: int
    job_dir: str
    nnodes: int
    nproc_per_node: int
    argv: list[str]  # the supervisor's single-node torchrun command; node_argv derives each node's
    env: dict[str, str]
    join_timeout_seconds: float  # torchrun's rendezvous join timeout
    stop_grace_seconds: float  # SIGTERM to SIGKILL, per node, when the driver stops the gang

    @property
    def name(self) -> str:
        """The placement group's name: the Ray job's submission id (one group per attempt)."""
        return f"twinkle-{self.job_id}-attempt-{self.attempt}"

    def dump(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> GangPlan:
        return cls(**json.loads(path.read_text()))


def plan_path(job_dir: Path, attempt: int) -> Path:
    return job_dir / "ray" / f"attempt-{attempt}.json"


def signal_path(job_dir: Path, attempt: int) -> Path:
    """Where the worker asks the driver to signal every node's ranks (Ray's job API cannot)."""
    return job_dir / "ray" / f"attempt-{attempt}.signal"


def request_signal(job_dir: Path, attempt: int, sig: int) -> None:
    path = signal_path(job_dir, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{int(sig)}\n")
    os.replace(tmp, path)  # the driver never reads half a number


def take_signal_request(job_dir: Path, attempt: int) -> int | None:
    """The signal the worker asked for since the last call, if any (the request is consumed)."""
    path = signal_path(job_dir, attempt)
    try:
        text = path.read_text()
        path.unlink()
    except FileNotFoundError:
        return None
    return int(text.strip())


def node_argv(argv: list[str], rendezvous: Rendezvous, run_id: str, rank_logs: Path) -> list[str]:
    """Node `rendezvous.node_rank`'s torchrun command, from the supervisor's single-node one.

    `argv` is `torchrun_argv`'s shape: the torchrun path, `--option value` pairs, then the runner
    and its arguments. The node keeps every option but the rendezvous and the log directory, and
    gets, in their places, the gang's rendezvous (node 0 hosts it) and its own
    `attempt-<k>-ranks/node-<i>` logs: what `torchrun_argv` gives a node of a gang of workers.
    """
    out = [argv[0]]
    rendezvous_placed = False
    index = 1
    while index < len(argv) and argv[index].startswith("--"):
        assert index + 1 < len(argv), f"torchrun option {argv[index]} without a value"
        flag, value = argv[index], argv[index + 1]
        if flag in NODE_OPTIONS:
            if not rendezvous_placed:
                out += rendezvous.torchrun_args(run_id)
                rendezvous_placed = True
        elif flag == LOG_DIR_OPTION:
            out += [LOG_DIR_OPTION, str(rank_logs)]
        else:
            out += [flag, value]
        index += 2
    if not rendezvous_placed:
        out += rendezvous.torchrun_args(run_id)
    return out + argv[index:]
