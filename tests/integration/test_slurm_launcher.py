"""`resources.launcher: "slurm"` through a real one-machine Slurm cluster (scripts/start_slurm.sh:
slurmctld and two slurmd emulating nodes twinkle1 and twinkle2, partitions `twinkle` and
`urgent`, whose jobs preempt `twinkle` jobs by requeueing them).

The service (API server + worker, subprocesses, SQLite) with TWINKLE_SLURM=1 hands jobs to
Slurm; nothing is mocked:
- a 2-node job runs as one Slurm job (srun starts a torchrun per node), charged to its project's
  Slurm account, and ends `succeeded`, with the Slurm job's id and state on the job and the
  losses and final weights (bit for bit) of a 2-node torchrun gang of the same spec;
- a pause reaches the ranks through Slurm (they checkpoint and exit), a resume submits a new
  Slurm job, and a cancel through the API `scancel`s it: `cancelled`, squeue lists nothing of it;
- a preemption (an `urgent` job taking both nodes) and a node failure (one node set DOWN) each
  make Slurm requeue the job; it resumes from its checkpoint within the same attempt of ours and
  ends bitwise equal to the uninterrupted run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from two_node_reference import MAX_STEPS, GangRun, assert_same_training, two_node_spec

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(600)]

HOLD_STEP = 2
PROJECT_ACCOUNT = "twinkle-lab"  # the default project's slurm_account (the reference job's)
WORKER_ACCOUNT = "twinkle-fallback"  # TWINKLE_SLURM_ACCOUNT: for a project without one

# `twinkle_core.train` with a hold, so that a test acts on a job that provably has not finished:
# a run whose rank 0 takes the token file (an atomic rename) after a step >= HOLD_STEP (its step-2
# checkpoint complete) waits there until it is signalled. Waiting changes no arithmetic.
HOLD_RUNNER = f"""
import os
import time

from twinkle_core import train

plain_after_step = train.JobRunner.after_step


def after_step(self, result):
    outcome = plain_after_step(self, result)
    rank0 = os.environ.get("RANK", "0") == "0"
    if outcome is None and rank0 and self.model.cur_step >= {HOLD_STEP}:
        try:
            os.rename(os.environ["TWINKLE_TEST_HOLD_TOKEN"], self.job_dir / "held")
        except FileNotFoundError:
            return outcome  # no token: run through
        while not (self.stop.terminate or self.stop.pause):
            time.sleep(0.1)
    return outcome


