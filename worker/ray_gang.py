"""The driver of a multi-node Ray job: one torchrun per node of a STRICT_SPREAD placement group.

`python -m worker.ray_gang <job_dir>/ray/attempt-<k>.json` is the entrypoint the worker submits
through Ray's job API (worker.ray_launcher). It

1. reserves one bundle per node (`nproc_per_node` CPUs, and as many GPUs when the cluster has
   GPUs), STRICT_SPREAD so that no two bundles share a node, and waits until Ray placed them all
   (Ray's gang start: no node starts before every node has its resources);
2. starts one `NodeRunner` actor in each bundle; node 0's actor names its address and a free port,
   and every node runs torchrun with the c10d rendezvous there (the same rendezvous as a gang of
   workers, worker.launch.Rendezvous, so node 0 holds global rank 0 and writes progress.jsonl);
3. forwards the worker's pause signal (a file in the job dir, worker.ray_plan) to every node's
   ranks, and on SIGTERM (Ray's stop_job: cancel, timeout, a lost worker's job being stopped)
   stops every node's torchrun;
4. ends when every node ended, or as soon as one failed (the others are stopped: their ranks wait
   in collectives with the dead one), and removes the placement group, which also ends its actors.

Its exit mirrors the gang: 0 when every node exited 0; 2 when a node's runner rejected the job (a
user error); else the first failing node's exit, re-raised as the same signal when torchrun was
killed by one, so that `outcome.classify` reads a Ray gang's end as it reads torchrun's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from worker.launch import AttemptPaths, Rendezvous
from worker.outcome import USER_ERROR_EXIT_CODE
from worker.process_tree import ProcessTree, kill_all
from worker.ray_plan import NODE_RANK_ENV, GangPlan, node_argv, take_signal_request

log = logging.getLogger("worker.ray_gang")

POLL_SECONDS = 0.5
LOST_NODE_EXIT_CODE = -signal.SIGKILL  # a node whose actor died (node lost): as a SIGKILLed torchrun
_PR_SET_PDEATHSIG = 1


def _die_with_the_actor() -> None:
    """In torchrun's child process before exec: SIGTERM when the actor's process dies (Ray kills
    the actors of a stopped job's driver with SIGKILL, which they cannot pass on themselves);
    torchrun then stops its ranks."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@ray.remote(max_concurrency=4)  # type: ignore[call-overload]  # `run` blocks one thread; the rest use others
class NodeRunner:
    """One node of the gang: runs its torchrun and answers for its process tree."""

    def __init__(self) -> None:
        self.tree: ProcessTree | None = None
        self._started = threading.Event()

    def rendezvous_endpoint(self) -> tuple[str, int]:
        """This node's address and a port free on it, for the c10d store node 0's torchrun hosts."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def run(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        """torchrun's exit code; its output goes to this actor's stdout, which Ray sends to the
        driver, so it lands in the Ray job's log (the attempt's log)."""
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_the_actor,  # a prctl only: safe between fork and exec
        )
        self.tree = ProcessTree(proc.pid)
        self._started.set()
        while proc.poll() is None:
            self.tree.refresh()
            time.sleep(POLL_SECONDS)
        kill_all(self.tree.members.values())  # ranks that outlived torchrun
        return int(proc.returncode)

    def signal_ranks(self, sig: int) -> int:
        return self.tree.signal_ranks(sig) if self.tree is not None else 0

    def stop(self, grace_seconds: float) -> None:
        if self._started.wait(timeout=grace_seconds) and self.tree is not None:
            self.tree.terminate(grace_seconds)


class GangDriver:
    """One attempt's placement group, its node actors, and how the gang ended."""

    def __init__(self, plan: GangPlan) -> None:
        self.plan = plan
        self.stop_requested = threading.Event()
        self.runners: list[Any] = []

    def bundle(self) -> dict[str, float]:
        """One node's resources: a CPU per rank, and a GPU per rank when the cluster has GPUs."""
        nproc = float(self.plan.nproc_per_node)
        has_gpus = ray.cluster_resources().get("GPU", 0.0) > 0
        return {"CPU": nproc, "GPU": nproc} if has_gpus else {"CPU": nproc}

    def run(self) -> int:
        bundle = self.bundle()
        group = placement_group([bundle] * self.plan.nnodes, strategy="STRICT_SPREAD", name=self.plan.name)
        try:
            if not self._placed(group, bundle):
                return -signal.SIGTERM  # stopped while waiting for nodes
            return self._run_nodes(group, bundle)
        finally:
            # Ends the node actors too; torchrun dies with its actor (_die_with_the_actor).
            remove_placement_group(group)
            print(f"placement group {self.plan.name} removed", flush=True)

    def _placed(self, group: Any, bundle: dict[str, float]) -> bool:
        print(f"placement group {self.plan.name}: {self.plan.nnodes} x {bundle}, STRICT_SPREAD", flush=True)
        ready = group.ready()
        waited = 0.0
        while not self.stop_requested.is_set():
            done, _ = ray.wait([ready], timeout=POLL_SECONDS * 4)
            if done:
                ray.get(ready)
                print(f"placement group {self.plan.name} ready", flush=True)
                return True
            waited += POLL_SECONDS * 4
            if waited % 60 < POLL_SECONDS * 4:  # now and then: a cluster too small waits here
                print(f"waiting {waited:.0f} s for {self.plan.nnodes} nodes with {bundle}", flush=True)
        return False

    def _run_nodes(self, group: Any, bundle: dict[str, float]) -> int:
        plan = self.plan
        for index in range(plan.nnodes):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            self.runners.append(
                NodeRunner.options(  # type: ignore[attr-defined]
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0.0), scheduling_strategy=strategy
                ).remote()
            )
        address, port = ray.get(self.runners[0].rendezvous_endpoint.remote())
        calls = {}
        for index, runner in enumerate(self.runners):
            rendezvous = Rendezvous(plan.nnodes, index, address, port, plan.join_timeout_seconds)
            logs = AttemptPaths(Path(plan.job_dir), plan.attempt, index).rank_logs
            argv = node_argv(plan.argv, rendezvous, f"{plan.job_id}-{plan.attempt}", logs)
            env = {**plan.env, NODE_RANK_ENV: str(index)}
            calls[runner.run.remote(argv, env, plan.job_dir)] = index
        print(f"{plan.nnodes} nodes started, rendezvous on node 0 at {address}:{port}", flush=True)
        return self._follow(calls)

    def _follow(self, calls: dict[Any, int]) -> int:
        codes: dict[int, int] = {}
        pending = list(calls)
        failed: int | None = None  # the first node that ended non-zero
        while pending and failed is None and not self.stop_requested.is_set():
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            for ref in done:
                node = calls[ref]
                codes[node] = self._exit_code(ref, node)
                print(f"node {node} exited with {codes[node]}", flush=True)
                if codes[node] != 0 and failed is None:
                    failed = node
            if (sig := take_signal_request(Path(self.plan.job_dir), self.plan.attempt)) is not None:
                sent = ray.get([runner.signal_ranks.remote(sig) for runner in self.runners])
                print(f"signal {sig} sent to {sum(sent)} ranks on {len(sent)} nodes", flush=True)
        if pending:  # a node failed, or Ray asked us to stop: the others must not wait on it
            why = (
                "stop requested: stopping every node"
                if failed is None
                else f"node {failed} failed: stopping the others"
            )
            print(why, flush=True)
            self._stop_all()
        if failed is None:
            return -signal.SIGTERM if pending else 0
        if USER_ERROR_EXIT_CODE in codes.values():
            return USER_ERROR_EXIT_CODE
        return codes[failed]

    def _exit_code(self, ref: Any, node: int) -> int:
        try:
            return int(ray.get(ref))
        except RayActorError as exc:  # the node (or its actor) was lost
            print(f"node {node}: its actor died ({exc})", flush=True)
            return LOST_NODE_EXIT_CODE

    def _stop_all(self) -> None:
        grace = self.plan.stop_grace_seconds
        stops = [runner.stop.remote(grace) for runner in self.runners]
        # A dead actor has nothing left to stop; the group's removal ends the rest.
        with contextlib.suppress(RayActorError):
            ray.wait(stops, num_returns=len(stops), timeout=2 * grace + 10)


def exit_as(code: int) -> None:
    """Exit with `code`; a negative one re-raises that signal, as torchrun's death would read."""
    sys.stdout.flush()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)  # the signal is delivered before this ends
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m worker.ray_gang <job_dir>/ray/attempt-<k>.json")
    plan = GangPlan.load(Path(args[0]))
    driver = GangDriver(plan)
    ray.init(log_to_driver=True)  # inside a Ray job: the job's own cluster
    # After ray.init, which installs a handler that dies on SIGTERM at once: ours stops the nodes
    # first. Only a flag here: the main loop stops them (never block in a signal handler).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: driver.stop_requested.set())
    try:
        code = driver.run()
    finally:
        ray.shutdown()
    exit_as(code)


if __name__ == "__main__":
    main()
