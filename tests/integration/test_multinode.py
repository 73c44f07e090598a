"""Multi-node jobs: two workers on this machine act as two hosts (TWINKLE_WORKER_HOST host-a and
host-b) and run `nnodes=2, nproc_per_node=1` jobs with the real runner on gloo, joined by torch's
c10d rendezvous.

These tests act on observed progress only. The jobs are slow enough for that to be safe: each
optimizer step accumulates 8 micro-batches, so a job is many seconds from its end when a test
kills something at an observed step, even on a loaded machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient
from safetensors.torch import load_file
from sqlalchemy import select
from test_worker_real_runner import assert_bitwise_equal
from test_worker_support import WorkerEnv, job_processes, kill_tree, make_env, real_spec

from jobcore.db.models import GangMember, Job, Project, WorkerNode
from jobcore.db.session import session_scope
from jobcore.settings import Settings
from server.app import create_app
from server.auth.service import create_token
from twinkle_core.checkpoint import step_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LOOPBACK = {"TWINKLE_WORKER_ADDRESS": "127.0.0.1"}
HOSTS = ("host-a", "host-b")
STEPS = 40
SAVE_EVERY = 2
PROGRESS = 4  # steps past an attempt's resume point before the test strikes


def gang_spec(model_dir: Path, train_file: Path, nnodes: int = 2) -> dict[str, Any]:
    spec = real_spec(model_dir, train_file, max_steps=STEPS, nproc=1, save_every=SAVE_EVERY)
    spec["resources"] = {"nnodes": nnodes, "nproc_per_node": 1}
    spec["training"]["batch_size"] = 2 * nnodes  # divisible by the data-parallel ranks
    spec["training"]["gradient_accumulation_steps"] = 8  # slow steps: see the module docstring
    return spec


def final_weights(env: WorkerEnv, job_id: str) -> dict[str, Any]:
    ckpt = env.data_dir / "jobs" / job_id / "checkpoints" / f"step-{STEPS}"
    assert (ckpt / "COMPLETE").exists(), sorted(p.name for p in ckpt.parent.iterdir())
    weights: dict[str, Any] = {}
    for path in sorted(ckpt.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    assert weights
    return weights


def gang_rows(env: WorkerEnv, job_id: str) -> list[GangMember]:
    with session_scope(env.database_url) as session:
        query = select(GangMember).where(GangMember.job_id == job_id).order_by(GangMember.node_rank)
        rows = list(session.scalars(query))
        for row in rows:
            session.expunge(row)
        return rows


def wait_rows(
    env: WorkerEnv, job_id: str, predicate: Callable[[list[GangMember]], bool], what: str, timeout: float = 60
) -> list[GangMember]:
    deadline = time.monotonic() + timeout
    while not predicate(rows := gang_rows(env, job_id)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {rows}\n{env.worker_logs()}"
        time.sleep(0.2)
    return rows


def wait_online(env: WorkerEnv, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(env.database_url) as session:
            online = session.scalars(select(WorkerNode.id).where(WorkerNode.status == "online")).all()
        if len(online) >= count:
            return
        assert time.monotonic() < deadline, f"only {len(online)} workers online\n{env.worker_logs()}"
        time.sleep(0.2)


def running_past_resume(env: WorkerEnv, job_id: str, attempt: int, timeout: float = 240) -> Job:
    """Wait until `attempt` trains PROGRESS steps beyond the checkpoint it resumed from."""

    def ready(job: Job) -> bool:
        if job.status in ("succeeded", "failed", "cancelled"):
            raise AssertionError(f"job ended before attempt {attempt} could be struck: {job.error}")
        start = step_of(job.resume_from) or 0
        return job.attempt == attempt and job.status == "running" and job.step >= start + PROGRESS

    return env.wait_for(job_id, ready, timeout=timeout, what=f"attempt {attempt} past its resume point")


def nodes_of(env: WorkerEnv, job_id: str, attempt: int) -> dict[int, str]:
    rows = [r for r in gang_rows(env, job_id) if r.attempt == attempt]
    nodes = {r.node_rank: r.host for r in rows}
    assert sorted(nodes.values()) == sorted(HOSTS), rows
    return nodes


def attempt_processes(env: WorkerEnv, job_id: str, workers: dict[str, Any]) -> list[psutil.Process]:
    """This attempt's processes (torchrun and ranks), checked to include both nodes' trees."""
    procs = job_processes(env, job_id)
    for host, worker in workers.items():
        tree = {p.pid for p in psutil.Process(worker.pid).children(recursive=True)}
        assert tree & {p.pid for p in procs}, f"no process of {host}'s node among {procs}"
    return procs


def ranks_of(worker_pid: int) -> list[psutil.Process]:
    """The training ranks a worker's torchrun started (grandchildren of the worker)."""
    worker = psutil.Process(worker_pid)
    children = {p.pid for p in worker.children()}
    return [
        p
        for p in worker.children(recursive=True)
        if p.pid not in children and "spec.json" in " ".join(p.cmdline())
    ]


