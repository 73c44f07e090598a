"""Multi-node jobs on Ray (`resources.launcher: "ray"`, `nnodes: 2`) against a real local Ray
cluster of two nodes (Ray's `cluster_utils.Cluster`: a head without CPUs, and two nodes of one CPU
each with their own custom resource), through the service (API server + worker subprocesses on
SQLite, the worker with `TWINKLE_RAY_ADDRESS`). One cluster and one service for the module.

- A 2-node job whose node 1 is SIGKILLed after its step-2 checkpoint fails as an infra error, is
  retried as a second Ray job from step-2, and ends `succeeded` with the losses and the weights
  (bit for bit) of a 2-node torchrun gang of the same spec (the c10d rendezvous of worker.gang's
  nodes, run here directly); both placement groups are removed.
- `POST /pause`: the signal reaches both nodes' ranks, the job is `paused` at a checkpoint; then,
  resumed and held again, `POST /cancel`: `cancelled`, the Ray job STOPPED, its placement group
  removed, no node actor alive, no torchrun or rank left.
- A lost worker's 2-node Ray job is stopped by the reconciler, which frees its group.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from two_node_reference import GangRun, assert_same_training, two_node_spec

ray = pytest.importorskip(
    "ray", reason="ray is not installed (the optional group: pip install 'twinkle-jobs[ray]')"
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# `twinkle_core.train` with a hold: the run whose global rank 0 takes the token file after a step
# from step 2 on waits there, its step-2 checkpoint complete, until it is stopped or paused (the
# other node's rank waits in its next collective), so a test acts on a job that provably has not
# finished. Waiting changes no arithmetic.
HOLD_RUNNER = r"""
import os, time
from twinkle_core import train

plain_after_step = train.JobRunner.after_step

def after_step(self, result):
    outcome = plain_after_step(self, result)
    rank0 = os.environ.get("RANK", "0") == "0"
    if outcome is None and rank0 and self.model.cur_step >= 2:
        try:
            os.rename(os.environ["TWINKLE_TEST_HOLD_TOKEN"], self.job_dir / "held")
        except FileNotFoundError:
            return outcome
        while not (self.stop.terminate or self.stop.pause):
            time.sleep(0.1)
    return outcome

