"""Run a job attempt on an existing Ray cluster through Ray's job submission API.

The same runner command the supervisor would start locally (`torchrun ... -m twinkle_core.train
<job_dir>/spec.json [--resume-from ...]`) becomes the entrypoint of a Ray job, placed by Ray on a
node with the attempt's CPUs/GPUs. A job of several nodes (`resources.nnodes > 1`) runs
`python -m worker.ray_gang <plan>` instead: a driver that reserves one bundle per node in a
STRICT_SPREAD placement group and runs one torchrun per bundle (see worker.ray_gang). The runner
writes `progress.jsonl` into the job directory as always, so the job directory must be on storage
the worker and the Ray nodes share (on a local Ray cluster it is the same disk).

The worker holds no GPU lease for a Ray job: Ray places it, with the GPUs of the Ray cluster.

`RayJobAttempt` is the Ray implementation of `worker.attempt.RunningAttempt`, the interface the
supervisor drives every attempt through (see docs/ray.md, "The service's Ray launcher").

Exit codes as the supervisor's `classify` understands them: SUCCEEDED -> 0; FAILED -> the
entrypoint's exit code when Ray knows it (2 = a user error from the runner), else 1; STOPPED -> -15
(as if terminated by SIGTERM).
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from twinkle_core.spec import JobSpec
from worker.launch import DEFAULT_JOIN_TIMEOUT_SECONDS
from worker.ray_plan import GangPlan, plan_path, request_signal

log = logging.getLogger(__name__)

# Environment of the runner that matters on the Ray node (the rest belongs to the worker's host).
FORWARDED_ENV = ("TWINKLE_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "PYTHONUNBUFFERED", "OMP_NUM_THREADS")
# Set in a Ray job's environment (so in its runner's ranks too): the reconciler leaves them to Ray.
RAY_LAUNCHED_ENV = "TWINKLE_RAY_LAUNCHED"
STOPPED_EXIT_CODE = -15
FAILED_EXIT_CODE = 1
LOG_COPY_SECONDS = 2.0  # Ray returns the whole log on each call: copy it now and then, not per poll
# How long each node's torchrun gets between SIGTERM (it checkpoints when it can) and SIGKILL when
# the gang's driver stops it. Ray's own stop escalates to SIGKILL of the driver after
# RAY_JOB_STOP_WAIT_TIME_S (set on the head node); the nodes' torchruns then die with their actors.
GANG_STOP_GRACE_SECONDS = 20.0


def ray_env(env: dict[str, str]) -> dict[str, str]:
    """The runner environment to send with the job; CUDA_VISIBLE_DEVICES is Ray's to set there."""
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_ENV)}


def submission_id(job_id: str, attempt: int) -> str:
    """One Ray job per attempt; a redelivered start of the same attempt finds the same id."""
    return f"twinkle-{job_id}-attempt-{attempt}"


