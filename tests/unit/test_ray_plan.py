"""What the worker hands a multi-node Ray job, without Ray: each node's torchrun command, the plan
file and the pause request (worker.ray_plan; the driver itself: tests/integration/test_ray_multinode.py)."""

from __future__ import annotations

import signal
from pathlib import Path

from worker.launch import AttemptPaths, Rendezvous, torchrun_argv
from worker.ray_plan import GangPlan, node_argv, plan_path, request_signal, take_signal_request


def test_each_node_runs_the_supervisors_command_with_the_gangs_rendezvous(tmp_path: Path) -> None:
    paths = AttemptPaths(tmp_path, 2)
    single = torchrun_argv("/bin/torchrun", 4, paths, str(tmp_path / "step-2"), "twinkle_core.train")
    rendezvous = Rendezvous(3, 1, "10.0.0.7", 29500, join_timeout_seconds=60)
    node_logs = AttemptPaths(tmp_path, 2, 1).rank_logs
    argv = node_argv(single, rendezvous, f"{tmp_path.name}-2", node_logs)
    # Exactly what a gang node of worker.gang runs: torchrun_argv with the rendezvous.
    assert argv == torchrun_argv(
        "/bin/torchrun",
        4,
        AttemptPaths(tmp_path, 2, 1),
        str(tmp_path / "step-2"),
        "twinkle_core.train",
        rendezvous,
    )
    assert argv.count("--nnodes") == 1 and argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--log-dir") + 1] == str(tmp_path / "logs" / "attempt-2-ranks" / "node-1")
    assert argv[argv.index("-m") :] == [
        "-m",
        "twinkle_core.train",
        str(paths.spec),
        "--resume-from",
        str(tmp_path / "step-2"),
    ]


def test_the_plan_round_trips_and_a_pause_request_is_taken_once(tmp_path: Path) -> None:
    plan = GangPlan("job-1", 3, str(tmp_path), 2, 1, ["torchrun"], {"A": "1"}, 60.0, 10.0)
    plan.dump(plan_path(tmp_path, 3))
    assert GangPlan.load(plan_path(tmp_path, 3)) == plan
    assert plan.name == "twinkle-job-1-attempt-3"  # the Ray job's submission id, too
    assert take_signal_request(tmp_path, 3) is None
    request_signal(tmp_path, 3, signal.SIGUSR1)
    assert take_signal_request(tmp_path, 3) == signal.SIGUSR1
    assert take_signal_request(tmp_path, 3) is None  # consumed: the driver sends it once