train.JobRunner.after_step = after_step
train.run()
"""


def slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=60).stdout


def cluster_is_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        states = slurm("sinfo", "-h", "-N", "-p", "twinkle", "-o", "%t").split()
    except (subprocess.SubprocessError, OSError):
        return False
    return len(states) == 2 and all(s in ("idle", "mix", "alloc") for s in states)


class SlurmService:
    """A LiveService whose worker hands launcher='slurm' jobs to the local cluster."""

    def __init__(self, svc: Any, token: Path) -> None:
        self.svc, self.token = svc, token

    def submit(self, spec: dict[str, Any], **fields: Any) -> str:
        with self.svc.client() as client:
            response = client.post("/v1/jobs", json={"name": "slurm-job", "spec": spec, **fields})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.svc.client() as client:
            return dict(client.get(f"/v1/jobs/{job_id}").json())

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self.svc.client() as client:
            page = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()
        return list(page["data"])

    def job_dir(self, job_id: str) -> Path:
        return Path(self.svc.data_dir) / "jobs" / job_id

    def wait_held(self, job_id: str, timeout: float = 180) -> str:
        """Wait until the run holds after its step-2 checkpoint; the Slurm job id."""
        deadline = time.monotonic() + timeout
        while not (self.job_dir(job_id) / "held").exists():
            job = self.job(job_id)
            assert job["status"] in ("queued", "starting", "running"), (job, self.svc.worker_log())
            assert time.monotonic() < deadline, f"job {job_id} never held: {job}\n{self.svc.worker_log()}"
            time.sleep(0.3)
        return str(self.job(job_id)["engine"]["job_id"])

    def wait_engine_state(self, job_id: str, state: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["engine"] is None or job["engine"]["state"] != state:
            assert time.monotonic() < deadline, (job, self.svc.worker_log())
            time.sleep(0.3)
        return job


@pytest.fixture(scope="module")
def slurm_service(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> Iterator[SlurmService]:
    if not cluster_is_up():
        pytest.skip("no Slurm cluster with idle nodes twinkle1, twinkle2: run scripts/start_slurm.sh")
    from live_service import LiveService

    root = tmp_path_factory.mktemp("slurm-service")
    runner = root / "hold_runner.py"
    runner.write_text(HOLD_RUNNER)
    token = root / "hold-token"
    svc = LiveService.configure(
        root,
        [tiny_model_dir, text_dataset.parent],
        TWINKLE_SLURM="1",
        TWINKLE_SLURM_GPUS="false",  # the test cluster has CPUs only
        TWINKLE_SLURM_PARTITION="twinkle",
        TWINKLE_SLURM_ACCOUNT=WORKER_ACCOUNT,  # no accounting database here: any name is taken
        TWINKLE_WORKER_RUNNER=str(runner),
        TWINKLE_TEST_HOLD_TOKEN=str(token),
        TWINKLE_HEARTBEAT_SECONDS="0.5",
        TWINKLE_CANCEL_GRACE_SECONDS="30",
    )
    svc.start_server()
    svc.start_worker()
    try:
        yield SlurmService(svc, token)
    finally:
        svc.stop()
        # A test that failed midway may leave its Slurm job queued or running on the shared
        # cluster, where it would take the nodes of whatever runs next (the suite's next run too).
        for job_dir in (Path(svc.data_dir) / "jobs").glob("job-*"):
            subprocess.run(["scancel", f"--name=twinkle-{job_dir.name}"], capture_output=True)


def slurm_spec(tiny_model_dir: Path, text_dataset: Path) -> dict[str, Any]:
    return two_node_spec(tiny_model_dir, text_dataset, "slurm")


def set_project_account(service: SlurmService, account: str | None) -> None:
    with service.svc.client() as client:  # the bootstrap token: an operator
        response = client.patch("/v1/projects/default", json={"slurm_account": account})
    assert response.status_code == 200 and response.json()["slurm_account"] == account, response.text


def slurm_account(slurm_id: str) -> str:
    return slurm("squeue", "-h", "-o", "%a", "-j", slurm_id).strip()


def queued(job_id: str) -> list[str]:
    """What squeue still lists of the job's Slurm jobs (pending, running, completing)."""
    return slurm("squeue", "-h", f"--name=twinkle-{job_id}", "-o", "%i %T").splitlines()


def loss_series(service: SlurmService, job_id: str) -> list[tuple[int, float]]:
    with service.svc.client() as client:
        body = client.get(f"/v1/jobs/{job_id}/metrics").json()
    return [(int(p["step"]), float(p["value"])) for p in body["series"]["loss"]]


@pytest.fixture(scope="module")
def reference(
    slurm_service: SlurmService, gang_reference: GangRun, tiny_model_dir: Path, text_dataset: Path
) -> str:
    """An uninterrupted 2-node Slurm job (the token is absent: it runs through), charged to the
    project's Slurm account. The gang reference (tests/integration/conftest.py) trains beside it
    unless another module already ran it."""
    slurm_service.token.unlink(missing_ok=True)
    set_project_account(slurm_service, PROJECT_ACCOUNT)
    job_id = slurm_service.submit(slurm_spec(tiny_model_dir, text_dataset))
    job = slurm_service.svc.wait_terminal(job_id, timeout=300)
    assert job["status"] == "succeeded", (job, slurm_service.svc.worker_log())
    return job_id


