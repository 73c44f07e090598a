"""Where an attempt's runner runs: torchrun on this worker's host, or a Ray job on a Ray cluster.

The supervisor starts the runner command through `start_attempt` and then drives the result only
through `RunningAttempt` (poll / wait, the process ids it may record, the pause signal, the stop
sequence, the clean-up after exit), so progress ingestion, heartbeats, cancel, classification and
the resume-from-checkpoint retry are the same code for both launchers (see docs/ray.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from worker.process_tree import ProcessTree, kill_all

Launcher = Literal["torchrun", "ray", "slurm"]
LAUNCHERS: tuple[Launcher, ...] = ("torchrun", "ray", "slurm")


class RunningAttempt(Protocol):
    """One started attempt, however it runs."""

    @property
    def description(self) -> str:
        """What was started, for the job's "launched ..." event."""
        ...

    def poll(self) -> int | None:
        """None while it runs, else its exit code (as `outcome.classify` reads exit codes)."""
        ...

    def wait(self) -> int: ...

    def refresh(self) -> bool:
        """Look for new local processes; True when `pids()` changed."""
        ...

    def pids(self) -> list[int]:
        """The local processes of the attempt (recorded on the job for orphan clean-up)."""
        ...

    @property
    def can_signal(self) -> bool:
        """Whether `signal_ranks` can reach the ranks (the pause signal, SIGUSR1)."""
        ...

    def signal_ranks(self, sig: int) -> int:
        """Send `sig` to every rank; how many got it."""
        ...

    def terminate(self, grace_seconds: float) -> None:
        """Stop it: SIGTERM first, SIGKILL whatever is left after `grace_seconds`."""
        ...

    def reap(self) -> None:
        """After it exited: end any process that outlived it."""
        ...


class TorchrunAttempt:
    """torchrun started here, in a new session, followed through its process tree."""

    def __init__(self, proc: subprocess.Popen[bytes], log_name: str) -> None:
        self.proc = proc
        self.tree = ProcessTree(proc.pid)
        self._log_name = log_name

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> TorchrunAttempt:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        return cls(proc, log_path.name)

    @property
    def description(self) -> str:
        return f"launched torchrun (pid {self.proc.pid}), log {self._log_name}"

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        return self.proc.wait()

    def refresh(self) -> bool:
        return self.tree.refresh()

    def pids(self) -> list[int]:
        return self.tree.pids()

    can_signal = True

    def signal_ranks(self, sig: int) -> int:
        return self.tree.signal_ranks(sig)

    def terminate(self, grace_seconds: float) -> None:
        self.tree.terminate(grace_seconds)

    def reap(self) -> None:
        kill_all(self.tree.members.values())  # ranks that outlived torchrun


# Submits the runner command (argv, env) to Slurm for one attempt (worker.slurm_launcher).
SlurmSubmitter = Callable[[list[str], dict[str, str]], RunningAttempt]


@dataclass(frozen=True)
class AttemptTarget:
    """Everything `start_attempt` needs to know about the attempt besides its command."""

    job_id: str
    attempt: int
    launcher: str
    nproc_per_node: int
    gpu_ids: list[str]


def start_attempt(
    target: AttemptTarget,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    ray_address: str | None,
    slurm: SlurmSubmitter | None = None,
) -> RunningAttempt:
    """Start `argv` with the attempt's launcher (`slurm`: the worker's Slurm submission, bound to
    the attempt, worker.slurm_launcher; None on a worker without TWINKLE_SLURM)."""
    if target.launcher == "torchrun":
        return TorchrunAttempt.start(argv, env, cwd, log_path)
    if target.launcher == "slurm":
        if slurm is None:
            # The claim never gives such a job to this worker; a stale assignment is a bug.
            raise RuntimeError("a launcher='slurm' job reached a worker without TWINKLE_SLURM")
        return slurm(argv, env)
    if target.launcher == "ray":
        if not ray_address:
            # The claim never gives such a job to this worker; a stale assignment is a bug.
            raise RuntimeError("a launcher='ray' job reached a worker without TWINKLE_RAY_ADDRESS")
        from worker.ray_launcher import RayJobAttempt

        return RayJobAttempt.submit(
            ray_address,
            target.job_id,
            target.attempt,
            argv,
            env,
            cwd,
            log_path,
            # One CPU per rank, and one GPU per rank when the Ray cluster has GPUs: the worker
            # leases none of its own for a job Ray places (worker.ray_launcher).
            num_cpus=float(target.nproc_per_node),
            num_gpus=None,
        )
    raise ValueError(f"unknown launcher {target.launcher!r}; expected one of {LAUNCHERS}")
