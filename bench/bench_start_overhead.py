"""Start overhead: submit-to-first-step through the service vs the same torchrun run by hand.

    python bench/bench_start_overhead.py [--repeats 5] [--nproc 2] [--broker redis|sqlite]

The service is `twinkle-jobs server` + `twinkle-jobs worker` as subprocesses on a fresh
PostgreSQL database and Redis (the production set-up; `--broker sqlite` for the embedded
broker), started once and warm. One repetition is:

- service: the time from just before `POST /v1/jobs` to the `time` of the first `step` event in
  `<job_dir>/progress.jsonl` (written by rank 0 as the step ends);
- by hand: the time from just before `torchrun --standalone --nproc_per_node N -m
  twinkle_core.train spec.json` is started to the first `step` event of that run, with the same
  spec, tiny model (`twinkle_core.assets`) and environment (OMP_NUM_THREADS=1, as the worker sets).

The two alternate (after one warm-up of each, not counted) so that drift in the machine's load
hits both; the figure is the ratio of the medians. Target: <= 1.15.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TARGET_RATIO = 1.15
TERMINAL = {"succeeded", "failed", "cancelled"}
RUN_TIMEOUT = 300.0


def job_spec(model_dir: Path, dataset: Path, nproc: int, steps: int) -> dict[str, Any]:
    return {
        "model": {"model_id": str(model_dir), "mixed_precision": "no"},
        "data": {"train_file": str(dataset), "max_length": 32},
        "training": {"max_steps": steps, "batch_size": 2 * nproc, "log_every": 1, "save_total_limit": 1},
        "optimizer": {"lr": 1e-3},
        "resources": {"nproc_per_node": nproc},
    }


def by_hand(run_dir: Path, spec: dict[str, Any], nproc: int) -> float:
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(common.REPO_ROOT)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [torchrun, "--standalone", "--nproc_per_node", str(nproc), "-m", "twinkle_core.train", "spec.json"]
    began = time.time()
    with open(run_dir / "torchrun.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        first = common.wait_for_event(run_dir / "progress.jsonl", "step", RUN_TIMEOUT)
        if proc.wait(timeout=RUN_TIMEOUT) != 0:
            raise RuntimeError(f"the hand-run torchrun failed; see {run_dir / 'torchrun.log'}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return float(first["time"]) - began


def through_service(
    service: common.Service, client: Any, spec: dict[str, Any], index: int
) -> dict[str, float]:
    """Seconds from submit to the first step, and the stages in between."""
    began = time.time()
    resp = client.post("/v1/jobs", json={"name": f"start-overhead-{index}", "spec": spec, "max_retries": 0})
    if resp.status_code != 201:
        raise RuntimeError(f"submit failed ({resp.status_code}): {resp.text}")
    job_id = resp.json()["id"]
    first = common.wait_for_event(service.data_dir / "jobs" / job_id / "progress.jsonl", "step", RUN_TIMEOUT)
    deadline = time.monotonic() + RUN_TIMEOUT
    while (status := client.get(f"/v1/jobs/{job_id}").json()["status"]) not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not end within {RUN_TIMEOUT:.0f} s")
        time.sleep(0.2)
    if status != "succeeded":
        raise RuntimeError(f"job {job_id} ended {status}; see {service.data_dir / 'jobs' / job_id}")
    claimed, launched = milestones(service.database_url, job_id)
    return {
        "total": float(first["time"]) - began,
        "submit_to_claim": claimed - began,
        "claim_to_launch": launched - claimed,
        "launch_to_first_step": float(first["time"]) - launched,
    }


def milestones(database_url: str, job_id: str) -> tuple[float, float]:
    """Unix times of the job's claim and torchrun launch events (worker/claim.py, worker/supervisor.py)."""
    from sqlalchemy import select

    from jobcore.db.models import JobEvent
    from jobcore.db.session import session_scope

    with session_scope(database_url) as session:
        rows = session.execute(
            select(JobEvent.message, JobEvent.created_at)
            .where(JobEvent.job_id == job_id)
            .order_by(JobEvent.id)
        ).all()
    claimed = next(t for m, t in rows if m.startswith("claimed by worker"))
    launched = next(t for m, t in rows if m.startswith("launched torchrun"))
    return claimed.timestamp(), launched.timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="measured runs of each kind")
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes per run")
    parser.add_argument("--steps", type=int, default=2, help="max_steps of each run")
    parser.add_argument("--broker", choices=["redis", "sqlite"], default="redis")
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.repeats < 1 or args.nproc < 1 or args.steps < 1:
        raise ValueError("--repeats, --nproc and --steps must be positive")
    machine = common.machine_description()
    hand: list[float] = []
    service_s: list[float] = []
    breakdown: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-start-") as tmp,
        common.scratch_postgres("start") as db_url,
        common.scratch_redis() as redis_url,
    ):
        work = Path(tmp)
        model_dir, dataset = common.tiny_assets(work / "assets")
        spec = job_spec(model_dir, dataset, args.nproc, args.steps)
        service = common.Service(
            data_dir=work / "data",
            database_url=db_url,
            broker_url=redis_url if args.broker == "redis" else None,
            extra_env={"TWINKLE_ALLOWED_ROOTS": str(work), "OMP_NUM_THREADS": "1"},
            worker_args=["--concurrency", "1"],
        )
        with service, service.client() as client:
            for index in range(args.repeats + 1):  # index 0: warm-up of both, not counted
                first_hand = by_hand(work / "hand" / str(index), spec, args.nproc)
                stages = through_service(service, client, spec, index)
                print(f"run {index}: by hand {first_hand:.2f} s, service {stages}", file=sys.stderr)
                if index > 0:
                    hand.append(first_hand)
                    service_s.append(stages["total"])
                    for name, value in stages.items():
                        breakdown.setdefault(name, []).append(value)
    ratio = common.median(service_s) / common.median(hand)
    out = {
        "machine": machine,
        "setup": f"PostgreSQL + {args.broker} broker, tiny Llama, nproc_per_node={args.nproc}",
        "repeats": args.repeats,
        "by_hand_s": [round(x, 2) for x in hand],
        "service_s": [round(x, 2) for x in service_s],
        "by_hand_median_s": round(common.median(hand), 2),
        "service_median_s": round(common.median(service_s), 2),
        "service_stages_median_s": {name: round(common.median(v), 3) for name, v in breakdown.items()},
        "ratio_service_vs_hand": round(ratio, 3),
        "target": f"ratio <= {TARGET_RATIO}",
        "verdict": common.verdict(ratio, TARGET_RATIO),
    }
    common.report("start_overhead", out, args.json_out)


if __name__ == "__main__":
    main()
