"""`twinkle_core.train` with a gate, so the chaos suite can strike a job that cannot have finished.

A fresh run (not resumed from a checkpoint) stops after step GATE_STEP (the step-2 checkpoint
is complete by then, with `save_every=2`); rank 0 writes `<job_dir>/chaos-gate/held`, and every
rank waits until the test writes `<job_dir>/chaos-gate/open`. A fault injected while a job is
held hits a run that is provably mid-way: without the gate the tiny job may finish in the moment
between "seen running" and "killed" on a loaded machine.

Waiting changes no arithmetic, so the final weights still equal those of a plain
`python -m twinkle_core.train` run. A resumed run never waits (its attempt is the recovery the
test wants to watch), and a stop request (SIGTERM / SIGUSR1) ends the wait so the worker's stop
sequence still works.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from twinkle_core import train

GATE_STEP = 3
GATE_DIR = "chaos-gate"
_plain_after_step = train.JobRunner.after_step


def _after_step(self: train.JobRunner, result: dict[str, Any]) -> int | None:
    outcome = _plain_after_step(self, result)
    if outcome is None and self.resume_from is None and self.model.cur_step == GATE_STEP:
        _hold(self)
    return outcome


def _hold(runner: train.JobRunner) -> None:
    gate = runner.job_dir / GATE_DIR
    gate.mkdir(exist_ok=True)
    if runner.model.info.is_main:
        marker = {"step": GATE_STEP, "pid": os.getpid(), "time": time.time()}
        tmp = gate / "held.tmp"
        tmp.write_text(json.dumps(marker))
        tmp.replace(gate / "held")  # the test never reads half a marker
    opened = gate / "open"
    while not opened.exists() and not (runner.stop.pause or runner.stop.terminate):
        time.sleep(0.05)


def gate_dir(job_dir: Path) -> Path:
    return job_dir / GATE_DIR


if __name__ == "__main__":
    train.JobRunner.after_step = _after_step  # type: ignore[method-assign]
    train.run()
