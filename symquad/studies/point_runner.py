r"""A sweep point with a deadline: run it in a child process that can be stopped.

A thread cannot be stopped, and a signal cannot interrupt compiled code, so
the only robust bound on the time of an arbitrary task is to run it in another
process and kill that process when the time is up.  :class:`PointProcess`
keeps one child interpreter per calling thread (started on first use, reused
point after point, so the interpreter start and the imports are paid once, not
per point):

* the point -- the task and its parameters, pickled with cloudpickle (which
  also carries functions defined in a script's ``__main__``) -- goes down the
  child's stdin, and its outcome (that of :func:`symquad.studies.sweep.run_point`,
  computed in the child) comes back on the child's stdout as one pickle;
  whatever the task prints goes to stderr, and its stdin is ``/dev/null``;
* the deadline counts from the moment the child has unpickled the point
  (so importing the task's module on first use is not charged to it);
* on timeout the child's whole process group is killed (SIGKILL: the task's
  own subprocesses die too) and the point gets an error outcome
  ``"TimeoutError: ..."``; the next point starts a fresh child;
* a child that dies (out of memory, a segfault, the task calling
  ``os._exit``) gives an error outcome naming its exit status; one stopped by
  SIGTERM, SIGINT or SIGHUP (a job being stopped) gives none: the point was
  interrupted, not failed (:func:`_stopped`);
* the child exits by itself when its parent disappears (it watches its parent
  process id), so a killed driver or Dask worker leaves no orphan computing.

The same class serves the serial executor (in the driver) and the Dask
executor (in each worker process, one child per worker thread), so
``timeout=`` means the same everywhere.  POSIX only (pipes are polled with
:func:`select.select`).
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref

from .._signals import Terminated
from .point_outcome import run_untimed

__all__ = ["PointProcess", "run_with_timeout", "close_thread_runner"]

_FRAME = struct.Struct("!Q")
#: Longest wait for a child to start and unpickle a point (imports included).
STARTUP_TIMEOUT = 120.0
# the parent's sys.path travels as argv[1] (stdin stays unread until _child_main)
_CHILD_CODE = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
               "from symquad.studies.point_runner import _child_main; _child_main()")


class _Deadline(Exception):
    pass


def _read_exact(fd, n, deadline):
    """`n` bytes from `fd` before `deadline` (time.monotonic); EOFError if it closes."""
    chunks, left = [], n
    while left:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise _Deadline
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            raise _Deadline
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd, deadline):
    (size,) = _FRAME.unpack(_read_exact(fd, _FRAME.size, deadline))
    return _read_exact(fd, size, deadline)


def _write_frame(fh, data: bytes):
    fh.write(_FRAME.pack(len(data)) + data)
    fh.flush()


def _error(message, seconds=0.0):
    return {}, {}, "error", message, None, float(seconds)


class PointProcess:
    """One reusable child interpreter that runs points with a deadline (module docstring)."""

    def __init__(self):
        self.proc = None
        self._finalizer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- lifecycle --------------------------------------------------------------
    def _start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_CODE, json.dumps(list(sys.path))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            close_fds=True)
        # kill the child if this object is dropped without close() (e.g. a dying thread)
        self._finalizer = weakref.finalize(self, _kill, self.proc)

    def close(self):
        """Stop the child: EOF on its stdin (it exits), then kill after a grace period."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        self._finalizer.detach()
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        _kill(proc)

    def kill(self):
        """Kill the child and everything it started, at once."""
        proc, self.proc = self.proc, None
        if proc is not None:
            self._finalizer.detach()
            _kill(proc)

    # -- one point ------------------------------------------------------------
    def run(self, func, params, timeout):
        """Outcome of ``run_point(func, params)`` computed in the child within `timeout` s."""
        import cloudpickle

        t0 = time.perf_counter()
        try:
            payload = cloudpickle.dumps((func, params))
        except Exception as exc:      # e.g. a lambda closing over a lock
            return _error(f"TypeError: the task cannot be sent to a separate process for "
                          f"timeout= ({type(exc).__name__}: {exc})")
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        proc = self.proc
        try:
            _write_frame(proc.stdin, payload)
            fd = proc.stdout.fileno()
            if _read_frame(fd, time.monotonic() + STARTUP_TIMEOUT) != b"started":
                raise EOFError
            outcome = pickle.loads(_read_frame(fd, time.monotonic() + timeout))
        except _Deadline:
            self.kill()
            waited = time.perf_counter() - t0
            return _error(f"TimeoutError: the point did not finish within timeout={timeout:g} s "
                          f"(its process was stopped after {waited:.1f} s)", waited)
        except (EOFError, OSError, pickle.UnpicklingError):
            self.kill()
            code = proc.wait()
            if -code in _STOP_SIGNALS:
                return _stopped(-code, time.perf_counter() - t0)
            how = f"exited with status {code}"
            if code < 0:
                try:
                    how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
                except ValueError:
                    how = f"was killed by signal {-code}"
            hint = " -- out of memory?" if code == -signal.SIGKILL else ""
            return _error(f"ChildProcessError: the point's process {how}{hint}",
                          time.perf_counter() - t0)
        return outcome


#: Signals that stop a job (a batch scheduler, a terminal): a point's process killed by
#: one of them was interrupted, it did not fail, so the point gets no error row.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stopped(signum, seconds):
    """The point's process was stopped by `signum` (a job being stopped, not a failure).

    In the main thread (the serial executor) the sweep stops as if the signal
    had reached the driver: :class:`symquad._signals.Terminated` (SIGTERM,
    SIGHUP) or ``KeyboardInterrupt`` (SIGINT).  Elsewhere (a Dask worker
    thread) the outcome has ``status="interrupted"``: the sweep reports the
    point as lost, never stores it, and a rerun computes it.
    """
    if threading.current_thread() is threading.main_thread():
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)
    return ({}, {}, "interrupted", f"Interrupted: the point's process was stopped by "
            f"{signal.Signals(signum).name} (not stored; rerun to compute it)", None,
            float(seconds))


def _kill(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # the child leads its own session
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


_local = threading.local()


def run_with_timeout(func, params, timeout):
    """Run one point in this thread's :class:`PointProcess` (created on first use)."""
    runner = getattr(_local, "runner", None)
    if runner is None:
        runner = _local.runner = PointProcess()
    return runner.run(func, params, timeout)


def close_thread_runner():
    """Stop this thread's child process, if it has one."""
    runner = getattr(_local, "runner", None)
    if runner is not None:
        _local.runner = None
        runner.close()


# ---------------------------------------------------------------------------
# the child
# ---------------------------------------------------------------------------
def _watch_parent(parent):
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(70)             # orphaned: the driver or worker is gone


def _child_main():
    """Loop of the child: read a point, say "started", run it, send the outcome back."""
    import cloudpickle

    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)                 # the task cannot read the protocol
    os.dup2(2, 1)                    # nor write into it: its prints go to stderr
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the parent decides when to stop us
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    while True:
        try:
            head = inp.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return
            data = inp.read(_FRAME.unpack(head)[0])
        except OSError:
            return
        try:
            func, params = cloudpickle.loads(data)
        except Exception as exc:
            _write_frame(out, b"started")
            _write_frame(out, pickle.dumps(_error(
                f"ImportError: the task could not be loaded in the point's process "
                f"({type(exc).__name__}: {exc})")))
            continue
        _write_frame(out, b"started")
        outcome = run_untimed(func, params)
        try:
            blob = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            blob = pickle.dumps(_error(f"TypeError: the result cannot be sent back "
                                       f"({type(exc).__name__}: {exc})", outcome[5]))
        _write_frame(out, blob)
