"""What a Slurm attempt submits: the `sbatch` command line and the batch script it runs.

The batch script runs on the first node of the allocation and starts one torchrun per node with
`srun` (one task per node), with torch's static rendezvous on the first node: Slurm already
placed every node, so each torchrun knows its node rank (`SLURM_NODEID`) and the world, and the
first node (where the batch script runs) hosts the store. The job is submitted with `--requeue`:
on a node failure or a preemption Slurm puts it back in its queue and runs the script again,
which then resumes from the newest complete checkpoint in the job directory (the job directory
must be on storage the worker and the nodes share).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

# The supervisor's torchrun options that Slurm's placement replaces (each takes one value).
_PLACEMENT_OPTIONS = frozenset(
    {"--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--local-addr", "--log-dir"}
)
RESUME_OPTION = "--resume-from"


@dataclass(frozen=True)
class SlurmRequest:
    """The allocation of one attempt, in Slurm's terms."""

    job_name: str
    nodes: int
    gpus_per_node: int  # 0: ask for no GPUs (a CPU-only cluster)
    cpus_per_node: int
    partition: str | None
    account: str | None
    time_limit_seconds: float | None
    output: Path
    workdir: Path
    comment: str = ""


def sbatch_argv(sbatch: str, request: SlurmRequest, script: Path) -> list[str]:
    """`sbatch --parsable ...` for `request`: prints the new job's id."""
    argv = [
        sbatch,
        "--parsable",
        f"--job-name={request.job_name}",
        f"--nodes={request.nodes}",
        "--ntasks-per-node=1",  # one torchrun per node; torchrun starts the node's ranks
        f"--cpus-per-task={request.cpus_per_node}",
        "--requeue",  # node failure, preemption: Slurm runs the script again (it resumes)
        f"--output={request.output}",
        "--open-mode=append",  # a requeued run adds to the attempt's log instead of replacing it
        f"--chdir={request.workdir}",
        "--export=ALL",
    ]
    if request.gpus_per_node:
        argv.append(f"--gpus-per-node={request.gpus_per_node}")
    if request.partition:
        argv.append(f"--partition={request.partition}")
    if request.account:
        argv.append(f"--account={request.account}")
    if request.time_limit_seconds:
        argv.append(f"--time={slurm_minutes(request.time_limit_seconds)}")
    if request.comment:
        argv.append(f"--comment={request.comment}")
    return [*argv, str(script)]


def slurm_minutes(seconds: float) -> str:
    """A time limit as Slurm's `--time` minutes, rounded up (Slurm's limits are whole minutes)."""
    return str(max(1, math.ceil(seconds / 60)))


def split_torchrun_argv(argv: list[str]) -> tuple[list[str], list[str], str | None]:
    """The supervisor's `torchrun_argv` taken apart: (torchrun and its per-node options, the runner
    command, the checkpoint to resume from). The rendezvous and log options are dropped: the batch
    script sets them per node."""
    torchrun, options, resume = [argv[0]], list(argv[1:]), None
    if RESUME_OPTION in options:
        at = options.index(RESUME_OPTION)
        resume = options[at + 1]
        del options[at : at + 2]
    kept: list[str] = []
    i = 0
    while i < len(options):
        option = options[i]
        if option in _PLACEMENT_OPTIONS:
            i += 2
            continue
        if option.startswith("-") and option not in ("-m",):
            kept += options[i : i + 2]  # every other torchrun option takes one value
            i += 2
            continue
        break  # the runner: `-m module spec.json` or `script.py spec.json`
    return torchrun + kept, options[i:], resume


def batch_script(
    argv: list[str], rank_logs: Path, python: str, job_dir: Path, env: dict[str, str] | None = None
) -> str:
    """The batch script for the supervisor's torchrun `argv` (see the module doc).

    `python` finds the newest complete checkpoint after a requeue (through
    `twinkle_core.checkpoint`, the one owner of the layout); `env` is exported at the top, for
    what must reach the nodes even where sbatch's environment does not.
    """
    torchrun, runner, resume = split_torchrun_argv(argv)
    q = shlex.quote
    newest = (
        "import sys; from twinkle_core.checkpoint import latest_complete_checkpoint as f; "
        "print(f(sys.argv[1]) or '')"
    )
    lines = [
        "#!/bin/bash",
        "# Written by the Twinkle worker for one attempt (worker/slurm_batch.py).",
        "set -euo pipefail",
        *(f"export {name}={q(value)}" for name, value in sorted((env or {}).items())),
        f"resume={q(resume or '')}",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        "  # Requeued by Slurm (node failure, preemption): go on from the newest complete checkpoint.",
        f"  newest=$({q(python)} -c {q(newest)} {q(str(job_dir))})",
        '  if [ -n "$newest" ]; then resume=$newest; fi',
        '  echo "slurm: restart ${SLURM_RESTART_COUNT} of job ${SLURM_JOB_ID}," \\',
        '    "resuming from ${resume:-the start}"',
        "fi",
        "resume_args=()",
        'if [ -n "$resume" ]; then resume_args=(--resume-from "$resume"); fi',
        "# The rendezvous: torch's static one, hosted on this (the first) node.",
        'export MASTER_ADDR="$(hostname)"',
        f"export MASTER_PORT=$({q(python)} -c {q(_FREE_PORT)})",
        # One task per node; the resume arguments go in as the inner shell's "$@". torchrun
        # ignores SIGUSR1 (inherited as ignored; it would die of it): the pause signal, sent with
        # `scancel --signal=USR1` to every process of the step, is for the ranks, whose runner
        # installs its own handler.
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "
        + q(
            "trap '' USR1; exec "
            + shlex.join(torchrun)
            + ' --nnodes "$SLURM_JOB_NUM_NODES" --node-rank "$SLURM_NODEID"'
            + ' --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"'
            + f" --log-dir {q(str(rank_logs))}"
            + '/node-"$SLURM_NODEID"-restart-"${SLURM_RESTART_COUNT:-0}" '
            + shlex.join(runner)
            + ' "$@"'
        )
        + ' bash "${resume_args[@]}"',
    ]
    return "\n".join(lines) + "\n"


_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