def test_a_two_node_job_runs_through_slurm_to_the_gang_result(
    slurm_service: SlurmService, reference: str, gang_reference: GangRun
) -> None:
    job = slurm_service.job(reference)
    assert job["attempt"] == 1
    assert job["engine"]["name"] == "slurm" and job["engine"]["state"] == "COMPLETED", job
    slurm_id = job["engine"]["job_id"]
    shown = slurm("scontrol", "show", "job", "-o", slurm_id)
    assert "JobState=COMPLETED" in shown and "NumNodes=2" in shown and "NodeList=twinkle[1-2]" in shown
    assert f" Account={PROJECT_ACCOUNT} " in shown  # sbatch --account: the project's setting
    events = slurm_service.events(reference)
    steps = [e["data"]["step"] for e in events if e["type"] == "metrics" and "step" in (e["data"] or {})]
    assert steps == list(range(1, MAX_STEPS + 1)), events
    messages = [e["message"] for e in events]
    assert f"submitted Slurm job {slurm_id}, log attempt-1.log" in messages
    assert any("world size 2" in m for m in messages), messages  # one rank on each node
    # Each node's torchrun kept its rank logs; Slurm's output is the attempt's log.
    ranks = slurm_service.job_dir(reference) / "logs" / "attempt-1-ranks"
    assert {p.name for p in ranks.iterdir()} == {"node-0-restart-0", "node-1-restart-0"}
    assert queued(reference) == []
    # The same spec as a 2-node torchrun gang: every step's loss, the final weights bit for bit.
    assert_same_training(slurm_service.job_dir(reference), gang_reference.result())


def test_pause_signals_the_ranks_and_cancel_scancels_the_slurm_job(
    slurm_service: SlurmService, tiny_model_dir: Path, text_dataset: Path
) -> None:
    slurm_service.token.write_text("hold")
    set_project_account(slurm_service, None)  # a project without an account: the worker's
    spec = slurm_spec(tiny_model_dir, text_dataset)
    spec["resources"]["nnodes"] = 1  # one node this time (and half the CPU of the test)
    job_id = slurm_service.submit(spec)
    first = slurm_service.wait_held(job_id)  # running, mid-way: it cannot finish on its own
    assert slurm_account(first) == WORKER_ACCOUNT
    with slurm_service.svc.client() as client:
        # Pause: SIGUSR1 through Slurm to the ranks, which checkpoint and exit.
        answer = client.post(f"/v1/jobs/{job_id}/pause")
        assert answer.status_code == 200, (answer.text, slurm_service.svc.worker_log())
        deadline = time.monotonic() + 120
        while (job := slurm_service.job(job_id))["status"] != "paused":
            assert job["status"] in ("running", "pausing") and time.monotonic() < deadline, job
            time.sleep(0.3)
        assert job["engine"] == {"name": "slurm", "job_id": first, "state": "COMPLETED"}, job
        # The ranks checkpoint at the step boundary after the signal.
        paused_at = re.search(r"/checkpoints/step-(\d+)$", job["resume_from"] or "")
        assert paused_at and int(paused_at[1]) >= HOLD_STEP, job
        assert queued(job_id) == []
        # Resume: a new attempt, a new Slurm job, held again; cancel it there.
        (slurm_service.job_dir(job_id) / "held").unlink()
        slurm_service.token.write_text("hold")
        answer = client.post(f"/v1/jobs/{job_id}/resume")
        assert answer.status_code == 200, (answer.text, slurm_service.svc.worker_log())
        second = slurm_service.wait_held(job_id)
        assert second != first and slurm_service.job(job_id)["attempt"] == 2
        answer = client.post(f"/v1/jobs/{job_id}/cancel")
        assert answer.status_code == 200, (answer.text, slurm_service.svc.worker_log())
    job = slurm_service.svc.wait_terminal(job_id, timeout=120)
    assert job["status"] == "cancelled", (job, slurm_service.svc.worker_log())
    assert job["engine"] == {"name": "slurm", "job_id": second, "state": "CANCELLED"}, job
    assert queued(job_id) == []


