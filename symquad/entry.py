"""How symquad's entry points end: an exit status and one line on stderr, never a traceback.

Every documented entry point (the ``symquad`` commands, ``python -m
symquad``, the scripts in ``examples/``) runs through :func:`run_main`:

* its exceptions become one line ``PROG: KIND: message`` on stderr and an exit
  status (:func:`exit_status`): ``2`` bad input (``ValueError``,
  ``TypeError``, ``OSError``, ``MemoryError``), ``3`` a diverged run
  (:class:`~symquad.DivergenceError`), ``5`` anything else (a bug: set
  ``SYMQUAD_TRACEBACK=1`` to see the traceback and please report it), ``130``
  an interrupt (Ctrl-C); ``sys.exit``/argparse exits keep their status;
* warnings are printed as one line ``PROG: warning: message`` (not Python's
  two-line ``file:line: Category: message`` + source line);
* output piped into a program that stops reading (``symquad equations | head``)
  ends quietly.

Worker processes (Dask's local cluster, validate's process pool) ignore
SIGINT (:func:`children_ignore_sigint`, :func:`ignore_sigint`), so a Ctrl-C
stops only the driving process, which then stops them in order; and clusters and clients are closed
by :func:`quiet_close`, with distributed's shutdown chatter (``Stream is
closed``, ``CommClosedError``, connection retries at close) muted and its
errors at close suppressed, since they report only the shutdown itself.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import numbers
import os
import signal
import sys
import threading
import traceback
import warnings
from .numeric.errors import DivergenceError
from ._signals import Terminated, terminate_cleanly

__all__ = ["run_main", "ArgumentParser", "exit_status", "quiet_close", "ignore_sigint", "children_ignore_sigint",
           "one_line_warnings", "EXIT_BAD_INPUT", "EXIT_DIVERGED", "EXIT_INTERNAL",
           "EXIT_INTERRUPTED"]

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_INTERNAL = 5
EXIT_INTERRUPTED = 130

class ArgumentParser(argparse.ArgumentParser):
    """The command-line parser of every entry point: no abbreviations, one-line errors.

    * ``allow_abbrev`` is always False: argparse would otherwise read a prefix
      of a flag as that flag, so ``symquad equations --lr 0.1`` (a command
      without ``--lr``) silently set ``--lr-readout``; now an unknown or
      shortened flag is an error.  Sub-command parsers made with
      ``add_subparsers().add_parser`` are of this class too (argparse's
      default ``parser_class`` is the parent's class).
    * :meth:`error` prints one line, ``PROG: error: message (see PROG
      --help)``, and exits with status 2, like every other refusal of bad
      input (:func:`run_main`), instead of argparse's multi-line usage text.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False          # never: see the class docstring
        super().__init__(*args, **kwargs)

    def error(self, message):
        text = " ".join(str(message).split())
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def exit_status(exc: BaseException) -> tuple[int, str]:
    """``(exit status, kind)`` of an exception that ends an entry point (see module docstring)."""

    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, DivergenceError):
        return EXIT_DIVERGED, "diverged"
    if isinstance(exc, MemoryError):
        return EXIT_BAD_INPUT, "error: out of memory"
    if isinstance(exc, (ValueError, TypeError, OSError)):
        return EXIT_BAD_INPUT, "error"
    return EXIT_INTERNAL, "internal error"


def _message(exc: BaseException, kind: str) -> str:
    text = str(exc).strip() or type(exc).__name__
    if kind == "interrupted":
        return ""
    if kind == "internal error":
        text = (f"{type(exc).__name__}: {text} (a bug in symquad or a task; set "
                f"SYMQUAD_TRACEBACK=1 for the traceback and please report it)")
    return text