train.JobRunner.after_step = after_step
train.run()
"""


@pytest.fixture(scope="module")
def dashboard_address() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    from twinkle_cli.stack import free_port

    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_JOB_STOP_WAIT_TIME_S")}
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a loopback test cluster needs no token
    # Ray's stop_job: SIGTERM to the driver, SIGKILL after this; the driver stops its nodes first.
    os.environ["RAY_JOB_STOP_WAIT_TIME_S"] = "30"
    store = 80 * 1024**2
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,  # the drivers run here; every rank runs on a node below
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port(),
            "object_store_memory": store,
        },
    )
    for node in ("node-a", "node-b"):
        cluster.add_node(num_cpus=1, resources={node: 1}, object_store_memory=store)
    cluster.wait_for_nodes()
    context = ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield f"http://{context.dashboard_url}"
    finally:
        ray.shutdown()
        cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def job_spec(tiny_model_dir: Path, text_dataset: Path) -> dict[str, Any]:
    return two_node_spec(tiny_model_dir, text_dataset, "ray")


class RayService:
    def __init__(self, svc: Any, token: Path, address: str) -> None:
        self.svc, self.token, self.address = svc, token, address

    def submit(self, spec: dict[str, Any], **fields: Any) -> str:
        with self.svc.client() as client:
            response = client.post("/v1/jobs", json={"name": "ray-gang", "spec": spec, **fields})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.svc.client() as client:
            return dict(client.get(f"/v1/jobs/{job_id}").json())

    def messages(self, job_id: str) -> list[str]:
        with self.svc.client() as client:
            page = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()
        return [event["message"] for event in page["data"]]

    def job_dir(self, job_id: str) -> Path:
        return Path(self.svc.data_dir) / "jobs" / job_id

    def wait_held(self, job_id: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not (self.job_dir(job_id) / "held").exists():
            job = self.job(job_id)
            assert job["status"] in ("queued", "starting", "running"), (job, self.svc.worker_log())
            assert time.monotonic() < deadline, f"job {job_id} never held: {job}\n{self.svc.worker_log()}"
            time.sleep(0.3)

    def ray_status(self, job_id: str, attempt: int) -> str:
        from ray.job_submission import JobSubmissionClient

        from worker.ray_launcher import submission_id

        return str(JobSubmissionClient(self.address).get_job_status(submission_id(job_id, attempt)))

    def placement_group(self, job_id: str, attempt: int) -> Any:
        from ray.util.state import list_placement_groups

        name = f"twinkle-{job_id}-attempt-{attempt}"
        groups = list_placement_groups(address=self.address, filters=[("name", "=", name)], detail=True)
        assert len(groups) == 1, groups
        return groups[0]

    def live_node_actors(self) -> list[Any]:
        from ray.util.state import list_actors

        actors = list_actors(address=self.address, filters=[("class_name", "=", "NodeRunner")])
        return [actor for actor in actors if actor.state != "DEAD"]


@pytest.fixture(scope="module")
def ray_service(
    dashboard_address: str, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, text_dataset: Path
) -> Iterator[RayService]:
    from live_service import LiveService

    root = tmp_path_factory.mktemp("ray-multinode")
    runner = root / "hold_runner.py"
    runner.write_text(HOLD_RUNNER)
    token = root / "hold-token"
    svc = LiveService.configure(
        root,
        [tiny_model_dir, text_dataset.parent],
        TWINKLE_RAY_ADDRESS=dashboard_address,
        TWINKLE_WORKER_RUNNER=str(runner),
        TWINKLE_TEST_HOLD_TOKEN=str(token),
        TWINKLE_HEARTBEAT_SECONDS="0.5",
        TWINKLE_CANCEL_GRACE_SECONDS="15",
        TWINKLE_WORKER_SLOTS="1",  # a Ray job takes no slot: the worker still hands off every job
    )
    svc.start_server()
    svc.start_worker()
    try:
        yield RayService(svc, token, dashboard_address)
    finally:
        svc.stop()


def node_processes(job_dir: Path, node: int | None = None) -> list[Any]:
    """The job's live torchrun and rank processes (of one node of the gang, or of all)."""
    import psutil

    from worker.process_tree import processes_referencing
    from worker.ray_plan import NODE_RANK_ENV

    found = []
    for proc in processes_referencing(str(job_dir), "spec.json"):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if node is None or proc.environ().get(NODE_RANK_ENV) == str(node):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_node_killed_mid_run_resumes_to_the_gang_result(
    ray_service: RayService, gang_reference: GangRun, tiny_model_dir: Path, text_dataset: Path
) -> None:
    import psutil

    ray_service.token.write_text("hold")
    job_id = ray_service.submit(job_spec(tiny_model_dir, text_dataset), max_retries=1)
    ray_service.wait_held(job_id)  # both nodes trained to step 2 and wait there

    running = ray_service.job(job_id)
    assert running["engine"] == {"name": "ray", "job_id": f"twinkle-{job_id}-attempt-1", "state": "RUNNING"}
    group = ray_service.placement_group(job_id, 1)
    assert group.state == "CREATED", group
    assert len({bundle.get("node_id") for bundle in group.bundles}) == 2, group  # STRICT_SPREAD
    victims = node_processes(ray_service.job_dir(job_id), node=1)
    assert len(victims) >= 2  # node 1's torchrun and its rank
    for proc in victims:
        proc.kill()
    psutil.wait_procs(victims, timeout=30)

    job = ray_service.svc.wait_terminal(job_id, timeout=420)
    assert job["status"] == "succeeded" and job["attempt"] == 2, (job, ray_service.svc.worker_log())
    assert job["engine"] == {"name": "ray", "job_id": f"twinkle-{job_id}-attempt-2", "state": "SUCCEEDED"}
    messages = ray_service.messages(job_id)
    assert any("killed by signal 9" in m for m in messages), messages
    resumed = [m for m in messages if "resuming from checkpoint" in m]
    assert len(resumed) == 1 and resumed[0].endswith("step-2"), messages
    assert [ray_service.ray_status(job_id, n) for n in (1, 2)] == ["FAILED", "SUCCEEDED"]
    assert [ray_service.placement_group(job_id, n).state for n in (1, 2)] == ["REMOVED", "REMOVED"]

    # The same run as a 2-node torchrun gang: every step's loss, and the final weights bit for bit.
    assert_same_training(ray_service.job_dir(job_id), gang_reference.result())
    assert node_processes(ray_service.job_dir(job_id)) == []


