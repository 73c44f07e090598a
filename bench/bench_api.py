"""API throughput and latency with 100k jobs in PostgreSQL, next to a bare FastAPI endpoint.

    python bench/bench_api.py [--jobs 100000] [--duration 10] [--connections 4 1] [--repeats 3]

1. A fresh PostgreSQL database is brought to head (`alembic upgrade head`) and filled with
   `--jobs` rows through SQLAlchemy core (a mix of statuses like a long-lived install: mostly
   finished jobs, 1% queued, 1% running), owned by the project of the bench's API token; half
   of the succeeded jobs have checkpoints (steps 25, 50 and 100, the oldest deleted by
   `save_total_limit`, step 50 the best), so the latest/best checkpoint lookups find rows.
2. The baseline: a bare FastAPI app (`create_bare_app` below: one route, a constant JSON body, no
   database, no auth) served by uvicorn with the same settings as the service.
3. The service: `uvicorn --factory server.app:create_app` with TWINKLE_DATABASE_URL set.
4. The load generator, `wrk` on loopback (Debian package `wrk`; a Python asyncio/httpx generator
   is used if it is missing, which costs the server some CPU on a small machine), hits
   `GET /v1/jobs/{id}` with ids drawn from the inserted rows, `GET /v1/jobs?limit=20`, and the
   event and metric pages of one job with a long history (2,000 events, 2,000 loss points), for
   `--duration` seconds each with each of `--connections`.
5. Both servers run throughout and the load alternates between them: `--repeats` rounds, each
   the bare endpoint then every service endpoint (their order reversed every other round). Each
   service figure is divided by the bare figure of its own round; the medians are reported.
   The machine is shared, so a single round would say more about the neighbours than the code.

Targets: job read and list >= 40% of the bare endpoint's requests/s; list p99 <= 30 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TARGET_THROUGHPUT_SHARE = 0.40
TARGET_LIST_P99_MS = 30.0
INSERT_CHUNK = 5000
# Status mix of the inserted jobs (a long-lived install is mostly history).
STATUS_WEIGHTS = {"succeeded": 0.90, "failed": 0.05, "cancelled": 0.03, "queued": 0.01, "running": 0.01}
SAMPLED_IDS = 2000  # ids the load generator cycles through for GET /v1/jobs/{id}
CHECKPOINT_SHARE = 0.5  # of succeeded jobs
CHECKPOINT_STEPS = ((25, False, True), (50, True, False), (100, False, False))  # step, is_best, deleted


def create_bare_app() -> Any:
    """The baseline: FastAPI with one route of the same shape and no work behind it."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/jobs/{job_id}")
    def bare_job(job_id: str) -> dict[str, Any]:
        return {"object": "job", "id": job_id, "status": "succeeded"}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


