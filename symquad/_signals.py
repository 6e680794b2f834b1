"""SIGTERM as an exception, so that a batch scheduler's stop cleans up like Ctrl-C does.

Batch schedulers (SLURM, PBS, Kubernetes, ``timeout``) stop a job with
SIGTERM and, after a grace period, SIGKILL.  Python's default for SIGTERM is to
die at once: no ``finally`` block runs, so worker pools keep computing as
orphans and temporary files stay.  Inside :func:`terminate_cleanly`, SIGTERM
instead raises :class:`Terminated` (a :class:`SystemExit` with status
``128 + 15 = 143``, the status of a process killed by SIGTERM) in the main
thread: the ``finally`` blocks and context managers on the way out stop the
worker processes (local Dask cluster, ``validate --workers``, the child of a
point with a timeout), cancel running futures and remove temporary files and
folders.  Because it is not an :class:`Exception`, no task's ``except
Exception`` swallows it.

Only the main thread can install signal handlers; elsewhere, or when the
program has installed its own SIGTERM handler, :func:`terminate_cleanly` leaves
everything as it is.  A second SIGTERM during the clean-up gets the default
action (immediate exit), so "stop now" still works.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["Terminated", "terminate_cleanly"]


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM inside :func:`terminate_cleanly` (status 143)."""

    def __init__(self, signum=signal.SIGTERM):
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    def __str__(self):
        return f"terminated by {signal.Signals(self.signum).name}"


def _raise_terminated(signum, frame):
    # a second SIGTERM while cleaning up kills at once
    signal.signal(signum, signal.SIG_DFL)
    raise Terminated(signum)


@contextmanager
def terminate_cleanly():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        previous = None
    if previous is not signal.SIG_DFL:
        yield        # ours already (nested call), the program's own handler, or unknown
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
