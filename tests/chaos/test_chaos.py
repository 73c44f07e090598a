"""Chaos: a stream of short jobs on PostgreSQL + Redis with two workers while the harness, in
rounds, kills a worker (-9), restarts Redis, restarts the API server and kills one training rank.

Jobs run through `gated_runner.py`, which holds every fresh run after step 3 until released, so a
worker or rank kill always strikes a job that is provably mid-way, whatever the machine's load.
Every wait is on observed state, bounded by one deadline for the whole test.

At the end: every submitted job succeeded at its last step and the API lists exactly those jobs
(none lost, none extra); no sample ever saw two live process trees for one job, and each job's
progress.jsonl holds one contiguous run of events per attempt, each resuming from the latest
checkpoint; every struck job was retried because of that fault; no job process is left before the
service stops; the API (health, list, read, submit) answered every call outside its own restarts;
every job's final weights equal those of an uninterrupted `python -m twinkle_core.train` run.
The fault table (with each fault's observed outcome) goes to the terminal summary and to
`<tmp>/chaos-table.txt`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from faults import Gatekeeper, Held, processes_mentioning, runs_under, training_ranks
from live_service import TOKEN, LiveService, tiny_spec
from observers import ApiProber, TreeSampler, attempt_segments
from redis_server import RedisServer
from safetensors.torch import load_file

from twinkle_client import TwinkleClient

ROUNDS = 2
STEPS = 8
MAX_JOBS = 12
# One deadline for everything the test waits on; about 150 s on an idle 2-core machine. The
# pytest timeout sits above it, so a stuck run fails here with a message and the table.
DEADLINE_SECONDS = 420
pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.timeout(DEADLINE_SECONDS + 120),
]
GATED_RUNNER = Path(__file__).with_name("gated_runner.py")


class Clock:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def at(self, moment: float) -> str:
        return f"t+{moment - self.start:.0f}s"


@dataclass
class Fault:
    round: int
    name: str
    at: float
    job_id: str | None = None
    attempt: int = 0  # the struck job's attempt when it was struck
    detail: str = ""
    outcome: str = ""
    ok: bool = False
    window: tuple[float, float] | None = None  # an API restart: when calls may fail


@pytest.fixture()
def chaos(
    tmp_path: Path, tiny_model_dir: Path, postgres_url: str
) -> Iterator[tuple[LiveService, RedisServer]]:
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    svc = LiveService.configure(
        tmp_path,
        [tiny_model_dir],
        TWINKLE_DATABASE_URL=postgres_url,
        TWINKLE_BROKER_URL=redis_server.url,
        TWINKLE_HEARTBEAT_SECONDS="1",
        TWINKLE_STALE_AFTER_SECONDS="8",
        TWINKLE_CANCEL_GRACE_SECONDS="5",
        TWINKLE_WORKER_RUNNER=str(GATED_RUNNER),
    )
    svc.start_server()
    try:
        yield svc, redis_server
    finally:
        svc.stop()
        redis_server.kill()


def wait_for(what: str, check: Callable[[], Any], clock: Clock, timeout: float = 120) -> Any:
    """Poll `check` until it returns something truthy; HTTP errors propagate (the prober, not
    this, is what excuses the API's restart windows)."""
    deadline = time.monotonic() + min(timeout, clock.left())
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def start_reference(spec: dict[str, Any], tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The same spec run by hand with plain torchrun and the plain runner, uninterrupted."""
    from twinkle_core.spec import JobSpec

    job_dir = tmp_path / "reference"
    job_dir.mkdir()
    JobSpec.model_validate(spec).dump(job_dir / "spec.json")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.Popen(
        [*argv, "-m", "twinkle_core.train", str(job_dir / "spec.json")],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "reference.log", "wb"),  # noqa: SIM115 - the child owns it
    )
    return proc, job_dir


def final_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    final = max(checkpoints.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    return load_file(str(final / "model.safetensors"))


class Chaos:
    """The run: the service, its observers, and the faults injected so far."""

    def __init__(self, svc: LiveService, redis_server: RedisServer, spec: dict[str, Any]) -> None:
        self.svc, self.redis = svc, redis_server
        self.clock = Clock(DEADLINE_SECONDS)
        self.jobs_dir = svc.data_dir / "jobs"
        body = {"name": "chaos", "spec": spec}
        self.prober = ApiProber(url_of=lambda: svc.url, token=TOKEN, job_body=body, max_jobs=MAX_JOBS)
        self.sampler = TreeSampler(self.jobs_dir)
        self.gate = Gatekeeper(self.jobs_dir, lambda: list(self.prober.submitted), self.prober.demand)
        self.workers = {
            host: svc.start_worker(log_name=f"worker-{host}.log", TWINKLE_WORKER_HOST=host)
            for host in ("host-a", "host-b")
        }
        self.faults: list[Fault] = []
        self.restarts: list[tuple[float, float]] = []

    def job(self, job_id: str) -> dict[str, Any]:
        with self.svc.client() as client:
            response = client.get(f"/v1/jobs/{job_id}")
            response.raise_for_status()
            job: dict[str, Any] = response.json()
            return job

    def wait_retried(self, fault: Fault) -> None:
        """Until the struck job has moved on to a later attempt (observed through the API)."""
        assert fault.job_id
        try:
            wait_for(
                f"{fault.job_id} to start a new attempt after '{fault.name}'",
                lambda: self.job(fault.job_id or "")["attempt"] > fault.attempt,
                self.clock,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from exc

    def strike(self, round_: int, name: str, held: Held) -> Fault:
        fault = Fault(round_, name, time.monotonic(), held.job_id, self.job(held.job_id)["attempt"])
        self.faults.append(fault)
        return fault

    # -- the four faults -------------------------------------------------------------------

    def diagnosis(self) -> str:
        """What a failed wait needs to be understood: the workers, the jobs, the workers' logs."""
        lines = [f"worker {host}: pid {w.pid}, exit code {w.poll()}" for host, w in self.workers.items()]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:  # quick reads: the API may be the thing that is down
            with httpx.Client(base_url=self.svc.url, headers=headers, timeout=3) as client:
                for job_id in list(self.prober.submitted):
                    job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
                    step = job["progress"]["step"]
                    lines.append(f"{job_id}: {job['status']}, attempt {job['attempt']}, step {step}")
        except httpx.HTTPError as exc:
            lines.append(f"jobs unreadable through the API: {exc!r}")
        for log in sorted(self.svc.data_dir.glob("worker-*.log")):
            lines += [f"--- {log.name} (tail)", log.read_text(errors="replace")[-3000:]]
        return "\n".join(lines)

    def kill_worker(self, round_: int, host: str) -> None:
        worker = self.workers[host]

        def worker_died() -> str | None:
            code = worker.poll()
            return None if code is None else f"worker {host} exited with {code}"

        try:
            held = self.gate.catch(runs_under(worker.pid), self.clock.left(), hopeless=worker_died)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from exc
        fault = self.strike(round_, f"kill -9 worker {host}", held)
        worker.kill()
        worker.wait()
        fault.detail = f"worker pid {worker.pid}; its job held at step {held.step}"
        self.workers[host] = self.svc.start_worker(
            log_name=f"worker-{host}-{round_}.log", TWINKLE_WORKER_HOST=host
        )
        self.wait_retried(fault)

    def restart_redis(self, round_: int) -> None:
        fault = Fault(round_, "restart Redis", time.monotonic())
        self.faults.append(fault)
        self.redis.kill()
        # While the broker is down, a user submits a job and lists jobs: both must work (SQL is the
        # record; the lost wake-up is made up by the workers' poll).
        began = time.monotonic()
        with self.svc.client() as client:
            created = client.post("/v1/jobs", json=self.prober.job_body)
            listed = client.get("/v1/jobs")
        took = time.monotonic() - began
        assert created.status_code == 201, created.text
        assert listed.status_code == 200, listed.text
        fault.job_id = created.json()["id"]
        self.prober.submitted.append(fault.job_id)
        self.redis.start()
        fault.detail = f"while down: submit 201 in {took * 1000:.0f} ms, list 200"

    def restart_api(self, round_: int) -> None:
        fault = Fault(round_, "restart API server", time.monotonic())
        self.faults.append(fault)
        self.prober.no_submit.set()  # a submit cut off mid-request would leave an unknown job
        began = time.monotonic()
        stopping, starting = self.svc.restart_server()
        healthy = time.monotonic()
        self.prober.no_submit.clear()
        fault.window = (began, healthy + 1.0)
        self.restarts.append(fault.window)
        fault.detail = f"down {healthy - began:.1f} s ({stopping:.1f} s to stop, {starting:.1f} s to start)"

    def kill_rank(self, round_: int) -> None:
        try:
            held = self.gate.catch(lambda _: True, self.clock.left())
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from exc
        fault = self.strike(round_, "kill -9 one training rank", held)
        spec_path = str(self.jobs_dir / held.job_id / "spec.json")
        ranks = {p.pid: p for w in self.workers.values() for p in training_ranks(w.pid)}
        mine = sorted(pid for pid, p in ranks.items() if spec_path in p.cmdline())
        assert held.rank0_pid in mine and len(mine) == 2, (held, mine)
        # Round 1 kills a non-zero rank, round 2 rank 0 (the one writing progress.jsonl).
        victim = held.rank0_pid if round_ % 2 == 0 else next(p for p in mine if p != held.rank0_pid)
        os.kill(victim, signal.SIGKILL)
        fault.detail = f"rank {'0' if victim == held.rank0_pid else '1'} (pid {victim}) at step {held.step}"
        self.wait_retried(fault)

    def run_rounds(self) -> None:
        for round_ in range(1, ROUNDS + 1):
            self.kill_worker(round_, "host-a" if round_ % 2 else "host-b")
            self.restart_redis(round_)
            self.restart_api(round_)
            self.kill_rank(round_)
        self.prober.close_stream()


def orphans_left(jobs_dir: Path, clock: Clock) -> list[str]:
    """Job processes still alive once every job ended (a few seconds allowed for dying ones)."""
    deadline = time.monotonic() + min(10.0, clock.left())
    while True:
        left = processes_mentioning(str(jobs_dir) + "/")
        if not left or time.monotonic() > deadline:
            return [f"{p.pid}: {' '.join(p.cmdline())[:200]}" for p in left if p.is_running()]
        time.sleep(0.2)


def retry_reasons(events: list[dict[str, Any]]) -> dict[int, str]:
    """attempt -> why it was retried, from the job's `retrying` status events."""
    reasons = {}
    for event in events:
        data = event.get("data") or {}
        if event["type"] == "status" and data.get("to") == "retrying":
            attempt, _, why = event["message"].removeprefix("attempt ").partition(" failed: ")
            reasons[int(attempt)] = why
    return reasons


def judge(run: Chaos, final: dict[str, dict[str, Any]], events: dict[str, list[dict[str, Any]]]) -> None:
    """Fill in each fault's observed outcome, and whether it is the one it should be."""
    for fault in run.faults:
        if fault.window is not None:
            inside = [f for f in run.prober.failures if f.during([fault.window])]
            fault.outcome = f"{len(inside)} API call(s) failed inside its window, as allowed"
            fault.ok = True
            continue
        assert fault.job_id is not None
        job = final[fault.job_id]
        reasons = retry_reasons(events[fault.job_id])
        end = f"{job['status']} after {job['attempt']} attempt(s)"
        if fault.name.startswith("kill -9 worker"):
            why = reasons.get(fault.attempt, "not retried")
            trees = run.sampler.trees_of(fault.job_id)
            gap = trees[1].first_seen - trees[0].last_seen if len(trees) > 1 else float("nan")
            fault.outcome = f"retry ({why}); old tree gone {gap:.1f} s before the new one; {end}"
            fault.ok = "lost" in why and gap > 0 and job["attempt"] > fault.attempt
        elif fault.name.startswith("kill -9 one training rank"):
            why = reasons.get(fault.attempt, "not retried")
            fault.outcome = f"retry ({why}); {end}"
            fault.ok = fault.attempt in reasons and "lost" not in why
        else:
            fault.outcome = end
            fault.ok = job["status"] == "succeeded"


def table(run: Chaos, final: dict[str, dict[str, Any]], equal: dict[str, bool]) -> str:
    head = f"{'round':<5} | {'at':<6} | {'fault':<26} | {'job':<30} | {'injected':<46} | {'ok':<3}"
    lines = [f"{head} | outcome"]
    for f in run.faults:
        lines.append(
            f"{f.round:<5} | {run.clock.at(f.at):<6} | {f.name:<26} | {f.job_id or '-':<30} | "
            f"{f.detail:<46} | {'yes' if f.ok else 'NO':<3} | {f.outcome}"
        )
    lines.append("")
    for job_id, job in final.items():
        weights = "weights == uninterrupted run" if equal.get(job_id) else "WEIGHTS DIFFER"
        lines.append(
            f"{job_id:<30} | {job['status']} at step {job['progress']['step']}, "
            f"{job['attempt']} attempt(s) | {weights}"
        )
    outside = [f for f in run.prober.failures if not f.during(run.restarts)]
    lines.append(
        f"{len(final)} jobs in {time.monotonic() - run.clock.start:.0f} s; API calls: {run.prober.calls}, "
        f"{len(run.prober.failures)} failed, {len(outside)} outside the API restarts; "
        f"process samples: {run.sampler.samples}, overlaps: {len(run.sampler.overlaps)}"
    )
    return "\n".join(lines)


def test_jobs_survive_worker_redis_api_and_rank_faults(
    chaos: tuple[LiveService, RedisServer],
    tmp_path: Path,
    tiny_model_dir: Path,
    chaos_report: Callable[[str], None],
) -> None:
    from twinkle_core.assets import write_text_dataset

    svc, redis_server = chaos
    dataset = write_text_dataset(tmp_path / "train.jsonl", n=96)
    spec = tiny_spec(tiny_model_dir, dataset, steps=STEPS, nproc=2, save_every=2, seed=7)
    reference, reference_dir = start_reference(spec, tmp_path)
    run = Chaos(svc, redis_server, spec)
    for observer in (run.prober, run.sampler, run.gate):
        observer.start()
    try:
        run.run_rounds()
        ids = list(run.prober.submitted)
        try:
            final_list = wait_for(
                "every job to end",
                lambda: (
                    (jobs := [run.job(i) for i in ids])
                    and all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs)
                    and jobs
                ),
                run.clock,
                timeout=DEADLINE_SECONDS,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{run.diagnosis()}") from exc
        orphans = orphans_left(run.jobs_dir, run.clock)  # before anything is told to stop
    finally:
        for observer in (run.prober, run.sampler, run.gate):
            observer.stop()
    final = {job["id"]: job for job in final_list}
    with TwinkleClient(svc.url, TOKEN) as client:
        listed = {job["id"] for job in client.jobs.list(limit=100)}
        events = {job_id: list(client.jobs.events(job_id)) for job_id in ids}
    assert reference.wait(timeout=max(run.clock.left(), 30)) == 0, (tmp_path / "reference.log").read_text()
    expected = final_weights(reference_dir / "checkpoints")
    equal = {}
    for job_id in ids:
        weights = final_weights(run.jobs_dir / job_id / "checkpoints")
        equal[job_id] = weights.keys() == expected.keys() and all(
            torch.equal(weights[k], v) for k, v in expected.items()
        )
    judge(run, final, events)
    report = table(run, final, equal)
    (tmp_path / "chaos-table.txt").write_text(report + "\n")
    chaos_report(report)

    # Every job is where it should be, and none was lost or made up.
    assert listed == set(ids), f"listed {sorted(listed)} vs submitted {sorted(ids)}"
    assert [(j["status"], j["progress"]["step"]) for j in final.values()] == [("succeeded", STEPS)] * len(ids)
    assert len(ids) >= 2 * ROUNDS + ROUNDS, "the stream brought too few jobs"
    # Each fault happened, struck what it should, and had the effect it should.
    assert len(run.faults) == 4 * ROUNDS
    assert all(f.ok for f in run.faults), report
    # None ran twice at once: no sample saw two trees of one job, and every attempt's events are
    # one contiguous run in progress.jsonl (one per attempt; only the last one finished).
    assert run.sampler.samples > 100 and run.sampler.overlaps == [], run.sampler.overlaps[:5]
    for job_id, job in final.items():
        segments = attempt_segments(run.jobs_dir / job_id / "progress.jsonl")
        story = (job_id, segments, [e["message"] for e in events[job_id]])  # what the job went through
        assert len(segments) == job["attempt"], story
        # A killed attempt ends without an event, or with rank 0's infra error (its peer died).
        # (One that finished just before its worker was killed is recorded as the job's success.)
        assert all(s.end in (None, "error") for s in segments[:-1]), story
        assert segments[-1].end == "done", story
    # No process of any job is left, checked while the workers still ran.
    assert orphans == [], orphans
    # The API answered every call outside its own restarts.
    outside = [f for f in run.prober.failures if not f.during(run.restarts)]
    assert outside == [], outside[:5]
    # Every job, struck or not, ends with the weights of an uninterrupted run.
    assert all(equal.values()), {k: v for k, v in equal.items() if not v}