@contextlib.contextmanager
def one_line_warnings(prog: str):
    """Inside the block, warnings print as ``PROG: warning: message`` (one line)."""
    def show(message, category, filename, lineno, file=None, line=None):
        stream = sys.stderr if file is None else file
        with contextlib.suppress(OSError, ValueError):
            text = " ".join(str(message).split())
            stream.write(f"{prog}: warning: {text}\n")
    saved = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the exit flush cannot fail."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def run_main(func, *args, prog: str | None = None, **kwargs) -> int:
    """Run ``func(*args, **kwargs)`` as an entry point; return its exit status.

    ``func`` returns an exit status (``None``, or any result that is not an
    integer, counts as 0).  Whatever it
    raises ends as one line on stderr and a status (module docstring); a
    ``SystemExit`` (``sys.exit``, argparse) keeps its own.  Use it as
    ``raise SystemExit(sq.run_main(main, prog="my_script.py"))``.

    Parameters
    ----------
    func : callable
    prog : str, optional
        Name in the messages (default: the script's file name).
    """

    prog = prog or os.path.basename(sys.argv[0] or "symquad")
    with one_line_warnings(prog):
        try:
            with terminate_cleanly():
                status = func(*args, **kwargs)
            sys.stdout.flush()                 # a broken pipe shows here, not at exit
            # a script's main may return its results (a solution, a dict): that is success
            return int(status) if isinstance(status, numbers.Integral) else 0
        except Terminated as exc:
            # raised by SIGTERM: the finally blocks on the way here stopped the worker
            # processes and removed the temporary files
            with contextlib.suppress(OSError, ValueError):
                print(f"{prog}: {exc}; worker processes stopped, temporary files removed",
                      file=sys.stderr)
            return exc.code
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                return int(exc.code or 0)
            print(f"{prog}: {exc.code}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            _silence_stdout()
            return 0
        except BaseException as exc:       # noqa: BLE001 - the one place every error ends
            status, kind = exit_status(exc)
            message = _message(exc, kind)
            with contextlib.suppress(OSError, ValueError):
                if os.environ.get("SYMQUAD_TRACEBACK"):
                    traceback.print_exc()
                print(f"{prog}: {kind}" + (f": {message}" if message else ""), file=sys.stderr)
            _release_frames(exc)
            return status


def _release_frames(exc: BaseException) -> None:
    """Free what the failed call's frames held, now, with warnings off.

    An interrupted call can leave objects in its frames whose finalisation
    warns (distributed's never-awaited coroutines): released at interpreter
    exit they would print after the one-line error.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(Exception):
            traceback.clear_frames(exc.__traceback__)
            gc.collect()


@contextlib.contextmanager
def muted_shutdown_logs():
    """Inside the block no log record is emitted (distributed's loggers set their own levels,
    so muting a parent logger is not enough); the previous state is restored after."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def quiet_close(*resources) -> None:
    """Close Dask clients and clusters in the given order, without shutdown noise.

    Each ``close()`` runs with distributed's loggers muted; an exception
    raised by a close (a peer already gone: ``CommClosedError``, ``Stream is
    closed``, a timeout) is dropped, since what it reports is the shutdown
    itself.  ``None`` entries are skipped.
    """
    with muted_shutdown_logs():
        for res in resources:
            if res is None:
                continue
            with contextlib.suppress(Exception):
                res.close()


def ignore_sigint() -> None:
    """Make this (worker) process ignore SIGINT: Ctrl-C is for the driving process.

    A terminal sends SIGINT to the whole foreground process group; a worker
    process that also received it would die printing a traceback, while the
    driving process stops its workers itself when it is interrupted.  Used as
    the initializer of validate's process pool and, through
    :mod:`symquad._dask_preload`, by the workers of the local Dask clusters
    symquad starts.  The driving process itself keeps its handler, so no
    Ctrl-C is ever lost.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def children_ignore_sigint():
    """Processes started inside the block ignore SIGINT from their first instruction on.

    SIGINT is ignored in this process during the block: an ignored signal
    stays ignored across ``exec``, and Python installs its
    ``KeyboardInterrupt`` handler only where SIGINT has its default action,
    so a spawned worker never raises ``KeyboardInterrupt`` (a signal mask is
    not inherited by multiprocessing's spawned children, a handler is reset).
    The price: a Ctrl-C during the block itself (the start of a local
    cluster, about a second) is ignored.  Outside the main thread nothing
    changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)