def test_a_preempted_job_is_requeued_by_slurm_and_resumes_from_its_checkpoint(
    slurm_service: SlurmService, reference: str, tiny_model_dir: Path, text_dataset: Path
) -> None:
    slurm_service.token.write_text("hold")
    job_id = slurm_service.submit(slurm_spec(tiny_model_dir, text_dataset))
    slurm_id = slurm_service.wait_held(job_id)  # its step-2 checkpoint is complete
    # A job of the higher-priority partition wants both whole nodes: Slurm preempts ours.
    interrupted = time.monotonic()
    slurm("sbatch", "-p", "urgent", "-N2", "-c2", "-J", "urgent", "-o", "/dev/null", "--wrap", "sleep 1")
    job = slurm_service.wait_engine_state(job_id, "REQUEUED")
    assert job["status"] == "running" and job["attempt"] == 1, job  # the job stays with Slurm
    start_requeued_now(slurm_id, not_before=interrupted + REQUEUE_SETTLE_SECONDS)
    job = slurm_service.svc.wait_terminal(job_id, timeout=300)
    assert job["status"] == "succeeded", (job, slurm_service.svc.worker_log())
    assert job["attempt"] == 1, job  # Slurm requeued it: no retry of ours
    assert job["engine"] == {"name": "slurm", "job_id": slurm_id, "state": "COMPLETED"}, job
    assert "Restarts=1" in slurm("scontrol", "show", "job", "-o", slurm_id)

    messages = [e["message"] for e in slurm_service.events(job_id)]
    assert any(m.endswith(f"slurm job {slurm_id}: REQUEUED") for m in messages), messages
    # The requeued run resumed from the newest complete checkpoint: step 2, or step 3 when the
    # runner saved one on Slurm's SIGTERM before the kill.
    resumed = [m for m in messages if "resumed from" in m]
    assert len(resumed) == 1, messages
    match = re.search(r"from step (\d+), resumed from .*/checkpoints/step-(\d+)$", resumed[0])
    assert match and match[1] == match[2] and int(match[1]) >= HOLD_STEP, resumed
    log = (slurm_service.job_dir(job_id) / "logs" / "attempt-1.log").read_text()
    assert "DUE TO PREEMPTION" in log and "restart 1 of job" in log

    # The steps the preempted run made past its checkpoint were recomputed, not recorded twice:
    # the loss curve is the uninterrupted run's, point for point.
    assert loss_series(slurm_service, job_id) == loss_series(slurm_service, reference)
    assert_same_training(slurm_service.job_dir(job_id), slurm_service.job_dir(reference))
    assert queued(job_id) == []


def run_processes(slurm_id: str) -> list[int]:
    """The processes of a Slurm job's run: its step daemons (`slurmstepd: [<id>.0]`, whose
    titles name the job) and whatever has the job's id in its environment (its batch script,
    srun, torchrun, the ranks). The test cluster's nodes all live on this machine."""
    marker = f"\0SLURM_JOB_ID={slurm_id}\0".encode()
    title = f"slurmstepd: [{slurm_id}.".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ours = (entry / "cmdline").read_bytes().startswith(title)
                ours = ours or marker in b"\0" + (entry / "environ").read_bytes()
            except OSError:  # ended meanwhile, or not ours to read
                continue
            if ours:
                found.append(int(entry.name))
    return found


# How long after a run is interrupted its requeued run may start: see start_requeued_now.
REQUEUE_SETTLE_SECONDS = 10.0


