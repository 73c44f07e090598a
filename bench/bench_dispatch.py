"""Dispatch latency: from the API's 201 to the worker's claim of the job, p50 and p99.

    python bench/bench_dispatch.py [--jobs 100] [--brokers redis,sqlite]

For each broker it starts `twinkle-jobs server` and `twinkle-jobs worker` on a fresh PostgreSQL
database, then submits jobs one at a time. The claim time is the `created_at` of the job's
status event "claimed by worker ..." (written in the claim's transaction, worker/claim.py); the
201 time is taken by this process as the response arrives. Both clocks are this machine's.

Only the claim matters here, so the worker's torchrun is `/bin/true` (TWINKLE_TORCHRUN): every
attempt ends at once and, with max_retries=0, the job fails without a retry. Jobs are submitted
sequentially (each one after the previous job has ended and the worker is idle), which measures
the idle-service latency.

Redis (the production broker) is the figure with a target (p50 <= 50 ms); the embedded SQLite
broker is measured next to it as the ratio's baseline and for comparison.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TARGET_P50_MS = 50.0
CLAIM_MESSAGE = "claimed by worker%"
TERMINAL = {"succeeded", "failed", "cancelled"}


def job_body(model_dir: Path, dataset: Path, index: int) -> dict[str, Any]:
    return {
        "name": f"dispatch-{index}",
        "max_retries": 0,
        "spec": {
            "model": {"model_id": str(model_dir), "mixed_precision": "no"},
            "data": {"train_file": str(dataset), "max_length": 32},
            "training": {"max_steps": 1},
        },
    }


def claim_time(database_url: str, job_id: str) -> float | None:
    """Unix time of the job's claim event, or None while it is unclaimed."""
    from sqlalchemy import select

    from jobcore.db.models import JobEvent
    from jobcore.db.session import session_scope

    with session_scope(database_url) as session:
        created = session.scalar(
            select(JobEvent.created_at)
            .where(JobEvent.job_id == job_id, JobEvent.message.like(CLAIM_MESSAGE))
            .order_by(JobEvent.id)
            .limit(1)
        )
    return created.timestamp() if created is not None else None


def wait_terminal(database_url: str, job_id: str, timeout: float = 30.0) -> None:
    from jobcore.db.models import Job
    from jobcore.db.session import session_scope

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with session_scope(database_url) as session:
            job = session.get(Job, job_id)
            if job is not None and job.status in TERMINAL:
                return
        time.sleep(0.02)
    raise TimeoutError(f"job {job_id} did not end within {timeout:.0f} s")


def measure_broker(broker: str, jobs: int, warmup: int, workdir: Path) -> dict[str, Any]:
    model_dir, dataset = common.tiny_assets(workdir / "assets")
    with common.scratch_postgres("dispatch") as db_url, common.scratch_redis() as redis_url:
        service = common.Service(
            data_dir=workdir / f"data-{broker}",
            database_url=db_url,
            broker_url=redis_url if broker == "redis" else None,  # None: the embedded SQLite broker
            extra_env={"TWINKLE_TORCHRUN": "/bin/true", "TWINKLE_ALLOWED_ROOTS": str(workdir)},
            worker_args=["--concurrency", "4"],
        )
        latencies_ms: list[float] = []
        with service, service.client() as client:
            for index in range(warmup + jobs):
                resp = client.post("/v1/jobs", json=job_body(model_dir, dataset, index))
                got_201 = time.time()
                if resp.status_code != 201:
                    raise RuntimeError(f"submit failed ({resp.status_code}): {resp.text}")
                job_id = resp.json()["id"]
                deadline = time.monotonic() + 30.0
                claimed = claim_time(db_url, job_id)
                while claimed is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"job {job_id} was not claimed within 30 s ({broker})")
                    time.sleep(0.002)
                    claimed = claim_time(db_url, job_id)
                if index >= warmup:  # the first jobs also pay connection set-up in the worker
                    latencies_ms.append(1000.0 * (claimed - got_201))
                # The next job must find the worker idle: an agent whose attempt just ended claims
                # again on its own, which would hide the broker's wake-up latency.
                wait_terminal(db_url, job_id)
                time.sleep(0.3)
    return {
        "jobs": len(latencies_ms),
        "p50_ms": round(common.percentile(latencies_ms, 50), 2),
        "p99_ms": round(common.percentile(latencies_ms, 99), 2),
        "min_ms": round(min(latencies_ms), 2),
        "max_ms": round(max(latencies_ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="measured jobs per broker")
    parser.add_argument("--warmup", type=int, default=5, help="jobs submitted first and not counted")
    parser.add_argument("--brokers", default="redis,sqlite", help="comma-separated: redis, sqlite")
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    unknown = set(brokers) - {"redis", "sqlite"}
    if unknown:
        raise ValueError(f"--brokers: unknown {sorted(unknown)} (known: redis, sqlite)")
    machine = common.machine_description()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp:
        for broker in brokers:
            results[broker] = measure_broker(broker, args.jobs, args.warmup, Path(tmp))
            print(f"{broker}: {results[broker]}", file=sys.stderr)
    out: dict[str, Any] = {"machine": machine, "database": "postgresql", "results": results}
    if "redis" in results:
        p50 = results["redis"]["p50_ms"]
        out["target"] = f"redis p50 <= {TARGET_P50_MS:.0f} ms"
        out["verdict"] = common.verdict(p50, TARGET_P50_MS)
        if "sqlite" in results:
            out["ratio_redis_p50_vs_sqlite_broker_p50"] = round(p50 / results["sqlite"]["p50_ms"], 3)
    common.report("dispatch", out, args.json_out)


if __name__ == "__main__":
    main()
