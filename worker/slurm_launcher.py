"""Hand a job attempt to Slurm: the allocation it asks for, from the spec, the job row and the
worker's Slurm settings, then `SlurmJobAttempt.submit` (worker.slurm_attempt).

- nodes = `resources.nnodes`, one task (one torchrun) per node;
- GPUs per node = `resources.nproc_per_node` (none with TWINKLE_SLURM_GPUS=false: a CPU cluster);
- CPUs per node = `nproc_per_node` x TWINKLE_SLURM_CPUS_PER_RANK;
- partition = `resources.partition`, else TWINKLE_SLURM_PARTITION, else the cluster's default;
- account = the project's `slurm_account` (set by the operator through the admin API), else
  TWINKLE_SLURM_ACCOUNT, else none (Slurm charges the submitting user's default account);
- time limit = what is left of the job's `timeout_seconds` (earlier attempts spent the rest).
"""

from __future__ import annotations

from pathlib import Path

from jobcore.db.models import Job, Project
from jobcore.db.session import session_scope
from jobcore.jobs.spec import resources_of
from jobcore.settings import Settings
from worker.launch import AttemptPaths
from worker.slurm_attempt import SlurmCommands, SlurmJobAttempt, slurm_job_name
from worker.slurm_batch import SlurmRequest


def slurm_request(
    settings: Settings, job: Job, project_account: str | None, paths: AttemptPaths
) -> SlurmRequest:
    resources = resources_of(job.spec)
    left = None
    if job.timeout_seconds:
        left = max(1.0, job.timeout_seconds - (job.run_seconds or 0.0))
    return SlurmRequest(
        job_name=slurm_job_name(job.id),
        nodes=resources.nnodes,
        gpus_per_node=resources.nproc_per_node if settings.slurm_gpus else 0,
        cpus_per_node=resources.nproc_per_node * settings.slurm_cpus_per_rank,
        partition=resources.partition or settings.slurm_partition,
        account=project_account or settings.slurm_account,
        time_limit_seconds=left,
        output=paths.log,
        workdir=paths.job_dir,
        comment=f"twinkle job {job.id} attempt {paths.attempt}",
    )


def submit_slurm_attempt(
    settings: Settings, job_id: str, paths: AttemptPaths, argv: list[str], env: dict[str, str]
) -> SlurmJobAttempt:
    """Submit the attempt's runner command (the supervisor's torchrun `argv`) to Slurm."""
    with session_scope(settings.resolved_database_url) as session:
        job = session.get(Job, job_id)
        if job is None:
            raise RuntimeError(f"job {job_id} vanished before its Slurm submission")
        project = session.get(Project, job.project_id)
        request = slurm_request(settings, job, project.slurm_account if project else None, paths)
    commands = SlurmCommands(settings.slurm_bin_dir)
    return SlurmJobAttempt.submit(commands, request, argv, env, rank_logs=Path(paths.rank_logs))