def start_requeued_now(slurm_id: str, not_before: float, timeout: float = 120) -> None:
    """Slurm holds a requeued job for 120 s (its begin time) before it may start again; a test
    cannot wait that long. The hold is set once the requeue has finished, which on a loaded machine
    can be after the test saw REQUEUED, and a `StartTime=now` sent before then is overwritten: so
    lift it whenever the job waits for its begin time, until it has left the queue.

    Only once the interrupted run's processes are gone, though. On the node set DOWN (here only
    in name) its step daemon outlives the requeue for a few seconds, and a new run started meanwhile
    gets a step of the same name (`<id>.0`: step ids start again at 0): the old daemon, ending,
    unlinks the new one's socket, and the new run died with 137 (the worker then rightly counted
    an attempt of its own). Slurm's own 120 s hold never lets the runs meet.

    Nor before `not_before` (monotonic): gone processes were not enough. In a CI run of 12-06 the
    old step daemon on the failed node ended 3 s after the failure, the hold was lifted 0.2 s later
    with no process of the job left, the new run was allocated at once, and its task on that node
    was killed with 9 about 4.7 s after the failure, most likely by the controller's kill of the
    job's interrupted allocation reaching the node late (same job id). Where the runs passed, the
    new one started 5 s or more after the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < not_before:
        time.sleep(0.2)
    while True:
        shown = slurm("scontrol", "show", "job", "-o", slurm_id)
        state, reason = re.search(r"JobState=(\S+)", shown), re.search(r"Reason=(\S+)", shown)
        if state and state[1] in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return
        held = state and state[1] == "PENDING" and reason and reason[1] == "BeginTime"
        if held and not run_processes(slurm_id):
            # Not checked: the job may move on between the two commands; the next round sees it.
            subprocess.run(["scontrol", "update", f"JobId={slurm_id}", "StartTime=now"], capture_output=True)
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)


def node_state(node: str) -> str:
    return slurm("sinfo", "-h", "-N", "-n", node, "-p", "twinkle", "-o", "%t").strip()


def resume_node(node: str, timeout: float = 60) -> None:
    """Bring `node` back (it may already be: ReturnToService=2 returns a DOWN node whose slurmd
    answers) and wait until Slurm schedules on it again."""
    deadline = time.monotonic() + timeout
    while node_state(node) not in ("idle", "mix", "alloc"):
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
        assert time.monotonic() < deadline, f"{node} did not come back: {node_state(node)}"
        time.sleep(0.5)


def test_a_node_failure_is_requeued_by_slurm_and_resumes_from_its_checkpoint(
    slurm_service: SlurmService, reference: str, tiny_model_dir: Path, text_dataset: Path
) -> None:
    slurm_service.token.write_text("hold")
    job_id = slurm_service.submit(slurm_spec(tiny_model_dir, text_dataset))
    slurm_id = slurm_service.wait_held(job_id)  # its step-2 checkpoint is complete
    interrupted = time.monotonic()
    try:
        # The second node fails: Slurm ends the job's run on both nodes (NODE_FAIL) and, the job
        # being submitted with --requeue, puts it back in its queue.
        slurm("scontrol", "update", "NodeName=twinkle2", "State=DOWN", "Reason=twinkle-test-node-failure")
        job = slurm_service.wait_engine_state(job_id, "REQUEUED")
        assert job["status"] == "running" and job["attempt"] == 1, job  # the job stays with Slurm
    finally:
        resume_node("twinkle2")  # whatever happened: the next tests need both nodes
    start_requeued_now(slurm_id, not_before=interrupted + REQUEUE_SETTLE_SECONDS)
    job = slurm_service.svc.wait_terminal(job_id, timeout=300)
    assert job["status"] == "succeeded", (job, slurm_service.svc.worker_log())
    assert job["attempt"] == 1, job  # Slurm requeued it: no retry of ours
    assert job["engine"] == {"name": "slurm", "job_id": slurm_id, "state": "COMPLETED"}, job
    assert "Restarts=1" in slurm("scontrol", "show", "job", "-o", slurm_id)

    messages = [e["message"] for e in slurm_service.events(job_id)]
    assert any(m.endswith(f"slurm job {slurm_id}: REQUEUED") for m in messages), messages
    resumed = [m for m in messages if "resumed from" in m]
    assert len(resumed) == 1, messages
    match = re.search(r"from step (\d+), resumed from .*/checkpoints/step-(\d+)$", resumed[0])
    assert match and match[1] == match[2] and int(match[1]) >= HOLD_STEP, resumed
    log = (slurm_service.job_dir(job_id) / "logs" / "attempt-1.log").read_text()
    assert "DUE TO NODE FAILURE" in log and "restart 1 of job" in log

    # Resumed from its checkpoint, it trained what the uninterrupted run did, bit for bit.
    assert loss_series(slurm_service, job_id) == loss_series(slurm_service, reference)
    assert_same_training(slurm_service.job_dir(job_id), slurm_service.job_dir(reference))
    assert queued(job_id) == []