class RayJobAttempt:
    """One submitted Ray job, driven like a local process tree."""

    engine = "ray"  # jobcore.jobs.engine: what the supervisor records on the job row

    def __init__(self, client: Any, submission: str, log_path: Path, gang: GangPlan | None = None) -> None:
        # No local processes: the entrypoint runs on a Ray node (Popen's pid, ProcessTree's members).
        self.pid: int | None = None
        self.members: dict[int, Any] = {}
        self.client = client
        self.submission_id = submission
        self.log_path = log_path
        self.gang = gang  # several nodes: the plan its driver (worker.ray_gang) follows
        self.engine_state: str | None = "PENDING"  # Ray's job status, as Ray spells it
        self._log_chars = 0  # how much of the job's log is already copied into log_path
        self._logs_copied_at = 0.0
        self._exit_code: int | None = None
        self._unreachable = False  # the last status request failed (logged once per outage)

    @classmethod
    def submit(
        cls,
        address: str,
        job_id: str,
        attempt: int,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        num_cpus: float,
        num_gpus: float | None = None,
    ) -> RayJobAttempt:
        """Submit `argv` (run in `cwd`) as a Ray job at `address` (the dashboard's http://host:8265).

        `cwd` is the job directory with the attempt's resolved spec: its `resources.nnodes` decides
        between one torchrun (`argv` itself) and a gang of them in a placement group.
        `num_gpus=None`: one GPU per rank when the Ray cluster has GPUs.
        """
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(address)
        stop_earlier_attempts(client, job_id, attempt)
        submission = submission_id(job_id, attempt)
        runner_env = {**ray_env(env), RAY_LAUNCHED_ENV: "1"}
        nodes, nproc = shape_of(cwd, default_nproc=int(num_cpus))
        gang: GangPlan | None = None
        if nodes > 1:
            gang = GangPlan(
                job_id=job_id,
                attempt=attempt,
                job_dir=str(cwd),
                nnodes=nodes,
                nproc_per_node=nproc,
                argv=argv,
                env=runner_env,
                join_timeout_seconds=DEFAULT_JOIN_TIMEOUT_SECONDS,
                # The worker's cancel grace when its environment sets one, as for local torchrun.
                stop_grace_seconds=float(env.get("TWINKLE_CANCEL_GRACE_SECONDS", GANG_STOP_GRACE_SECONDS)),
            )
            gang.dump(plan_path(cwd, attempt))
            command = [sys.executable, "-m", "worker.ray_gang", str(plan_path(cwd, attempt))]
            # The placement group holds the nodes' CPUs and GPUs; the driver itself needs none.
            resources: dict[str, Any] = {}
        else:
            command = argv
            gpus = num_gpus if num_gpus is not None else (num_cpus if cluster_has_gpus(address) else 0)
            resources = {"entrypoint_num_cpus": num_cpus, "entrypoint_num_gpus": gpus or None}
        client.submit_job(
            entrypoint=f"cd {shlex.quote(str(cwd))} && exec {shlex.join(command)}",
            submission_id=submission,
            runtime_env={"env_vars": runner_env},
            metadata={"twinkle_job_id": job_id, "attempt": str(attempt), "nnodes": str(nodes)},
            **resources,
        )
        log.info("job %s attempt %s: submitted Ray job %s to %s", job_id, attempt, submission, address)
        return cls(client, submission, log_path, gang)

    @property
    def description(self) -> str:
        if self.gang is not None:
            return (
                f"submitted Ray job {self.submission_id} ({self.gang.nnodes} nodes, placement group "
                f"{self.gang.name}), log {self.log_path.name}"
            )
        return f"submitted Ray job {self.submission_id}, log {self.log_path.name}"

    @property
    def engine_job_id(self) -> str:
        return self.submission_id

    # -- Popen's shape ------------------------------------------------------------------------

    def poll(self) -> int | None:
        """None while the Ray job is pending or running, else its exit code (see module doc).

        A Ray cluster that does not answer counts as "still running": the supervisor's hang
        timeout ends an attempt whose cluster stays away.
        """
        if self._exit_code is not None:
            return self._exit_code
        from ray.job_submission import JobStatus

        try:
            info = self.client.get_job_info(self.submission_id)
            terminal = info.status.is_terminal()
            self._copy_logs(force=terminal)
        except Exception as exc:  # the dashboard restarting, a network blip
            if not self._unreachable:
                log.warning("Ray job %s: status unavailable (%s); retrying", self.submission_id, exc)
            self._unreachable = True
            return None
        self._unreachable = False
        self.engine_state = str(info.status)
        if not terminal:
            return None
        if info.status == JobStatus.SUCCEEDED:
            code = 0
        elif info.status == JobStatus.STOPPED:
            code = STOPPED_EXIT_CODE
        else:
            code = info.driver_exit_code if info.driver_exit_code not in (None, 0) else FAILED_EXIT_CODE
            log.warning("Ray job %s failed: %s", self.submission_id, info.message)
        self._exit_code = int(code)
        return self._exit_code

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Ray job {self.submission_id} still running after {timeout} s")
            time.sleep(interval)
        return code

    # -- ProcessTree's shape ------------------------------------------------------------------

    def refresh(self) -> bool:
        return False  # the processes live on the Ray node: nothing local to track

    def pids(self) -> list[int]:
        return []

    def reap(self) -> None:
        """Nothing local outlives the job; Ray ends the entrypoint's processes itself."""

    @property
    def can_signal(self) -> bool:
        """A gang's driver passes signals on to every node; Ray's job API alone only stops jobs
        (a one-node Ray job's pause stops it: see the supervisor)."""
        return self.gang is not None

    def signal_ranks(self, sig: int) -> int:
        """Ask the gang's driver to send `sig` to every node's ranks; how many nodes it goes to."""
        if self.gang is None:
            log.warning("Ray job %s: cannot send signal %s through Ray", self.submission_id, sig)
            return 0
        request_signal(Path(self.gang.job_dir), self.gang.attempt, sig)
        return self.gang.nnodes

    def terminate(self, grace_seconds: float) -> None:
        """Stop the job through Ray (SIGTERM to the entrypoint, SIGKILL after Ray's own grace),
        and wait up to `grace_seconds` for Ray to report it ended."""
        if self.poll() is not None:
            return
        try:
            self.client.stop_job(self.submission_id)
        except Exception as exc:
            log.error("Ray job %s: stop request failed: %s", self.submission_id, exc)
        if self.gang is not None:
            # The gang's driver stops every node (SIGKILL after its own grace) before it ends.
            grace_seconds += self.gang.stop_grace_seconds + 10
        try:
            self.wait(timeout=grace_seconds)
        except TimeoutError:
            log.error("Ray job %s: still not stopped after %.0f s", self.submission_id, grace_seconds)

    # -- logs ---------------------------------------------------------------------------------

    def _copy_logs(self, force: bool = False) -> None:
        """Append what the job printed since the last copy to the attempt's log file."""
        now = time.monotonic()
        if not force and now - self._logs_copied_at < LOG_COPY_SECONDS:
            return
        self._logs_copied_at = now
        text = self.client.get_job_logs(self.submission_id)
        if len(text) > self._log_chars:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as handle:
                handle.write(text[self._log_chars :])
            self._log_chars = len(text)