def test_pause_reaches_every_node_and_cancel_leaves_nothing_on_the_cluster(
    ray_service: RayService, tiny_model_dir: Path, text_dataset: Path
) -> None:
    """One job for both (a 2-node start costs most of a test): paused while held in attempt 1,
    resumed, held again in attempt 2, and cancelled there."""
    ray_service.token.write_text("hold")
    job_id = ray_service.submit(job_spec(tiny_model_dir, text_dataset))
    job_dir = ray_service.job_dir(job_id)
    ray_service.wait_held(job_id)
    with ray_service.svc.client() as client:
        assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
    deadline = time.monotonic() + 120
    while (job := ray_service.job(job_id))["status"] != "paused":
        assert job["status"] in ("running", "pausing") and time.monotonic() < deadline, job
        time.sleep(0.3)
    log = (job_dir / "logs" / "attempt-1.log").read_text()
    assert "signal 10 sent to 2 ranks on 2 nodes" in log, log[-3000:]
    # Every node's ranks stopped at the pause checkpoint and exited 0: the Ray job succeeded.
    assert ray_service.ray_status(job_id, 1) == "SUCCEEDED"
    assert "/checkpoints/step-" in job["resume_from"]
    assert ray_service.placement_group(job_id, 1).state == "REMOVED"
    assert node_processes(job_dir) == []

    (job_dir / "held").unlink()
    ray_service.token.write_text("hold")  # attempt 2 holds after its first step
    with ray_service.svc.client() as client:
        assert client.post(f"/v1/jobs/{job_id}/resume").status_code == 200
    ray_service.wait_held(job_id)
    assert len(ray_service.live_node_actors()) == 2
    with ray_service.svc.client() as client:
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    job = ray_service.svc.wait_terminal(job_id, timeout=120)
    assert job["status"] == "cancelled" and job["attempt"] == 2, (job, ray_service.svc.worker_log())
    assert ray_service.ray_status(job_id, 2) == "STOPPED"
    assert job["engine"] == {"name": "ray", "job_id": f"twinkle-{job_id}-attempt-2", "state": "STOPPED"}
    assert ray_service.placement_group(job_id, 2).state == "REMOVED"
    assert ray_service.live_node_actors() == []
    assert node_processes(job_dir) == []


def test_the_reconciler_frees_the_group_of_a_job_whose_worker_died(
    dashboard_address: str, tmp_path: Path
) -> None:
    """A worker that dies leaves its Ray job (and the nodes it holds) running: the reconciler stops
    it through Ray before it requeues the job, and the driver's end removes the group."""
    import sys

    from ray.job_submission import JobSubmissionClient

    from jobcore.db.migrate import upgrade
    from jobcore.db.models import Job, Project, WorkerNode, utcnow
    from jobcore.db.session import session_scope
    from jobcore.settings import Settings
    from worker import reconciler
    from worker.launch import AttemptPaths
    from worker.ray_launcher import RayJobAttempt

    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        ray_address=dashboard_address,
    )
    settings.ensure_dirs()
    upgrade(settings.resolved_database_url)
    spec = {"model": {"config": {}}, "data": {"train_file": "/dev/null"}}
    spec["resources"] = {"nnodes": 2, "launcher": "ray"}
    with session_scope(settings.resolved_database_url) as session:
        project = Project(name="p")
        session.add(project)
        session.add(WorkerNode(id="w-gone", host="elsewhere", pid=1, heartbeat_at=utcnow(), status="dead"))
        session.flush()
        job = Job(project_id=project.id, spec=spec, status="running", worker_id="w-gone", attempt=1)
        job.heartbeat_at = utcnow()
        session.add(job)
        session.flush()
        job_id = job.id
    job_dir = settings.jobs_dir / job_id
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps({**spec, "model": {"model_id": "/m"}}))
    # A stand-in for torchrun that trains nothing: each node runs it until it is stopped.
    sleeper = tmp_path / "sleeping-torchrun"
    sleeper.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    sleeper.chmod(0o755)
    paths = AttemptPaths(job_dir, 1)
    argv = [str(sleeper), "--nproc_per_node", "1", "--log-dir", str(paths.rank_logs), str(paths.spec)]
    ray_job = RayJobAttempt.submit(dashboard_address, job_id, 1, argv, {}, job_dir, paths.log, num_cpus=1)
    client = JobSubmissionClient(dashboard_address)
    deadline = time.monotonic() + 120
    while "2 nodes started" not in client.get_job_logs(ray_job.submission_id):
        assert client.get_job_status(ray_job.submission_id) in ("PENDING", "RUNNING")
        assert time.monotonic() < deadline
        time.sleep(0.5)

    assert reconciler.reconcile(settings, me="w-me") == [job_id]
    assert client.get_job_status(ray_job.submission_id) == "STOPPED"
    group = RayService(None, tmp_path, dashboard_address).placement_group(job_id, 1)
    assert group.state == "REMOVED"
    from worker.process_tree import processes_referencing

    assert processes_referencing(str(sleeper), "sleeping-torchrun") == []  # on neither node
    with session_scope(settings.resolved_database_url) as session:
        assert session.get_one(Job, job_id).status == "queued"
