"""The outcome of one sweep point run in this process (no timeout).

:func:`symquad.studies.sweep.run_point` uses it for untimed points and the
point's child process (:mod:`symquad.studies.point_runner`) for timed ones;
it sits below both so that neither imports the other's module.
"""

from __future__ import annotations

import time
import traceback as _traceback
from numbers import Real

import numpy as np

from .._signals import Terminated
from .store import INT64_RANGE, META_COLUMNS

def _split_result(result, params):
    """Scalars and arrays of a task's result; TypeError if it is not a flat dict."""
    if not isinstance(result, dict):
        raise TypeError(f"a task must return a dict, got {type(result).__name__}")
    scalars, arrays = {}, {}
    for k, v in result.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise TypeError(f"result names must be identifiers, got {k!r}")
        if k in META_COLUMNS or k in params:
            raise TypeError(f"result name {k!r} is reserved (a parameter or one of "
                            f"{META_COLUMNS})")
        if isinstance(v, np.ndarray) and v.ndim > 0:
            if v.dtype.hasobject:
                raise TypeError(f"result {k!r} is an array of Python objects (dtype {v.dtype}), "
                                f"which the store cannot read back without unpickling; return "
                                f"a numeric array")
            arrays[k] = v
        else:
            scalars[k] = _storable_scalar(k, v.item() if isinstance(v, (np.generic, np.ndarray))
                                          else v)
    return scalars, arrays


def _failure_message(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit: the task called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _storable_scalar(k, v):
    """`v` if a store's Parquet row holds it exactly; TypeError/ValueError naming `k` otherwise."""
    if v is None or isinstance(v, (bool, float)):
        return v
    if isinstance(v, int):
        if not INT64_RANGE[0] <= v <= INT64_RANGE[1]:
            raise ValueError(f"result {k!r} = {v:.4g} is an integer beyond int64, which the store "
                             f"cannot hold; return it as a float or a string")
        return v
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"result {k!r} is not valid text (unpaired surrogate); the store "
                             f"cannot hold it") from None
        return v
    if isinstance(v, Real) and not isinstance(v, np.generic):
        return float(v)       # e.g. fractions.Fraction: stored as the nearest float
    raise TypeError(f"result {k!r} must be a scalar (int, float, str, bool, None) or "
                    f"a numpy array, got {type(v).__name__}")


def run_untimed(func, params):
    """``func(**params)`` as ``(scalars, arrays, status, error, traceback, seconds)``.

    The body of :func:`symquad.studies.sweep.run_point` without a timeout: task
    exceptions (and ``SystemExit``) become ``status="error"``; ``Terminated``
    (SIGTERM) and ``KeyboardInterrupt`` propagate.
    """
    t0 = time.perf_counter()
    try:
        scalars, arrays = _split_result(func(**params), params)
        status, error, tb = "ok", None, None
    except Terminated:
        # SIGTERM stops the sweep like Ctrl-C: the point in flight is not an outcome
        # (never stored as an error row), so a rerun computes it
        raise
    except (Exception, SystemExit) as exc:     # one bad point never kills the sweep
        scalars, arrays = {}, {}
        status, error = "error", _failure_message(exc)
        tb = _traceback.format_exc(limit=-8)
    return scalars, arrays, status, error, tb, time.perf_counter() - t0