# ------------------------------------------------------------------------------- the data
def fill_database(database_url: str, token: str, count: int, seed: int = 0) -> list[str]:
    """Schema at head, the bench token's project, `count` jobs; returns a sample of their ids."""
    from sqlalchemy import Table, insert

    from jobcore.db import migrate
    from jobcore.db.models import Checkpoint, Job
    from jobcore.db.session import get_engine, session_scope
    from server.auth.service import DEFAULT_PROJECT, register_token
    from twinkle_core.spec import JobSpec

    migrate.upgrade(database_url)
    with session_scope(database_url) as session:
        project_id = register_token(session, token, DEFAULT_PROJECT, ["admin"], "bench").project_id
    spec = JobSpec.model_validate(
        {"model": {"model_id": "/data/models/llama"}, "data": {"train_file": "file-0123456789abcdef"}}
    ).model_dump(mode="json")
    rng = random.Random(seed)
    statuses, weights = zip(*STATUS_WEIGHTS.items(), strict=True)
    start = datetime.now(UTC) - timedelta(days=365)
    ids: list[str] = []
    table, checkpoint_table = Job.__table__, Checkpoint.__table__
    assert isinstance(table, Table) and isinstance(checkpoint_table, Table)
    engine = get_engine(database_url)
    for first in range(0, count, INSERT_CHUNK):
        rows = []
        checkpoints = []
        for index in range(first, min(count, first + INSERT_CHUNK)):
            job_id = f"job-{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}"
            status = rng.choices(statuses, weights)[0]
            created = start + timedelta(seconds=300 * index)
            finished = status in ("succeeded", "failed", "cancelled")
            rows.append(
                {
                    "id": job_id,
                    "project_id": project_id,
                    "name": f"bench-job-{index}",
                    "status": status,
                    "spec": spec,
                    "metadata": {"team": f"team-{index % 7}"},
                    "attempt": 0 if status == "queued" else 1,
                    "step": 100 if finished else 37,
                    "total_steps": 100,
                    "created_at": created,
                    "updated_at": created,
                    "started_at": None if status == "queued" else created + timedelta(seconds=5),
                    "finished_at": created + timedelta(seconds=600) if finished else None,
                    "error": {"kind": "user", "message": "bad data"} if status == "failed" else None,
                }
            )
            ids.append(job_id)
            if status == "succeeded" and rng.random() < CHECKPOINT_SHARE:
                checkpoints += [
                    {
                        "id": f"ckpt-{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}",
                        "job_id": job_id,
                        "step": step,
                        "path": f"/data/jobs/{job_id}/checkpoints/step-{step}",
                        "metrics": {"loss": round(1.0 / step, 4)},
                        "size_bytes": 1 << 20,
                        "is_best": is_best,
                        "deleted": deleted,
                        "created_at": created + timedelta(seconds=step),
                    }
                    for step, is_best, deleted in CHECKPOINT_STEPS
                ]
        with engine.begin() as conn:
            conn.execute(insert(table), rows)
            if checkpoints:
                conn.execute(insert(checkpoint_table), checkpoints)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return rng.sample(ids, min(SAMPLED_IDS, len(ids)))


