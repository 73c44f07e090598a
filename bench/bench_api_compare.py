"""The API's read endpoints at two commits in one run, next to the bare FastAPI endpoint.

    python bench/bench_api_compare.py BEFORE_COMMIT [--after HEAD] [--jobs 20000] [--duration 5]
        [--repeats 3] [--connections 4 1]

On a shared machine two runs of `bench_api.py` minutes apart measure the neighbours as much as
the code. This one checks both commits out into temporary worktrees, serves them side by side
with the bare endpoint of `bench_api.py` (one uvicorn process each, one database), and loads them
in alternation: every round, the bare endpoint, then each endpoint of both commits in turn, the
order of the two commits flipped every other round. It reports the median over rounds of each
one's server CPU time per request (the steadier figure under load), requests/s and p99, and the
share of the bare endpoint's CPU per request (bare's over the endpoint's, per round).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_api
import common

SIDES = ("before", "after")


def _worktree(commit: str, directory: Path) -> None:
    argv = [
        "git",
        "-C",
        str(common.REPO_ROOT),
        "worktree",
        "add",
        "--quiet",
        "--detach",
        str(directory),
        commit,
    ]
    subprocess.run(argv, check=True)


def _remove_worktree(directory: Path) -> None:
    argv = ["git", "-C", str(common.REPO_ROOT), "worktree", "remove", "--force", str(directory)]
    subprocess.run(argv, check=False)


def _serve(target: str, root: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "uvicorn", "--factory", target, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", "1", "--log-level", "warning", "--no-access-log"]
    path = f"{root / 'bench'}{os.pathsep}{root}"
    return subprocess.Popen(argv, env={**env, "PYTHONPATH": path}, cwd=root)


def _summary(runs: list[dict[str, Any]], bare_runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = [run["server_cpu_us_per_request"] for run in runs]
    shares = [
        bare["server_cpu_us_per_request"] / run["server_cpu_us_per_request"]
        for run, bare in zip(runs, bare_runs, strict=True)
    ]
    return {
        "server_cpu_us_per_request": round(common.median(cpu), 1),
        "server_cpu_us_range": [min(cpu), max(cpu)],
        "cpu_share_of_bare": round(common.median(shares), 3),
        "cpu_share_of_bare_each": [round(share, 3) for share in shares],
        "requests_per_s": round(common.median([run["requests_per_s"] for run in runs]), 1),
        "p99_ms": round(common.median([run["p99_ms"] for run in runs]), 2),
    }


def measure(
    urls: dict[str, str],
    pids: dict[str, int],
    token: str,
    paths: dict[str, list[str]],
    args: argparse.Namespace,
    connections: int,
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"bare": []}
    for index in range(args.repeats):
        bare = bench_api.load(urls["bare"], None, paths["get_job"], args.duration, connections, pids["bare"])
        runs["bare"].append(bare)
        sides = SIDES if index % 2 == 0 else SIDES[::-1]
        for name, endpoint_paths in paths.items():
            for side in sides:
                result = bench_api.load(
                    urls[side], token, endpoint_paths, args.duration, connections, pids[side]
                )
                runs.setdefault(f"{side}:{name}", []).append(result)
        print(f"  connections={connections} round {index + 1}/{args.repeats} done", file=sys.stderr)
    return {key: _summary(key_runs, runs["bare"]) for key, key_runs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", help="the commit to compare against")
    parser.add_argument("--after", default="HEAD", help="the commit measured (default HEAD)")
    parser.add_argument("--jobs", type=int, default=20_000, help="rows inserted into jobs")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per endpoint, commit and round")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds per connection count")
    parser.add_argument("--connections", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--json-out", default=None, help="also write the result here")
    args = parser.parse_args()
    machine = common.machine_description()
    token = "tw-bench-api-" + uuid.uuid4().hex
    results: dict[str, Any] = {}
    procs: list[subprocess.Popen[bytes]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-api-compare-") as tmp,
        common.scratch_postgres("apicmp") as db_url,
    ):
        trees = {side: Path(tmp) / side for side in SIDES}
        _worktree(args.before, trees["before"])
        _worktree(args.after, trees["after"])
        try:
            sample = bench_api.fill_database(db_url, token, args.jobs)
            bench_api.add_progress_rows(db_url, sample[0], events=2000, points=2000)
            data_dir = Path(tmp) / "data"
            env = {
                **os.environ,
                "TWINKLE_DATA_DIR": str(data_dir),
                "TWINKLE_DATABASE_URL": db_url,
                "TWINKLE_BOOTSTRAP_TOKEN": token,
            }
            history = f"/v1/jobs/{sample[0]}"
            paths = {
                "get_job": [f"/v1/jobs/{job_id}" for job_id in sample],
                "list_jobs": ["/v1/jobs?limit=20"],
                "job_events": [f"{history}/events?order=desc&limit=50"],
                "job_metrics": [f"{history}/metrics?name=loss&max_points=500"],
            }
            ports = {name: common.free_port() for name in ("bare", *SIDES)}
            procs.append(_serve("bench_api:create_bare_app", trees["after"], env, ports["bare"]))
            for side in SIDES:
                procs.append(_serve("server.app:create_app", trees[side], env, ports[side]))
            pids = {name: proc.pid for name, proc in zip(("bare", *SIDES), procs, strict=True)}
            urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
            for url in urls.values():
                common.wait_http_ok(f"{url}/healthz", 60, procs)
            warmup = min(2.0, args.duration)
            bench_api.load(urls["bare"], None, paths["get_job"], warmup, max(args.connections))
            for side in SIDES:
                for endpoint_paths in paths.values():
                    bench_api.load(urls[side], token, endpoint_paths, warmup, max(args.connections))
            for connections in args.connections:
                results[f"connections_{connections}"] = measure(urls, pids, token, paths, args, connections)
        finally:
            for proc in procs:
                bench_api.stop(proc)
            for tree in trees.values():
                _remove_worktree(tree)
    for key, figures in results.items():
        bare_cpu = figures["bare"]["server_cpu_us_per_request"]
        for name in ("get_job", "list_jobs", "job_events", "job_metrics"):
            before, after = figures[f"before:{name}"], figures[f"after:{name}"]
            cpu = (before["server_cpu_us_per_request"], after["server_cpu_us_per_request"])
            shares = (100 * before["cpu_share_of_bare"], 100 * after["cpu_share_of_bare"])
            change = 100 * (cpu[1] / cpu[0] - 1)
            print(
                f"{key}: {name} server CPU {cpu[0]} -> {cpu[1]} us/request ({change:+.0f}%); "
                f"share of bare's {bare_cpu} us: {shares[0]:.1f}% -> {shares[1]:.1f}%",
                file=sys.stderr,
            )
    out = {
        "machine": machine,
        "before": args.before,
        "after": args.after,
        "jobs_in_database": args.jobs,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "results": results,
    }
    common.report("api_compare", out, args.json_out)


if __name__ == "__main__":
    main()
