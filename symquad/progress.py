"""Progress of long work: a tqdm bar on a terminal, plain lines in a log file.

The one progress mechanism of symquad (simulators, ODE solves, validation,
finite-size scaling, the drift study, sweeps).  Each long loop asks
:func:`progress` for a reporter and calls ``update``; what the user sees
depends on where stderr goes:

* a terminal: a tqdm bar (redrawn in place);
* anything else (a log file of a batch job, a pipe): plain lines such as
  ``symquad: SGD (reduced, N=2000, 64 replicas): 40% (8000/20000 steps),
  12 s elapsed, ~18 s left`` -- one at every further 10 % (but not within
  :data:`MIN_LINE_GAP_S` of the previous one) and at least every
  :data:`LINE_INTERVAL_S` seconds while work advances, and a last line with
  the total time; work done within ``MIN_LINE_GAP_S`` prints nothing.  So a
  log shows that a long run is alive and how long it will take, without
  filling up with the lines of many short ones.

The ``progress`` argument of the public functions takes three values:
``False`` (nothing), ``True`` (a bar or lines, as above; what the command
line passes) and ``None`` where documented (a bar on a terminal, nothing
otherwise).  :func:`note` prints a stage line (``symquad: validate:
finite-size scaling, N = 100..10000``) under the same rule.
"""

from __future__ import annotations

import sys
import time

__all__ = ["progress", "note", "Progress", "LINE_INTERVAL_S", "LINE_FRACTION", "MIN_LINE_GAP_S",
           "format_seconds"]

#: Longest time between two progress lines in a log while work advances.
LINE_INTERVAL_S = 10.0
#: A line at every further fraction of the work done ...
LINE_FRACTION = 0.1
#: ... but never two lines closer than this (and nothing for shorter work).
MIN_LINE_GAP_S = 2.0


def format_seconds(seconds: float) -> str:
    """``"8.2 s"``, ``"3 min 05 s"``, ``"2 h 01 min"``."""
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _wants(enabled, stream) -> str | None:
    """``"bar"``, ``"lines"`` or None for a ``progress`` argument (module docstring)."""
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if enabled is None:
        return "bar" if tty else None
    if not enabled:
        return None
    return "bar" if tty else "lines"


class Progress:
    """Reporter of ``total`` units of work (see the module docstring).

    Parameters
    ----------
    total : float
        Units of work in all (steps, points, time units of an ODE solve).
    desc : str
        What is being done, e.g. ``"SGD (reduced, N=2000, 64 replicas)"``.
    unit : str
    style : {"bar", "lines"}
    stream : file, optional
        Default ``sys.stderr``.
    initial : float
        Units already done (a resumed sweep).
    integer : bool
        Show counts as integers (steps, points) rather than decimals (times).
    """

    def __init__(self, total, desc, unit="it", *, style="lines", stream=None, initial=0,
                 integer=True):
        self.total, self.desc, self.unit, self.style = float(total), desc, unit, style
        self.stream = sys.stderr if stream is None else stream
        self.n = self.initial = float(initial)
        self.integer = integer
        self.start = self._last_time = time.monotonic()
        self._printed = False
        self._next_fraction = LINE_FRACTION
        self._closed = False
        self._bar = None
        if style == "bar":
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                             unit_scale=integer, leave=False, file=self.stream)

    def _count(self, x) -> str:
        return f"{int(round(x))}" if self.integer else f"{x:.4g}"

    def line(self, final=False, interrupted=False) -> str:
        """The plain progress line for the current state (``final``: the last one)."""
        elapsed = time.monotonic() - self.start
        done = f"{self._count(self.n)}/{self._count(self.total)} {self.unit}"
        if final and interrupted:
            return f"symquad: {self.desc}: stopped, {done} in {format_seconds(elapsed)}"
        if final:
            return f"symquad: {self.desc}: done, {done} in {format_seconds(elapsed)}"
        frac = self.n / self.total if self.total > 0 else 1.0
        text = f"symquad: {self.desc}: {100 * frac:.0f}% ({done}), {format_seconds(elapsed)} elapsed"
        rate_done = self.n - self.initial
        if 0 < rate_done and self.n < self.total:
            left = elapsed * (self.total - self.n) / rate_done
            text += f", ~{format_seconds(left)} left"
        return text

    def _emit(self, text):
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):      # a closed or broken log: progress is optional
            pass

    def update(self, n=1) -> None:
        """``n`` more units done."""
        self.set(self.n + n)

    def set(self, value) -> None:
        """The work done so far is ``value`` units (for solvers that report a time)."""
        value = min(float(value), self.total) if self.total > 0 else float(value)
        if value <= self.n:
            return
        if self._bar is not None:
            self._bar.update(value - self.n)
            self.n = value
            return
        self.n = value
        now = time.monotonic()
        frac = self.n / self.total if self.total > 0 else 1.0
        since = now - self._last_time
        if (frac >= self._next_fraction and since >= MIN_LINE_GAP_S) \
                or since >= LINE_INTERVAL_S:
            while self._next_fraction <= frac:
                self._next_fraction += LINE_FRACTION
            self._last_time = now
            if self.n < self.total:
                self._printed = True
                self._emit(self.line())

    def write(self, text: str) -> None:
        """A stage line beside the bar (``tqdm.write``) or among the lines."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self._emit(text)

    def close(self, interrupted: bool = False) -> None:
        """Finish: the bar disappears; in a log, a last line with the total time.

        ``interrupted``: the work was stopped before its end (an exception,
        Ctrl-C, SIGTERM); the last line says ``stopped``, not ``done``.
        """
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            if interrupted:
                self._emit(self.line(final=True, interrupted=True))
        elif self._printed or interrupted or time.monotonic() - self.start >= MIN_LINE_GAP_S:
            self._emit(self.line(final=True, interrupted=interrupted))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(interrupted=exc_type is not None)
        return False


class _Silent:
    """The reporter when progress is off: every call does nothing."""

    n = 0.0

    def update(self, n=1):
        pass

    def set(self, value):
        pass

    def write(self, text):
        pass

    def close(self, interrupted=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress(enabled, total, desc, unit="it", *, initial=0, integer=True, stream=None):
    """A reporter for ``total`` units of work: a :class:`Progress`, or a silent stand-in.

    ``enabled`` is a function's ``progress`` argument (module docstring).
    """
    stream = sys.stderr if stream is None else stream
    style = _wants(enabled, stream)
    if style is None:
        return _Silent()
    return Progress(total, desc, unit, style=style, stream=stream, initial=initial,
                    integer=integer)


def note(enabled, text: str, stream=None) -> None:
    """Print the stage line ``symquad: TEXT`` when progress is shown (module docstring)."""
    stream = sys.stderr if stream is None else stream
    style = _wants(enabled, stream)
    if style is None:
        return
    try:
        if style == "bar":
            from tqdm import tqdm
            tqdm.write(f"symquad: {text}", file=stream)      # does not break a bar
        else:
            stream.write(f"symquad: {text}\n")
            stream.flush()
    except (OSError, ValueError):
        pass