def shape_of(job_dir: Path, default_nproc: int) -> tuple[int, int]:
    """The attempt's (nnodes, nproc_per_node), from the resolved spec the supervisor wrote into
    the job dir (a command without one, as in tests of the launcher alone, runs on one node)."""
    spec = job_dir / "spec.json"
    if not spec.exists():
        return 1, default_nproc
    resources = JobSpec.load(spec).resources
    return resources.nnodes, resources.nproc_per_node


def cluster_has_gpus(address: str) -> bool:
    """Whether any node of the Ray cluster at `address` (its dashboard) has GPUs."""
    from ray.util.state import list_nodes

    return any(node.resources_total.get("GPU", 0) > 0 for node in list_nodes(address=address))


def stop_earlier_attempts(client: Any, job_id: str, attempt: int, timeout: float = 60.0) -> None:
    """Stop the Ray jobs of this job's earlier attempts that still run, and wait for them to end.

    A worker that died leaves its Ray job running (nothing on the new worker's host to kill); the
    next attempt must not train beside it and write the same job directory.
    """
    deadline = time.monotonic() + timeout
    for earlier in range(1, attempt):
        submission = submission_id(job_id, earlier)
        try:
            if client.get_job_status(submission).is_terminal():
                continue
        except RuntimeError:
            continue  # never submitted (a torchrun attempt, or one that failed before submitting)
        log.warning("job %s: stopping Ray job %s of an earlier attempt", job_id, submission)
        client.stop_job(submission)
        while not client.get_job_status(submission).is_terminal():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray job {submission} of an earlier attempt did not stop")
            time.sleep(0.5)


def stop_lost_attempts(address: str, job_id: str, attempt: int) -> None:
    """Stop the Ray jobs of a job whose worker was lost, up to `attempt` (the reconciler's part).

    Nothing else would: the driver keeps training and holds its placement group's nodes until
    stopped, and Ray removes the group and its actors when the driver ends. A cluster that does
    not answer is logged; the next attempt tries again before it submits.
    """
    from ray.job_submission import JobSubmissionClient

    try:
        stop_earlier_attempts(JobSubmissionClient(address), job_id, attempt + 1)
    except Exception as exc:
        log.error("job %s: could not stop the Ray jobs of its lost worker: %s", job_id, exc)