# --------------------------------------------------------------------------- the servers
def start_uvicorn(target: str, env: dict[str, str], port: int, access_log: bool) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "uvicorn", "--factory", target, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", "1", "--log-level", "warning"]
    if not access_log:
        argv.append("--no-access-log")
    return subprocess.Popen(argv, env=env, cwd=common.REPO_ROOT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------- load generators
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(
    url: str, token: str | None, paths: list[str], duration: float, connections: int
) -> dict[str, Any]:
    """wrk with one thread (the other core serves); cycles through `paths`."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        quoted = ",".join(f'"{p}"' for p in paths)
        script.write(
            f"paths = {{{quoted}}}\ncounter = 0\n"
            "request = function()\n  counter = counter + 1\n"
            '  return wrk.format("GET", paths[(counter % #paths) + 1])\nend\n'
        )
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration:.0f}s", "--latency", "-s", script.name]
    if token:
        argv += ["-H", f"Authorization: Bearer {token}"]
    try:
        out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    latency = {q: _ms(v) for q, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)$", out, re.M)}
    if not {"50", "99"} <= latency.keys():
        raise RuntimeError(f"no latency distribution in wrk's output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {
        "requests_per_s": round(rps, 1),
        "p50_ms": round(latency["50"], 2),
        "p99_ms": round(latency["99"], 2),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(0) if errors else None,
        "generator": "wrk",
    }


async def _python_load(
    url: str, token: str | None, paths: list[str], duration: float, connections: int
) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    latencies: list[float] = []
    non_2xx = 0
    deadline = time.monotonic() + duration

    async def user(client: httpx.AsyncClient, offset: int) -> None:
        nonlocal non_2xx
        index = offset
        while time.monotonic() < deadline:
            began = time.perf_counter()
            resp = await client.get(paths[index % len(paths)])
            latencies.append(1000.0 * (time.perf_counter() - began))
            non_2xx += resp.status_code >= 300
            index += connections

    limits = httpx.Limits(max_connections=connections)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30.0) as client:
        began = time.monotonic()
        await asyncio.gather(*(user(client, i) for i in range(connections)))
        elapsed = time.monotonic() - began
    return {
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(common.percentile(latencies, 50), 2),
        "p99_ms": round(common.percentile(latencies, 99), 2),
        "non_2xx": non_2xx,
        "generator": "python-httpx",
    }


def load(
    url: str,
    token: str | None,
    paths: list[str],
    duration: float,
    connections: int,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """One load run. With `server_pid`, also the server's CPU time per request: on a shared
    machine the throughput follows the neighbours' load, the CPU a request costs much less so."""
    cpu_before = common.cpu_seconds(server_pid) if server_pid else 0.0
    if shutil.which("wrk"):
        result = run_wrk(url, token, paths, duration, connections)
    else:
        result = asyncio.run(_python_load(url, token, paths, duration, connections))
    if server_pid:
        requests = result["requests_per_s"] * duration
        result["server_cpu_us_per_request"] = round(
            1e6 * (common.cpu_seconds(server_pid) - cpu_before) / requests, 1
        )
    if result["non_2xx"]:
        raise RuntimeError(f"{result['non_2xx']} responses were not 2xx for {paths[0]}: the figure is void")
    return result


# ----------------------------------------------------------------------------------- main
def _summary(runs: list[dict[str, Any]], bare_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats, and the share of bare paired with the bare run of each repeat
    (in requests/s, and in the server's CPU time per request: bare's over the endpoint's)."""
    pairs = list(zip(runs, bare_runs, strict=True))
    shares = [run["requests_per_s"] / bare["requests_per_s"] for run, bare in pairs]
    cpu_shares = [bare["server_cpu_us_per_request"] / run["server_cpu_us_per_request"] for run, bare in pairs]
    return {
        "requests_per_s": round(common.median([r["requests_per_s"] for r in runs]), 1),
        "p50_ms": round(common.median([r["p50_ms"] for r in runs]), 2),
        "p99_ms": round(common.median([r["p99_ms"] for r in runs]), 2),
        "p99_ms_worst": max(r["p99_ms"] for r in runs),
        "server_cpu_us_per_request": round(common.median([r["server_cpu_us_per_request"] for r in runs]), 1),
        "share_of_bare": round(common.median(shares), 3),
        "share_of_bare_each": [round(x, 3) for x in shares],
        "cpu_share_of_bare": round(common.median(cpu_shares), 3),
        "runs": runs,
    }


def measure(
    urls: dict[str, str],
    pids: dict[str, int],
    token: str,
    paths: dict[str, list[str]],
    args: argparse.Namespace,
    connections: int,
) -> dict[str, Any]:
    """`--repeats` rounds; each loads the bare endpoint and then every service endpoint in turn,
    the order of the service endpoints reversed every other round, so slow drifts in the
    machine's load fall on all of them alike; every service figure is paired with its round's
    bare figure."""
    names = [name for name in paths if name != "bare"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    for index in range(args.repeats):
        order = ["bare", *(names if index % 2 == 0 else reversed(names))]
        for name in order:
            server = "bare" if name == "bare" else "service"
            auth = None if name == "bare" else token
            runs[name].append(load(urls[server], auth, paths[name], args.duration, connections, pids[server]))
        print(f"  connections={connections} round {index + 1}/{args.repeats} done", file=sys.stderr)
    out = {name: _summary(runs[name], runs["bare"]) for name in names}
    out["bare"] = _summary(runs["bare"], runs["bare"])
    return out


def add_progress_rows(database_url: str, job_id: str, events: int, points: int) -> None:
    """A long run's history on one job: `events` events and `points` loss points (the dashboard's
    polls of its events and metrics pages)."""
    from sqlalchemy import Table, insert

    from jobcore.db.models import JobEvent, JobMetric
    from jobcore.db.session import get_engine

    event_table, metric_table = JobEvent.__table__, JobMetric.__table__
    assert isinstance(event_table, Table) and isinstance(metric_table, Table)
    now = datetime.now(UTC)
    with get_engine(database_url).begin() as conn:
        conn.execute(
            insert(event_table),
            [
                {
                    "job_id": job_id,
                    "type": "step",
                    "message": f"step {i}",
                    "data": {"step": i},
                    "created_at": now,
                }
                for i in range(events)
            ],
        )
        conn.execute(
            insert(metric_table),
            [
                {"job_id": job_id, "name": "loss", "step": i, "value": 1.0 / (i + 1), "created_at": now}
                for i in range(1, points + 1)
            ],
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="rows inserted into jobs")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per endpoint and round")
    parser.add_argument(
        "--connections", type=int, nargs="+", default=[4, 1], help="concurrent connections (each measured)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds per connection count")
    parser.add_argument("--access-log", action="store_true", help="keep uvicorn's access log (both servers)")
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.jobs < 1 or args.duration <= 0 or min(args.connections) < 1 or args.repeats < 1:
        raise ValueError("--jobs, --duration, --connections and --repeats must be positive")
    machine = common.machine_description()
    token = "tw-bench-api-" + uuid.uuid4().hex
    results: dict[str, Any] = {}
    warmup = min(2.0, args.duration)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp, common.scratch_postgres("api") as db_url:
        began = time.monotonic()
        sample = fill_database(db_url, token, args.jobs)
        add_progress_rows(db_url, sample[0], events=2000, points=2000)
        insert_s = time.monotonic() - began
        print(f"inserted {args.jobs} jobs in {insert_s:.1f} s", file=sys.stderr)
        env = {
            **os.environ,
            "PYTHONPATH": str(common.REPO_ROOT),
            "TWINKLE_DATA_DIR": tmp,
            "TWINKLE_DATABASE_URL": db_url,
            "TWINKLE_BOOTSTRAP_TOKEN": token,
        }
        history = f"/v1/jobs/{sample[0]}"
        paths = {
            "bare": [f"/v1/jobs/{job_id}" for job_id in sample],
            "get_job": [f"/v1/jobs/{job_id}" for job_id in sample],
            "list_jobs": ["/v1/jobs?limit=20"],
            # What the job page polls: the newest events, and the loss curve downsampled.
            "job_events": [f"{history}/events?order=desc&limit=50"],
            "job_metrics": [f"{history}/metrics?name=loss&max_points=500"],
        }
        bare_env = {**env, "PYTHONPATH": f"{common.REPO_ROOT / 'bench'}{os.pathsep}{common.REPO_ROOT}"}
        try:
            # Both servers stay up, so that the rounds can alternate between them; an idle one
            # costs no CPU.
            ports = {"bare": common.free_port(), "service": common.free_port()}
            procs.append(start_uvicorn("bench_api:create_bare_app", bare_env, ports["bare"], args.access_log))
            procs.append(start_uvicorn("server.app:create_app", env, ports["service"], args.access_log))
            urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
            pids = {"bare": procs[0].pid, "service": procs[1].pid}
            for url in urls.values():
                common.wait_http_ok(f"{url}/healthz", 60, procs)
            for name, endpoint_paths in paths.items():
                url, auth = (urls["bare"], None) if name == "bare" else (urls["service"], token)
                load(url, auth, endpoint_paths, warmup, max(args.connections))
            for connections in args.connections:
                results[f"connections_{connections}"] = measure(urls, pids, token, paths, args, connections)
        finally:
            for proc in procs:
                stop(proc)

    verdicts: dict[str, str] = {}
    for key, figures in results.items():
        for name in ("get_job", "list_jobs"):
            share = figures[name]["share_of_bare"]
            verdicts[f"{key}.{name}_share"] = common.verdict(
                share, TARGET_THROUGHPUT_SHARE, lower_is_better=False
            )
            print(
                f"{key}: {name} {figures[name]['requests_per_s']} req/s (p99 {figures[name]['p99_ms']} ms) = "
                f"{100 * share:.1f}% of bare {figures['bare']['requests_per_s']} req/s (same rounds); "
                f"server CPU {figures[name]['server_cpu_us_per_request']} us/request = "
                f"{100 * figures[name]['cpu_share_of_bare']:.1f}% of bare's "
                f"{figures['bare']['server_cpu_us_per_request']} us",
                file=sys.stderr,
            )
        verdicts[f"{key}.list_p99"] = common.verdict(figures["list_jobs"]["p99_ms"], TARGET_LIST_P99_MS)
    out = {
        "machine": machine,
        "jobs_in_database": args.jobs,
        "insert_seconds": round(insert_s, 1),
        "duration_s": args.duration,
        "repeats": args.repeats,
        "uvicorn": "1 process each, --log-level warning" + ("" if args.access_log else ", --no-access-log"),
        "results": results,
        "targets": {
            "throughput_share": f">= {TARGET_THROUGHPUT_SHARE:.0%} of bare (median of the per-round shares)",
            "list_p99_ms": f"<= {TARGET_LIST_P99_MS:.0f} (median over rounds)",
        },
        "verdicts": verdicts,
    }
    common.report("api", out, args.json_out)


if __name__ == "__main__":
    main()