def assert_all_ended(procs: list[psutil.Process], timeout: float = 30) -> None:
    def alive() -> list[psutil.Process]:
        out = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        return out

    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert alive() == [], "processes of the failed attempt outlived it"


def next_attempt(env: WorkerEnv, job_id: str, after: int, timeout: float = 120) -> Job:
    job = env.wait_for(
        job_id,
        lambda j: j.attempt > after or j.status in ("queued", "retrying", "failed", "succeeded"),
        timeout=timeout,
        what=f"the end of attempt {after}",
    )
    assert job.status not in ("failed", "succeeded"), job.error
    return job


@contextlib.contextmanager
def api_client(env: WorkerEnv) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The HTTP API over the workers' database and data directory, with a read token."""
    settings = Settings(data_dir=env.data_dir, database_url=env.database_url, broker_url=env.broker_url)
    with session_scope(env.database_url) as session:
        project = session.get(Project, env.project_id)
        assert project is not None
        plain, _ = create_token(session, project.name, ("read",), name="multinode-test")
    with TestClient(create_app(settings, dispatch=lambda job_id: None)) as client:
        yield client, {"Authorization": f"Bearer {plain}"}


def log_files(api: tuple[TestClient, dict[str, str]], job_id: str, **params: int) -> dict[str, list[str]]:
    client, headers = api
    response = client.get(f"/v1/jobs/{job_id}/logs", params={"lines": 400, **params}, headers=headers)
    assert response.status_code == 200, response.text
    return {f["name"]: f["lines"] for f in response.json()["files"]}


def check_logs_of_every_node(api: tuple[TestClient, dict[str, str]], job_id: str) -> None:
    every = log_files(api, job_id, attempt=1)
    assert "attempt-1.log" in every and "attempt-1-ranks/node-1/torchrun.log" in every, every.keys()
    for node in (0, 1):  # every node's per-rank output
        assert any(n.startswith(f"attempt-1-ranks/node-{node}/") and "stdout" in n for n in every), every
    node1 = log_files(api, job_id, attempt=1, node=1)
    assert node1 and all(n.startswith("attempt-1-ranks/node-1/") for n in node1), node1.keys()
    assert "attempt-1.log" in log_files(api, job_id, attempt=1, node=0)
    # `rank` is the global rank: local rank 0 of node 1 is rank 1, and rank 0 is node 0's only.
    for rank, node in ((0, 0), (1, 1)):
        own = log_files(api, job_id, attempt=1, rank=rank)
        assert {n.rsplit("/", 1)[-1] for n in own} == {"stdout.log", "stderr.log"}, own.keys()
        assert all(n.startswith(f"attempt-1-ranks/node-{node}/") for n in own), own.keys()
    assert log_files(api, job_id, attempt=1, node=0, rank=1) == {}


