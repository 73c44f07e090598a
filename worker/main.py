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
import socket
import sys
import threading
import time
from collections.abc import Callable

from celery import Celery
from celery.signals import beat_embedded_init, worker_shutting_down

from jobcore.db.migrate import wait_for_schema
from jobcore.settings import Settings, get_settings
from worker.agent import WorkerAgent, set_current_agent
from worker.celery_app import make_celery, quiet_routine_task_logs

# Threads that run wake-up tasks; each returns within a second, so a few are plenty.
TASK_THREADS = 2
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Pause before starting a Celery consumer again after it died on its own; doubled per crash in a
# row, up to the maximum, and back to the minimum once one has run for CONSUMER_STEADY_SECONDS.
CONSUMER_RESTART_MIN_SECONDS = 1.0
CONSUMER_RESTART_MAX_SECONDS = 30.0
CONSUMER_STEADY_SECONDS = 60.0

log = logging.getLogger(__name__)
_worker_pid: int | None = None  # the process that runs `run_worker`
# Set by Celery's own SIGTERM/SIGINT/SIGQUIT handlers: the consumer is ending because it was asked to.
_shutdown_requested = threading.Event()


@worker_shutting_down.connect
def _note_shutdown_request(**_: object) -> None:
    _shutdown_requested.set()


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


def run_worker(
    settings: Settings, concurrency: int | None = None, beat: bool = False, banner: bool = True
) -> None:
    """Block running a worker. `concurrency` is the number of jobs a GPU-less worker runs at once
    (default `settings.worker_slots`); a GPU worker runs as many as its GPUs allow. `beat` embeds
    the Celery beat that schedules the reconciler (run it in one process per deployment).
    `banner`: print Celery's start-up banner (its broker, queues and tasks)."""
    global _worker_pid
    _worker_pid = os.getpid()
    _shutdown_requested.clear()  # a request belongs to one run, not to the module
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_routine_task_logs()
    # Started before the server migrated a fresh database (any order is fine): wait for the schema.
    if not wait_for_schema(settings.resolved_database_url, _shutdown_requested.is_set):
        return
    app = make_celery(settings)
    app.set_default()
    agent = WorkerAgent(settings, slots=concurrency)
    set_current_agent(agent)
    agent.start()
    try:
        keep_consuming(lambda: _consume(app, agent.worker_id, beat, banner), _shutdown_requested.is_set)
    finally:
        agent.stop()
        set_current_agent(None)


def _consume(app: Celery, worker_id: str, beat: bool, banner: bool = True) -> int:
    """Run a Celery consumer until it ends; its exit code (0: a clean shutdown, 1: it crashed).

    Built as `celery worker` builds it, but called directly: the command line drops the code."""
    consumer = app.Worker(
        hostname=f"{worker_id}@{socket.gethostname()}",
        pool_cls="threads",
        concurrency=TASK_THREADS,
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
        beat=beat,
        quiet=not banner,
    )
    consumer.start()
    return int(consumer.exitcode or 0)


def keep_consuming(consume: Callable[[], int], shutdown_requested: Callable[[], bool]) -> None:
    """Run the consumer again whenever it dies without being asked to stop.

    The consumer only carries wake-ups; the jobs this worker runs live in the agent's threads and
    do not depend on it. A consumer that hits an "Unrecoverable error" (one seen: kombu's Redis
    transport raising AttributeError while it closes the connection Redis just dropped) would
    otherwise end the process and hand every running job back to the queue: a retry for nothing,
    from a broker blip. Returns when the consumer ended because it was asked to (a signal, or a
    clean exit such as a remote shutdown command).
    """
    pause = CONSUMER_RESTART_MIN_SECONDS
    while not shutdown_requested():  # a SIGTERM while waiting to restart ends the loop here
        began = time.monotonic()
        code = consume()
        if shutdown_requested() or code == 0:
            return
        if time.monotonic() - began >= CONSUMER_STEADY_SECONDS:
            pause = CONSUMER_RESTART_MIN_SECONDS
        log.error(
            "the Celery consumer died (exit code %d) without a shutdown request; starting it again "
            "in %.0f s (running jobs are not affected; the agent polls the queue meanwhile)",
            code,
            pause,
        )
        time.sleep(pause)
        pause = min(pause * 2, CONSUMER_RESTART_MAX_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a Twinkle Jobs worker")
    parser.add_argument("--concurrency", type=int, default=None, help="jobs at once on a CPU worker")
    parser.add_argument("--beat", action="store_true", help="also run the reconciler schedule")
    args = parser.parse_args()
    run_worker(get_settings(), concurrency=args.concurrency, beat=args.beat)


if __name__ == "__main__":
    main()
