"""Pure worker logic: exit classification, GPU leases, checkpoint discovery, command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinkle_core.checkpoint import complete_step_checkpoints, latest_complete_checkpoint, step_of
from worker.gpus import GpuLedger, discover_gpus
from worker.ingest import Observed
from worker.launch import AttemptPaths, runner_env, torchrun_argv
from worker.outcome import Outcome, StopCause, classify


def test_classify_follows_the_runner_contract() -> None:
    assert classify(0, Observed(done=True), None, "").outcome == Outcome.SUCCEEDED
    assert classify(0, Observed(stopped_reason="pause"), None, "").outcome == Outcome.PAUSED
    user = classify(1, Observed(error_kind="user", error_message="bad row"), None, "tail")
    assert (user.outcome, user.message, user.retryable) == (Outcome.USER_ERROR, "bad row", False)
    # torchrun exits 1 whatever its ranks did; their codes are in its failure summary
    summary = "[0]:\n  exitcode  : 2 (pid: 11)\n[1]:\n  exitcode  : 2 (pid: 12)"
    assert classify(1, Observed(), None, summary).outcome == Outcome.USER_ERROR
    assert classify(-9, Observed(), None, "").retryable
    assert classify(1, Observed(error_kind="infra", error_message="gloo timeout"), None, "").retryable
    assert classify(0, Observed(), None, "").retryable  # exit 0 without `done` is not success
    mixed = "exitcode  : 2 (pid: 11)\nexitcode  : -9 (pid: 12)"
    assert classify(1, Observed(), None, mixed).retryable
    stop = StopCause(Outcome.TIMEOUT, "too long")
    assert classify(-15, Observed(done=True), stop, "").outcome == Outcome.TIMEOUT


def test_a_crash_after_done_is_success_only_with_the_final_checkpoint_on_disk(tmp_path: Path) -> None:
    final = tmp_path / "checkpoints" / "step-8"
    final.mkdir(parents=True)
    seen = Observed(done=True, final_checkpoint=str(final))
    # the marker is not there yet: the final save did not finish, so this is a retryable failure
    assert classify(-6, seen, None, "terminate called").outcome == Outcome.INFRA_ERROR
    (final / "COMPLETE").write_text("ok")
    result = classify(-6, seen, None, "terminate called")
    assert result.outcome == Outcome.SUCCEEDED and not result.retryable
    assert "exited with -6 during shutdown" in result.message
    # without a `done` event the same exit is retried, marker or not
    assert classify(-6, Observed(final_checkpoint=str(final)), None, "").retryable


def test_gpu_ledger_leases_disjoint_gpus() -> None:
    ledger = GpuLedger(["0", "1", "2"], cpu_slots=1)
    a = ledger.acquire("a", 2)
    assert a is not None and a.gpu_ids == ["0", "1"]
    assert not ledger.fits(2) and ledger.fits(1)
    assert ledger.acquire("b", 2) is None
    b = ledger.acquire("b", 1)
    assert b is not None and b.gpu_ids == ["2"]
    assert not ledger.has_capacity()
    ledger.release("a")
    assert ledger.free_gpus() == ["0", "1"]


def test_cpu_ledger_counts_slots() -> None:
    ledger = GpuLedger([], cpu_slots=2)
    assert ledger.acquire("a", 4) is not None  # CPU ranks need no GPUs
    assert ledger.acquire("b", 1) is not None
    assert ledger.acquire("c", 1) is None
    ledger.release("b")
    assert ledger.has_capacity()


def test_discover_gpus_from_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    assert discover_gpus("0, 3,5") == ["0", "3", "5"]
    assert discover_gpus("") == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,7")
    assert discover_gpus(None) == ["2", "7"]


def test_latest_complete_checkpoint_ignores_unfinished(tmp_path: Path) -> None:
    for step, complete in ((2, True), (10, True), (12, False)):
        d = tmp_path / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        if complete:
            (d / "COMPLETE").write_text("ok")
    (tmp_path / "checkpoints" / ".tmp-step-14").mkdir()
    assert [step_of(p) for p in complete_step_checkpoints(tmp_path / "checkpoints")] == [2, 10]
    latest = latest_complete_checkpoint(tmp_path)
    assert latest is not None and step_of(latest) == 10
    assert latest_complete_checkpoint(tmp_path / "nothing") is None


def test_torchrun_command_is_an_argument_list(tmp_path: Path) -> None:
    paths = AttemptPaths(tmp_path / "job-x", 3)
    argv = torchrun_argv("/bin/torchrun", 2, paths, "/ckpt/step-4", "twinkle_core.train")
    assert argv[:5] == ["/bin/torchrun", "--nproc_per_node", "2", "--nnodes", "1"]
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1].startswith("127.0.0.1:")
    assert argv[-5:] == ["-m", "twinkle_core.train", str(paths.spec), "--resume-from", "/ckpt/step-4"]
    assert paths.log.name == "attempt-3.log"
    env = runner_env("job-x", paths.job_dir, ["4", "5"])
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["TWINKLE_JOB_ID"] == "job-x"


def test_terminate_kills_descendants_in_other_sessions_that_ignore_sigterm(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    import psutil

    from worker.process_tree import ProcessTree

    # A parent (like torchrun) whose child lives in its own session and ignores SIGTERM (like a
    # rank stuck in a collective): only the snapshot + SIGKILL after the grace period ends it.
    child_code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    parent_code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {child_code!r}], start_new_session=True); time.sleep(600)"
    )
    root = subprocess.Popen([sys.executable, "-c", parent_code], start_new_session=True)
    tree = ProcessTree(root.pid)
    deadline = time.monotonic() + 20
    while len(tree.ranks()) < 1 and time.monotonic() < deadline:
        tree.refresh()
        time.sleep(0.1)
    (child,) = tree.ranks()
    assert child.pid != root.pid
    started = time.monotonic()
    tree.terminate(grace_seconds=1.0)
    root.wait(timeout=10)
    assert time.monotonic() - started < 8
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert tree.alive() == []


def test_retention_rule_counts_the_best_and_always_keeps_the_newest() -> None:
    from twinkle_core.checkpoint import retained

    steps = [1, 2, 3, 4, 5]
    assert retained(steps, None, 2) == {4, 5}
    assert retained(steps, 1, 2) == {1, 5}  # the best takes one of the two places
    assert retained(steps, 1, 1) == {1, 5}  # ...but never the newest's, which a resume needs
    assert retained(steps, 5, 1) == {5}
    assert retained(steps, 3, 3) == {3, 4, 5}
    assert retained(steps, 9, 2) == {4, 5}  # a best that is gone already takes no place
    assert retained([], None, 2) == set()


def test_the_consumer_is_started_again_until_it_ends_cleanly_or_is_asked_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker import main

    pauses: list[float] = []
    monkeypatch.setattr(main.time, "sleep", pauses.append)
    codes = iter([1, 1, 1, 0, 1])
    calls: list[int] = []

    def consume() -> int:
        calls.append(1)
        return next(codes)

    main.keep_consuming(consume, lambda: False)
    assert len(calls) == 4  # three crashes, then the clean exit ends it
    assert pauses == [1.0, 2.0, 4.0]  # backing off between crashes in a row

    # A signal ends it whatever the exit code, including one that arrives during the pause
    # (seen before a second start).
    def crash() -> int:
        calls.append(1)
        return 1

    for requests in ([False, True], [False, False, True]):
        answers = iter(requests)
        calls.clear()
        main.keep_consuming(crash, answers.__next__)
        assert len(calls) == 1
