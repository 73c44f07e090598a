"""`resources.launcher: "slurm"` without a cluster: what the worker asks Slurm for (sbatch's
options from the spec, the job row and the settings), the batch script it writes, how it reads
Slurm's job states, and who claims a Slurm job. On the live cluster:
tests/integration/test_slurm_launcher.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from test_api_support import *  # noqa: F403
from test_api_support import Api, spec_body

from jobcore.db.migrate import upgrade
from jobcore.db.models import Job, Project
from jobcore.db.session import session_scope
from jobcore.settings import Settings
from worker.agent import WorkerAgent
from worker.attempt import AttemptTarget, start_attempt
from worker.claim import claim_next_job
from worker.ingest import Observed
from worker.launch import AttemptPaths, torchrun_argv
from worker.outcome import Outcome, classify
from worker.slurm_attempt import SlurmCommands, SlurmJobAttempt, cancel_earlier, cancel_lost_job
from worker.slurm_batch import batch_script, sbatch_argv, split_torchrun_argv
from worker.slurm_launcher import slurm_request, submit_slurm_attempt
from worker.slurm_state import parse_scontrol
from worker.supervisor import Assignment, Supervisor

SLURM_SPEC: dict[str, Any] = {
    "model": {"config": {}},
    "data": {"train_file": "/dev/null"},
    "resources": {"launcher": "slurm", "nnodes": 2, "nproc_per_node": 4, "partition": "gpu-a"},
}


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    s = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.ensure_dirs()
    upgrade(s.resolved_database_url)
    return s


def add_job(settings: Settings, spec: dict[str, Any], project: str = "vision", **columns: Any) -> str:
    with session_scope(settings.resolved_database_url) as session:
        row = Project(name=project)
        session.add(row)
        session.flush()
        job = Job(project_id=row.id, spec=spec, **columns)
        session.add(job)
        session.flush()
        return job.id


def test_the_api_takes_a_slurm_job_and_refuses_a_partition_elsewhere(api: Api) -> None:
    body = spec_body()
    body["spec"]["resources"] = {"launcher": "slurm", "nnodes": 2, "partition": "gpu-a"}
    created = api.client.post("/v1/jobs", json=body, headers=api.admin)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["resources"]["partition"] == "gpu-a"
    for bad in ({"partition": "gpu-a"}, {"launcher": "slurm", "partition": "gpu a; rm -rf /"}):
        body["spec"]["resources"] = bad
        refused = api.client.post("/v1/jobs", json=body, headers=api.admin)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["param"].startswith("spec.resources"), refused.json()


def test_the_allocation_comes_from_the_spec_the_job_and_the_project(
    settings: Settings, tmp_path: Path
) -> None:
    job_id = add_job(settings, SLURM_SPEC, timeout_seconds=3600, run_seconds=600.0)
    configured = settings.model_copy(update={"slurm_account": "everyone"})
    paths = AttemptPaths(tmp_path / "job", 3)
    with session_scope(settings.resolved_database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        request = slurm_request(configured, job, "vision-lab", paths)  # the project's own account
        other = slurm_request(configured.model_copy(update={"slurm_gpus": False}), job, None, paths)
        unset = slurm_request(settings, job, None, paths)
    argv = sbatch_argv("sbatch", request, tmp_path / "a.sbatch")
    assert argv[0] == "sbatch" and argv[-1] == str(tmp_path / "a.sbatch")
    for option in (
        "--parsable",
        f"--job-name=twinkle-{job_id}",
        "--nodes=2",
        "--ntasks-per-node=1",  # one torchrun per node
        "--gpus-per-node=4",
        "--cpus-per-task=4",
        "--partition=gpu-a",
        "--account=vision-lab",
        "--time=50",  # what is left of timeout_seconds, in minutes
        "--requeue",
        f"--output={paths.log}",
        f"--chdir={paths.job_dir}",
    ):
        assert option in argv, (option, argv)
    other_argv = sbatch_argv("sbatch", other, tmp_path / "a.sbatch")
    assert "--account=everyone" in other_argv  # a project without its own account
    unset_argv = sbatch_argv("sbatch", unset, tmp_path / "a.sbatch")
    assert not any(a.startswith("--account") for a in unset_argv)  # Slurm's default account
    assert not any(a.startswith("--gpus") for a in other_argv)  # TWINKLE_SLURM_GPUS=false


FAKE_SRUN = """#!/bin/bash
# srun on node 1 of 2: drop srun's options, run the task
while [[ "$1" == --* ]]; do shift; done
SLURM_NODEID=1 SLURM_JOB_NUM_NODES=2 exec "$@"
"""
FAKE_TORCHRUN = """#!/bin/bash
printf '%s\\n' "$@"
"""


def run_batch_script(tmp_path: Path, script: str, restarts: int) -> list[str]:
    """The batch script under a stand-in srun (node 1 of 2) and torchrun (prints its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("torchrun", FAKE_TORCHRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_RESTART_COUNT": str(restarts), "SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_batch_script_runs_one_torchrun_per_node_and_resumes_after_a_requeue(tmp_path: Path) -> None:
    paths = AttemptPaths(tmp_path / "job dir", 2)  # a space: every path is quoted
    torchrun_path = str(tmp_path / "bin" / "torchrun")
    argv = torchrun_argv(
        torchrun_path, 4, paths, str(paths.job_dir / "checkpoints" / "step-2"), "twinkle_core.train"
    )
    torchrun, runner, resume = split_torchrun_argv(argv)
    assert torchrun[:3] == [torchrun_path, "--nproc_per_node", "4"]
    assert "--rdzv-endpoint" not in torchrun and "--log-dir" not in torchrun  # set per node
    assert runner == ["-m", "twinkle_core.train", str(paths.spec)]
    script = batch_script(argv, paths.rank_logs, sys.executable, paths.job_dir)

    args = run_batch_script(tmp_path, script, restarts=0)
    assert args[:2] == ["--nproc_per_node", "4"]
    options = dict(zip(args[2:-5:2], args[3:-5:2], strict=True))
    assert options["--nnodes"] == "2" and options["--node-rank"] == "1"  # from Slurm, per node
    assert options["--master-addr"] == socket.gethostname() and int(options["--master-port"]) > 0
    assert options["--log-dir"] == f"{paths.rank_logs}/node-1-restart-0"
    assert args[-5:] == ["-m", "twinkle_core.train", str(paths.spec), "--resume-from", resume]

    # Requeued by Slurm: the newest complete checkpoint, not the one the attempt started from.
    newest = paths.job_dir / "checkpoints" / "step-4"
    newest.mkdir(parents=True)
    (newest / "COMPLETE").write_text("")
    (paths.job_dir / "checkpoints" / "step-6").mkdir()  # incomplete: never resumed from
    args = run_batch_script(tmp_path, script, restarts=1)
    assert args[-2:] == ["--resume-from", str(newest)]
    assert f"{paths.rank_logs}/node-1-restart-1" in args


def test_slurm_states_map_to_the_supervisor_exit_codes() -> None:
    def state(job_state: str, exit_code: str = "0:0", restarts: int = 0) -> Any:
        line = (
            f"JobId=42 JobName=twinkle-x UserId=root(0) JobState={job_state} Reason=None "
            f"Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode={exit_code} NodeList=n[1-2]"
        )
        parsed = parse_scontrol(line)
        assert parsed is not None and parsed.job_id == "42" and parsed.nodes == "n[1-2]"
        return parsed

    assert state("COMPLETED").attempt_exit_code() == 0
    assert state("FAILED", "2:0").attempt_exit_code() == 2  # the runner's user error
    assert state("FAILED", "0:9").attempt_exit_code() == -9
    for ended in ("CANCELLED", "NODE_FAIL", "PREEMPTED", "TIMEOUT"):
        assert state(ended).terminal and state(ended).attempt_exit_code() < 0
        assert state(ended).timed_out == (ended == "TIMEOUT")  # a timeout; the rest: infra, retried
    assert not state("RUNNING").terminal and state("RUNNING").shown_state == "RUNNING"
    requeued = state("PENDING", restarts=1)
    assert not requeued.terminal and requeued.shown_state == "REQUEUED"
    assert parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_a_slurm_job_goes_to_a_slurm_worker_and_takes_no_lease(settings: Settings, tmp_path: Path) -> None:
    job_id = add_job(settings, SLURM_SPEC)
    assert "slurm" not in WorkerAgent(settings).launchers
    slurm_worker = WorkerAgent(settings.model_copy(update={"slurm": True}))
    assert "slurm" in slurm_worker.launchers
    with session_scope(settings.resolved_database_url) as session:
        assert claim_next_job(session, "w0", lambda n: True, ("torchrun",)) is None
        # Its own GPUs all leased (nothing fits): the worker still hands the job to Slurm.
        job = claim_next_job(session, "w1", lambda n: False, slurm_worker.launchers)
        assert job is not None and job.id == job_id
    target = AttemptTarget(job_id, 1, "slurm", 4, [])
    with pytest.raises(RuntimeError, match="without TWINKLE_SLURM"):
        start_attempt(target, ["true"], {}, tmp_path, tmp_path / "a.log", ray_address=None)


def test_what_an_earlier_or_lost_attempt_left_in_slurm_is_cancelled(tmp_path: Path) -> None:
    """A worker that died leaves its Slurm job: the reconciler scancels it by the job's name, and
    the next attempt cancels it again and waits until squeue lists nothing before submitting."""
    calls = tmp_path / "calls"
    queue = tmp_path / "queue"
    queue.write_text("41\n")
    for name, body in (
        ("scancel", f'echo "scancel $*" >> {calls}; : > {queue}'),  # the job leaves the queue
        ("squeue", f"cat {queue}"),
    ):
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    commands = SlurmCommands(str(tmp_path))
    cancel_earlier(commands, "twinkle-job-1")
    assert (
        calls.read_text() == "scancel --name=twinkle-job-1\n" and commands.queued_ids("twinkle-job-1") == []
    )
    cancel_earlier(commands, "twinkle-job-1")  # nothing queued: nothing cancelled
    cancel_lost_job(commands, "job-2")
    assert calls.read_text().splitlines() == ["scancel --name=twinkle-job-1", "scancel --name=twinkle-job-2"]


def fake_slurm(bin_dir: Path, job_state: str) -> Path:
    """sbatch that records its arguments and answers job 77; scontrol that says `job_state`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = bin_dir / "calls"
    scontrol = (
        f"JobId=77 JobName=twinkle-x JobState={job_state} Reason=None Restarts=0 ExitCode=0:15 "
        "TimeLimit=00:01:00 NodeList=twinkle[1-2]"
    )
    for name, body in (
        ("sbatch", f'echo "sbatch $*" >> {calls}; echo 77'),
        ("scontrol", f"echo '{scontrol}'"),
        ("squeue", "true"),
        ("scancel", f'echo "scancel $*" >> {calls}'),
    ):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return calls


def test_the_project_slurm_account_goes_to_sbatch(settings: Settings, tmp_path: Path) -> None:
    calls = fake_slurm(tmp_path / "bin", "PENDING")
    configured = settings.model_copy(update={"slurm_bin_dir": str(tmp_path / "bin"), "slurm_account": "all"})
    charged = add_job(settings, SLURM_SPEC, project="vision")
    with session_scope(settings.resolved_database_url) as session:
        project = session.scalars(select(Project).where(Project.name == "vision")).one()
        project.slurm_account = "vision-lab"
    fallback = add_job(settings, SLURM_SPEC, project="nlp")  # no account of its own
    for job_id in (charged, fallback):
        paths = AttemptPaths(settings.jobs_dir / job_id, 1)
        attempt = submit_slurm_attempt(configured, job_id, paths, ["torchrun", "-m", "r", "spec.json"], {})
        assert attempt.engine_job_id == "77"
    submitted = calls.read_text().splitlines()
    assert "--account=vision-lab" in submitted[0].split() and "--account=all" in submitted[1].split()


@pytest.mark.parametrize(
    ("job_state", "status", "kind", "attempts"),
    [("TIMEOUT", "failed", "timeout", 1), ("NODE_FAIL", "queued", "infra", 1)],
)
def test_a_slurm_timeout_fails_the_job_like_its_own_timeout(
    settings: Settings, tmp_path: Path, job_state: str, status: str, kind: str, attempts: int
) -> None:
    """Slurm's TIMEOUT (the time limit set from timeout_seconds) fails the job as a timeout, with no
    retry; a NODE_FAIL that Slurm did not requeue is an infra failure, retried from the checkpoint."""
    fake_slurm(tmp_path / "bin", job_state)
    configured = settings.model_copy(update={"slurm": True, "slurm_bin_dir": str(tmp_path / "bin")})
    job_id = add_job(settings, SLURM_SPEC, timeout_seconds=60, max_retries=3)
    with session_scope(settings.resolved_database_url) as session:
        claimed = claim_next_job(session, "w1", lambda n: False, ("slurm",))
        assert claimed is not None and claimed.id == job_id
    supervisor = Supervisor(
        configured, Assignment(job_id, 1, "w1", [], 4, 1, "slurm"), "twinkle_core.train", lambda s: None
    )
    supervisor._supervise()
    assert supervisor.result is not None and supervisor.result.retryable == (kind == "infra")
    with session_scope(settings.resolved_database_url) as session:
        job = session.get_one(Job, job_id)
        assert (job.status, job.attempt, job.error["kind"]) == (status, attempts, kind), job.error
        assert job.engine_state == job_state
        if job_state == "TIMEOUT":
            assert job.error["message"].startswith("timeout: Slurm ended job 77 at its time limit (00:01:00)")


def test_classify_keeps_a_finished_run_over_the_engine_s_word(tmp_path: Path) -> None:
    """A run that wrote `done` before Slurm's time limit hit its teardown succeeded all the same."""
    bin_dir = tmp_path / "bin"
    fake_slurm(bin_dir, "TIMEOUT")
    attempt = SlurmJobAttempt(SlurmCommands(str(bin_dir)), "77", tmp_path / "a.log")
    assert attempt.wait() == -15 and attempt.ended is not None
    assert classify(-15, Observed(), None, "", attempt.ended).outcome == Outcome.TIMEOUT
    final = tmp_path / "step-4"
    final.mkdir()
    (final / "COMPLETE").write_text("")
    done = Observed(done=True, final_checkpoint=str(final))
    assert classify(-15, done, None, "", attempt.ended).outcome == Outcome.SUCCEEDED
