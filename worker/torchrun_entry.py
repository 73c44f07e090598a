"""`twinkle-torchrun`: torchrun itself, ending a stop by signal with one line instead of a traceback.

The worker ends an attempt by signalling torchrun (a cancel, the job's timeout, the worker being
stopped; Slurm's `scancel` signals it too). torchrun's agent then stops the ranks, which save a
checkpoint when they can, and re-raises the signal as a `SignalException` that nothing catches:
torchrun ends with a 30-line traceback, the last thing in the job's log and in its error's
`log_tail`, the first things a user reads after a cancel. This entry point runs torchrun's own
`main` with the same arguments, says in one line which signal stopped it, and then dies of that
signal, so the supervisor reads the exit as it reads a torchrun killed by a signal (see
worker.outcome). Every other ending, a rank's failure summary included, is torchrun's own.
"""

from __future__ import annotations

import os
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

# Signals whose default action ends the process without a core dump: re-raised as they came.
_REDELIVERED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def main() -> None:
    try:
        torchrun_main()
    except SignalException as stop:
        sig = signal.Signals(stop.sigval)
        message = f"torchrun stopped by {sig.name}: its ranks were sent {sig.name} too"
        print(message, file=sys.stderr, flush=True)
        if sig in _REDELIVERED:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        sys.exit(128 + sig)


if __name__ == "__main__":
    main()
