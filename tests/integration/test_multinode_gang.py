"""Gang formation in SQL, without torchrun: who may join, atomically, and when a gang is broken."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from jobcore.db.migrate import upgrade
from jobcore.db.models import File, GangMember, Job, JobEvent, Project, utcnow
from jobcore.db.session import session_scope
from jobcore.settings import Settings
from worker import gang
from worker.claim import claim_next_job
from worker.gang_node import NodeSupervisor
from worker.launch import AttemptPaths, Rendezvous, free_port, resolve_torchrun, runner_env, torchrun_argv


def spec(nnodes: int, nproc: int = 1) -> dict[str, object]:
    return {
        "model": {"model_id": "/m"},
        "data": {"train_file": "/d"},
        "resources": {"nnodes": nnodes, "nproc_per_node": nproc},
    }


@pytest.fixture()
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'gang.db'}"
    upgrade(url)
    with session_scope(url) as session:
        session.add(Project(id="proj-1", name="p"))
    return url


def submit(db: str, nnodes: int, nproc: int = 1) -> str:
    with session_scope(db) as session:
        job = Job(project_id="proj-1", spec=spec(nnodes, nproc))
        session.add(job)
        session.flush()
        return job.id


def lead(db: str, worker: str, host: str) -> str:
    with session_scope(db) as session:
        job = claim_next_job(session, worker, lambda n: True)
        assert job is not None
        row = gang.lead(session, job, worker, host, "10.0.0.1")
        assert row.port and row.address == "10.0.0.1" and row.node_rank == 0
        return job.id


def join(db: str, worker: str, host: str, fits: bool = True) -> tuple[str, int] | None:
    with session_scope(db) as session:
        joined = gang.join_forming_gang(session, worker, host, lambda n: fits)
        return (joined[0].id, joined[1].node_rank) if joined else None


def test_nodes_join_once_each_on_distinct_hosts_up_to_nnodes(db: str) -> None:
    job_id = submit(db, nnodes=3)
    assert join(db, "w-b", "host-b") is None  # nothing forming yet: joining never claims
    lead(db, "w-a", "host-a")
    assert join(db, "w-a2", "host-a") is None  # a second worker of node 0's host
    assert join(db, "w-b", "host-b", fits=False) is None  # not enough free GPUs
    assert join(db, "w-b", "host-b") == (job_id, 1)
    assert join(db, "w-b2", "host-b") is None  # host-b is in the gang already
    assert join(db, "w-c", "host-c") == (job_id, 2)
    assert join(db, "w-d", "host-d") is None  # full
    with session_scope(db) as session:
        rows = gang.members(session, job_id, 1)
        assert [(r.node_rank, r.host) for r in rows] == [(0, "host-a"), (1, "host-b"), (2, "host-c")]
        gang.release(session, job_id, 1)
    with session_scope(db) as session:
        assert gang.count(session, job_id, 1) == 0


def test_the_unique_constraints_refuse_a_second_node_for_a_rank_or_a_host(db: str) -> None:
    from sqlalchemy.exc import IntegrityError

    job_id = submit(db, nnodes=8)
    lead(db, "w-a", "host-a")
    assert join(db, "w-b", "host-b") == (job_id, 1)
    for rank, host in ((1, "host-x"), (5, "host-b")):
        with pytest.raises(IntegrityError), session_scope(db) as session:
            session.add(GangMember(job_id=job_id, attempt=1, node_rank=rank, worker_id="w-x", host=host))


def test_single_node_jobs_are_never_joined(db: str) -> None:
    submit(db, nnodes=1)
    with session_scope(db) as session:
        job = claim_next_job(session, "w-a", lambda n: True)
        assert job is not None
    assert join(db, "w-b", "host-b") is None


def test_a_new_attempt_starts_a_new_gang(db: str) -> None:
    job_id = submit(db, nnodes=2)
    lead(db, "w-a", "host-a")
    join(db, "w-b", "host-b")
    with session_scope(db) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.status, job.attempt = "starting", 2  # as after a retry and a new claim
        gang.lead(session, job, "w-c", "host-c", "10.0.0.3")
    with session_scope(db) as session:
        rows = session.scalars(select(GangMember).where(GangMember.job_id == job_id)).all()
        assert [(r.attempt, r.host) for r in rows] == [(2, "host-c")]


def test_a_gang_is_broken_by_a_failed_silent_or_missing_node() -> None:
    now = utcnow()
    leader = GangMember(node_rank=0, host="a", status="launching", heartbeat_at=now)

    def node(status: str, age: float) -> GangMember:
        return GangMember(node_rank=1, host="b", status=status, heartbeat_at=now - timedelta(seconds=age))

    assert gang.broken_member([leader, node("running", 1)], 2, 10) is None
    assert gang.broken_member([leader, node("exited", 60)], 2, 10) is None  # finished, not lost
    assert "failed" in (gang.broken_member([leader, node("failed", 0)], 2, 10) or "")
    assert "shutting down" in (gang.broken_member([leader, node("left", 0)], 2, 10) or "")
    assert "lost" in (gang.broken_member([leader, node("running", 60)], 2, 10) or "")
    assert "1 of 2" in (gang.broken_member([leader], 2, 10) or "")


def test_a_node_that_cannot_resolve_the_spec_says_why_and_fails_its_row(db: str, tmp_path: Path) -> None:
    """No shared file system: node 1 resolves the spec on its own host, where the uploaded
    dataset's stored copy is not. It says so in an event and marks its row failed (node 0 then
    ends the attempt, as for a failed node), instead of a crash with a traceback."""
    with session_scope(db) as session:
        stored = tmp_path / "elsewhere" / "train.jsonl"  # on node 0's host only
        session.add(
            File(
                id="file-1",
                project_id="proj-1",
                filename="train.jsonl",
                format="jsonl",
                bytes=1,
                sha256="0" * 64,
                storage_path=str(stored),
            )
        )
        hub_model = {"model_id": "org/tiny-llama"}  # a hub id is not resolved on the host
        job = Job(project_id="proj-1", spec={**spec(2), "model": hub_model, "data": {"train_file": "file-1"}})
        session.add(job)
    job_id = lead(db, "w0", "host-a")
    assert join(db, "w1", "host-b") == (job_id, 1)
    with session_scope(db) as session:
        leader, member = gang.members(session, job_id, 1)
        gang.update_member(session, leader.id, status=gang.LAUNCHING)
        member_id = member.id
    settings = Settings(database_url=db, data_dir=tmp_path / "host-b")
    ended: list[NodeSupervisor] = []
    node = NodeSupervisor(settings, job_id, 1, member_id, 1, 2, [], 1, "twinkle_core.train", ended.append)
    node.start()
    node.thread.join(timeout=60)
    assert ended == [node]
    with session_scope(db) as session:
        rows = gang.members(session, job_id, 1)
        assert [(r.node_rank, r.status, r.exit_code) for r in rows][1] == (1, gang.FAILED, None)
        said = session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id)).all()
        assert gang.broken_member(rows, 2, 60) == (
            "node 1 (host-b) failed before its torchrun ran (its event says why)"
        )
    assert (
        "node 1 (host-b) cannot launch the job: data.train_file: the stored data of 'file-1' is missing "
        "on this worker"
    ) in said
    assert not (settings.jobs_dir / job_id / "logs").exists()  # torchrun never started


def test_torchrun_argv_of_a_node(tmp_path: Path) -> None:
    paths = AttemptPaths(tmp_path / "job-1", 3, node_rank=1)
    rendezvous = Rendezvous(2, 1, "10.0.0.1", 29400, join_timeout_seconds=120)
    joined = " ".join(torchrun_argv("torchrun", 8, paths, None, "twinkle_core.train", rendezvous))
    assert (
        "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job-1-3 "
        "--rdzv-conf is_host=0,join_timeout=120 --local-addr 10.0.0.1~node00001" in joined
    )
    lead = Rendezvous(2, 0, "10.0.0.1", 29400).torchrun_args("job-1-3")
    assert "is_host=1" in lead[lead.index("--rdzv-conf") + 1]
    assert lead[lead.index("--local-addr") + 1] == "10.0.0.1"  # node 0 names itself by its address
    assert paths.log == tmp_path / "job-1" / "logs" / "attempt-3-ranks" / "node-1" / "torchrun.log"
    assert AttemptPaths(tmp_path, 3, node_rank=0).log == tmp_path / "logs" / "attempt-3.log"
    assert AttemptPaths(tmp_path, 3).rank_logs == tmp_path / "logs" / "attempt-3-ranks"


RANK_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank()])
dist.all_reduce(total)
node = os.environ["TWINKLE_TEST_NODE"]
print("node", node, "rank", dist.get_rank(), "of", dist.get_world_size(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_c10d_gives_node_0_global_rank_0_whoever_starts_first(tmp_path: Path) -> None:
    """c10d orders nodes by (name, pid): node 1 starting first (the lower pid) must not take rank 0."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    torchrun = resolve_torchrun("torchrun")
    port = free_port()
    procs = []
    for node in (1, 0):
        rendezvous = Rendezvous(2, node, "127.0.0.1", port, join_timeout_seconds=120)
        argv = [torchrun, "--nproc_per_node", "1", *rendezvous.torchrun_args("t-1"), str(script)]
        env = {**runner_env("t", tmp_path, []), "TWINKLE_TEST_NODE": str(node)}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        if node == 1:
            time.sleep(1)  # node 1 waits for node 0's store; a head start is what could upset the order
    outputs = [proc.communicate(timeout=180)[0].decode() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert "node 1 rank 1 of 2" in outputs[0] and "node 0 rank 0 of 2" in outputs[1], outputs


@pytest.mark.slow
def test_a_node_alone_at_the_rendezvous_gives_up_after_the_join_timeout(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    rendezvous = Rendezvous(2, 0, "127.0.0.1", free_port(), join_timeout_seconds=3)
    argv = [
        resolve_torchrun("torchrun"),
        "--nproc_per_node",
        "1",
        *rendezvous.torchrun_args("t-2"),
        str(script),
    ]
    started = time.monotonic()
    done = subprocess.run(
        argv, env=runner_env("t", tmp_path, []), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "RendezvousTimeoutError" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 90