def test_two_hosts_run_one_job_and_survive_losing_any_node(
    tmp_path: Path, postgres_url: str, redis_url: str, tiny_model_dir: Path, text_dataset: Path
) -> None:
    env = make_env(tmp_path, postgres_url, redis_url, **LOOPBACK)
    try:
        spec = gang_spec(tiny_model_dir, text_dataset)
        workers = {host: env.start_worker(TWINKLE_WORKER_HOST=host) for host in HOSTS}

        # 1. Uninterrupted: both nodes run the job to the end; progress comes from global rank 0.
        reference = env.submit(spec, name="reference")
        done = env.wait_status(reference, "succeeded", "failed", timeout=300)
        assert done.status == "succeeded", done.error
        assert done.attempt == 1 and done.step == STEPS
        messages = [e.message for e in env.events(reference)]
        assembled = [m for m in messages if m.startswith("gang assembled")]
        assert len(assembled) == 1 and "host-a" in assembled[0] and "host-b" in assembled[0], messages
        assert any("world size 2" in m for m in messages), messages
        assert gang_rows(env, reference) == []  # leases released
        with api_client(env) as api:
            check_logs_of_every_node(api, reference)

        victim = env.submit(spec, name="victim", max_retries=3)

        # 2. kill -9 node 1's worker and its ranks (host lost): the attempt ends on every node and
        # the job waits, queued or starting, until a second host is back.
        running_past_resume(env, victim, attempt=1)
        nodes = nodes_of(env, victim, 1)
        doomed = attempt_processes(env, victim, workers)
        kill_tree(workers[nodes[1]].pid)
        next_attempt(env, victim, after=1)
        assert_all_ended(doomed)  # node 0's tree too
        workers[nodes[1]] = env.start_worker(TWINKLE_WORKER_HOST=nodes[1])

        # 3. One rank on node 1 dies while its worker lives: node 1 marks its row failed, node 0
        # ends the attempt on every node, and the same two workers run the retry.
        running_past_resume(env, victim, attempt=2)
        nodes = nodes_of(env, victim, 2)
        doomed = attempt_processes(env, victim, workers)
        (rank,) = ranks_of(workers[nodes[1]].pid)
        rank.kill()
        next_attempt(env, victim, after=2)
        assert_all_ended(doomed)
        assert all(worker.poll() is None for worker in workers.values())

        # 4. kill -9 node 0's worker and its ranks: nobody heartbeats the job any more; the other
        # host's reconciler requeues it (stale heartbeat), then a replacement host rejoins.
        running_past_resume(env, victim, attempt=3)
        nodes = nodes_of(env, victim, 3)
        doomed = attempt_processes(env, victim, workers)
        kill_tree(workers[nodes[0]].pid)
        next_attempt(env, victim, after=3)
        assert_all_ended(doomed)  # node 1's tree too
        workers[nodes[0]] = env.start_worker(TWINKLE_WORKER_HOST=nodes[0])

        done = env.wait_status(victim, "succeeded", "failed", timeout=300)
        assert done.status == "succeeded", done.error
        assert done.attempt == 4
        resumed = [
            e.data["resume_from"] for e in env.events(victim) if "resuming from checkpoint" in e.message
        ]
        steps = [step_of(path) or 0 for path in resumed]
        assert len(steps) == 3 and steps == sorted(steps) and steps[0] >= PROGRESS - SAVE_EVERY, resumed
        assert_bitwise_equal(final_weights(env, reference), final_weights(env, victim))
        assert job_processes(env) == []

        # Node 1's own log of attempt 2, through the API: torchrun's report of its killed rank.
        with api_client(env) as api:
            node1 = log_files(api, victim, attempt=2, node=1)
        report = node1["attempt-2-ranks/node-1/torchrun.log"]
        assert any("exitcode" in line and "-9" in line for line in report), report
    finally:
        env.stop_workers()


def test_a_gang_whose_last_node_never_comes_releases_every_lease_and_requeues(
    tmp_path: Path, postgres_url: str, redis_url: str, tiny_model_dir: Path, text_dataset: Path
) -> None:
    """nnodes=3 on two hosts: node 1 joins (leases its slot, starts waiting), node 2 never comes."""
    env = make_env(tmp_path, postgres_url, redis_url, TWINKLE_GANG_TIMEOUT_SECONDS="20", **LOOPBACK)
    try:
        for host in HOSTS:
            env.start_worker(TWINKLE_WORKER_HOST=host)
        wait_online(env, len(HOSTS))  # so that the second host joins within a poll of the claim
        job_id = env.submit(gang_spec(tiny_model_dir, text_dataset, nnodes=3), name="short-handed")
        rows = wait_rows(env, job_id, lambda r: len(r) == 2, "node 1 to join")
        joined = rows[1]
        assert joined.node_rank == 1 and joined.host != rows[0].host
        # Node 1's supervisor runs: it heartbeats its row while it waits for node 0's go.
        wait_rows(
            env,
            job_id,
            lambda r: len(r) == 2 and r[1].heartbeat_at > joined.heartbeat_at,
            "node 1's heartbeat",
        )
        env.wait_for(
            job_id,
            lambda j: any(e.message.startswith("gang did not assemble") for e in env.events(job_id)),
            timeout=90,
            what="the gang timeout",
        )
        gave_up = [e.message for e in env.events(job_id) if e.message.startswith("gang did not assemble")]
        assert "2 of 3 nodes joined" in gave_up[0], gave_up
        # Both leases came back: each worker has one slot, and both are in the next gang at once.
        wait_rows(env, job_id, lambda r: len({m.host for m in r}) == 2, "the next gang", timeout=60)
        env.stop_workers()  # node 0 stopping gives the next gang up the same way

        job = env.job(job_id)
        assert job.status == "queued" and job.attempt == 0, (job.status, job.attempt)  # no attempt charged
        assert job.gpu_ids is None and job.pids is None and job.running_since is None
        assert gang_rows(env, job_id) == []
        assert job_processes(env) == []  # torchrun never started, on either host
        assert not (env.data_dir / "jobs" / job_id / "logs").exists()
    finally:
        env.stop_workers()
