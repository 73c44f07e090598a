"""Run a worker: a Celery consumer (thread pool) plus the agent that supervises jobs.

`python -m worker.main [--concurrency N] [--beat]`; the CLI's `twinkle-jobs worker` calls
`run_worker`.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys

from celery.signals import beat_embedded_init

from server.settings import Settings, get_settings
from worker.agent import WorkerAgent, set_current_agent
from worker.celery_app import make_celery

# Threads that run wake-up tasks; each returns within a second, so a few are plenty.
TASK_THREADS = 2
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

_worker_pid: int | None = None  # the process that runs `run_worker`


@beat_embedded_init.connect
def _die_with_the_worker(**_: object) -> None:
    """Runs in the embedded beat, which Celery starts as a child process of the worker. A worker
    killed with -9 cannot stop it, and an orphaned beat would go on scheduling reconciles for a
    worker that is gone; on Linux the kernel SIGKILLs it when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        logging.getLogger(__name__).warning("beat: prctl(PR_SET_PDEATHSIG) failed: %s", ctypes.get_errno())
    if _worker_pid is not None and os.getppid() != _worker_pid:  # the worker died before prctl
        os._exit(1)


def run_worker(settings: Settings, concurrency: int | None = None, beat: bool = False) -> None:
    """Block running a worker. `concurrency` is the number of jobs a GPU-less worker runs at once
    (default `settings.worker_slots`); a GPU worker runs as many as its GPUs allow. `beat` embeds
    the Celery beat that schedules the reconciler (run it in one process per deployment)."""
    global _worker_pid
    _worker_pid = os.getpid()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_celery(settings)
    app.set_default()
    agent = WorkerAgent(settings, slots=concurrency)
    set_current_agent(agent)
    agent.start()
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={TASK_THREADS}",
        "--loglevel=INFO",
        f"--hostname={agent.worker_id}@%h",
        "--without-gossip",
        "--without-mingle",
    ]
    if beat:
        argv.append("--beat")
    try:
        app.worker_main(argv)
    finally:
        agent.stop()
        set_current_agent(None)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a Twinkle Jobs worker")
    parser.add_argument("--concurrency", type=int, default=None, help="jobs at once on a CPU worker")
    parser.add_argument("--beat", action="store_true", help="also run the reconciler schedule")
    args = parser.parse_args()
    run_worker(get_settings(), concurrency=args.concurrency, beat=args.beat)


if __name__ == "__main__":
    main()
