r"""Parameter sweeps of a task over a grid, serially or on Dask, into a resumable store.

:func:`sweep` expands a grid (``dict`` name -> list of values, Cartesian
product) into points, skips those already in the store, runs the others and
writes each one to the store (:mod:`symquad.studies.store`) the moment it
finishes, then returns the table of the grid's points as a
:class:`pandas.DataFrame`.

Executors
---------
* ``workers=1``: in this process, one point after the other (debugging, tests).
* default: a local Dask cluster (:class:`distributed.LocalCluster`) with one
  single-threaded worker *process* per core (``workers=N``: N of them), shut
  down at the end.  Worker processes run with ``OMP_NUM_THREADS=1`` (Dask's
  default), so numpy does not oversubscribe the cores.
* ``client=``: any :class:`distributed.Client` — a ``dask scheduler`` on
  another machine, or a dask-jobqueue / dask-kubernetes cluster.

Failures
--------
An exception raised by the task at one point gives that point
``status="error"`` and the message (``error``) and traceback (``traceback``);
the sweep goes on.  Such rows are stored, so a rerun skips them unless
``retry_errors=True``.  A worker process that dies (killed, out of memory)
has its points rescheduled by Dask on the other workers (up to
``distributed.scheduler.allowed-failures`` times, default 3); a point that
still fails for a reason outside the task (``KilledWorker``, cancelled) is
reported with ``status="error"`` in the returned table but *not* stored, so a
rerun retries it.  ``retries`` (default 2) lets Dask rerun a point whose
execution failed outside the task body.

Parameter names are checked against the task's signature before anything
runs (``TypeError``); parameter *values* are checked by the task itself, so a
point with an invalid value becomes an error row within milliseconds instead
of stopping the whole sweep.

Reproducibility
---------------
A point's numbers depend only on its parameters (seeds are parameters), so
they are identical whichever executor ran the point.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import traceback as _traceback
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from ..entry import quiet_close
from .store import META_COLUMNS, SweepStore, canonical_params, new_token, point_key
from .tasks import get_task

__all__ = ["sweep", "expand_grid", "run_point", "SweepInfo", "dask_client"]


@dataclass(frozen=True)
class SweepInfo:
    """What a call of :func:`sweep` did (``df.attrs["sweep"]``)."""

    task: str
    version: str
    points: int
    skipped: int
    computed: int
    ok: int
    errors: int
    lost: int
    seconds: float
    executor: str
    store: str

    def line(self) -> str:
        """One-line summary."""
        lost = f", {self.lost} lost (not stored, rerun to retry)" if self.lost else ""
        return (f"sweep {self.task} v{self.version}: {self.points} points, {self.skipped} "
                f"already in the store, {self.computed} computed ({self.ok} ok, "
                f"{self.errors} error){lost} in {self.seconds:.1f} s on {self.executor}; "
                f"store {self.store}")

    def __str__(self):
        return self.line()


# ---------------------------------------------------------------------------
# grid
# ---------------------------------------------------------------------------
def expand_grid(grid, max_points=1_000_000) -> list:
    """Cartesian product of ``{name: [values]}`` as a list of dicts (insertion order).

    A scalar value counts as a one-element list (a list, tuple, range or 1-d
    array lists the values).  Values must be int, float, str, bool or None.
    The number of points is checked against `max_points` before the product
    is built (``ValueError`` beyond it).
    """
    if not isinstance(grid, dict):
        raise TypeError(f"grid must be a dict of parameter name -> list of values, "
                        f"got {type(grid).__name__}")
    names, values = [], []
    for name, vals in grid.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"grid parameter names must be identifiers, got {name!r}")
        if isinstance(vals, (list, tuple, np.ndarray, range)):
            vals = list(vals.tolist() if isinstance(vals, np.ndarray) else vals)
        else:
            vals = [vals]
        if not vals:
            raise ValueError(f"grid[{name!r}] is empty")
        for v in vals:
            canonical_params({name: v})        # type check (TypeError/ValueError)
        names.append(name)
        values.append(vals)
    size = math.prod(len(v) for v in values)
    if size > max_points:
        raise ValueError(f"the grid has {size} points ({' x '.join(str(len(v)) for v in values)}"
                         f"), more than max_points={max_points}; split the sweep or raise "
                         f"max_points")
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


# ---------------------------------------------------------------------------
# one point (runs on a worker)
# ---------------------------------------------------------------------------
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
            arrays[k] = v
        elif isinstance(v, (np.generic, np.ndarray)):
            scalars[k] = v.item()
        elif v is None or isinstance(v, (bool, int, float, str)):
            scalars[k] = v
        else:
            raise TypeError(f"result {k!r} must be a scalar (int, float, str, bool, None) or "
                            f"a numpy array, got {type(v).__name__}")
    return scalars, arrays


def _failure_message(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit: the task called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def run_point(func, params):
    """Run ``func(**params)``; return ``(scalars, arrays, status, error, traceback, seconds)``.

    Exceptions raised by the task become ``status="error"`` with the message
    ``"ExceptionType: message"``; they are not re-raised.  ``sys.exit`` in a
    task (``SystemExit``) is such an error too, never the exit of the process
    or the worker; only ``KeyboardInterrupt`` stops the sweep.
    """
    t0 = time.perf_counter()
    try:
        scalars, arrays = _split_result(func(**params), params)
        status, error, tb = "ok", None, None
    except (Exception, SystemExit) as exc:     # one bad point never kills the sweep
        scalars, arrays = {}, {}
        status, error = "error", _failure_message(exc)
        tb = _traceback.format_exc(limit=-8)
    return scalars, arrays, status, error, tb, time.perf_counter() - t0


def _row(task, key, params, outcome):
    scalars, _, status, error, tb, seconds = outcome
    row = dict(canonical_params(params))
    row.update(scalars)
    row.update(status=status, error=error, seconds=float(seconds),
               finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               key=key, task=task.name, task_version=task.version, traceback=tb)
    return row


# ---------------------------------------------------------------------------
# executors
# ---------------------------------------------------------------------------
def _progress_bar(progress, total, initial, desc):
    from ..progress import progress as _progress
    return _progress(progress, total, desc, "points", initial=initial)


def _run_serial(task, todo, on_done):
    for key, params in todo:
        on_done(key, params, run_point(task.func, params))


def _run_dask(task, todo, on_done, client, retries):
    from distributed import as_completed

    token = new_token()
    futures = {}
    for key, params in todo:
        fut = client.submit(run_point, task.func, params, key=f"{task.name}-{key[:12]}-{token}",
                            pure=False, retries=retries)
        futures[fut] = (key, params)
    try:
        for fut in as_completed(list(futures)):
            key, params = futures.pop(fut)
            try:
                outcome = fut.result()
            except Exception as exc:    # outside the task: KilledWorker, cancelled, ...
                on_done(key, params, None, f"{type(exc).__name__}: {exc}")
            else:
                on_done(key, params, outcome)
            fut.release()
    finally:
        if futures:          # interrupted: do not leave our points running on the cluster
            client.cancel(list(futures))


@contextlib.contextmanager
def dask_client(address=None, *, workers=None, timeout="20s"):
    """A Dask client for several sweeps, closed without shutdown noise.

    ``address`` given: connect to that scheduler (``timeout`` for the
    connection).  Otherwise start a local cluster like :func:`sweep`'s own:
    `workers` single-threaded worker processes (default: one per core), which
    ignore Ctrl-C so that an interrupt stops the driving process and it stops
    them.  Either way the client (and the cluster) are closed at the end with
    :func:`symquad.entry.quiet_close`.

    Examples
    --------
    >>> with dask_client(workers=2) as client:          # doctest: +SKIP
    ...     df1 = sweep("plateau", grid1, "runs/a", client=client)
    ...     df2 = sweep("plateau", grid2, "runs/b", client=client)
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    cluster = None
    if address is not None:
        from distributed import Client
        client = Client(address, timeout=timeout)
    else:
        client, cluster = _local_client(workers or os.cpu_count() or 1)
    try:
        yield client
    finally:
        quiet_close(client, cluster)


def _local_client(workers):
    import logging

    from distributed import Client, LocalCluster

    from ..entry import children_ignore_sigint

    # Workers ignore Ctrl-C (it stops the sweep here, which stops them; symquad.entry):
    # they are started while SIGINT is ignored here, so they inherit that.  A Ctrl-C
    # during the cluster's start-up (about a second) is therefore ignored; the
    # constructor itself reports a worker that cannot start.  No dashboard, and the
    # scheduler's HTTP routes on a free port: 8787 may be taken by another cluster
    # (distributed would warn "Port 8787 is already in use").
    with children_ignore_sigint():
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR,
                               preload=["symquad._dask_preload"],
                               scheduler_kwargs={"dashboard_address": ":0"})
    try:
        client = Client(cluster)
    except BaseException:
        quiet_close(cluster)
        raise
    return client, cluster


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------
def sweep(task, grid, store, *, client=None, workers=None, progress=None, retries=2,
          retry_errors=False, max_points=1_000_000):
    r"""Run `task` at every point of `grid`, storing each point as it finishes.

    Parameters
    ----------
    task : str or callable
        A registered task (``"plateau"``, ``"escape"``, ``"validate"``, ``"ode"``,
        ``"hessian"``; see ``symquad sweep --list``), a dotted path
        ``"package.module:function"`` (imported, never evaluated) or a
        module-level function of keyword parameters returning a flat dict.
    grid : dict
        Parameter name -> list of values; the sweep covers the Cartesian
        product (a scalar is a one-value list).  Parameters not in the grid
        take the task's defaults.  Every field of :class:`symquad.Model` is a
        parameter of every built-in task (``batch_size``, ``weight_decay``,
        ``constraint``, ...); a readout vector is one value inside the list,
        ``{"readout": [0.25, (0.5, 0.3, 0.2)]}`` (a tuple directly as the
        value would be read as the list of values), or its text
        ``"1/2:3/10:1/5"``.
    store : str or path-like
        Store folder (:mod:`symquad.studies.store`); points already there
        (same task, version and parameters) are not recomputed.
    client : distributed.Client, optional
        Run on this Dask cluster.
    workers : int, optional
        ``1``: serial, in this process.  Otherwise the number of worker
        processes of a local Dask cluster (default: the number of cores, at
        most the number of points to compute).  Ignored with `client`.
    progress : bool, optional
        Progress on stderr (:mod:`symquad.progress`): ``True`` a tqdm bar on a
        terminal and plain lines (every 10 % or 10 s, with the time left)
        otherwise, as ``symquad sweep`` does; ``None`` (default) a bar on a
        terminal and nothing otherwise; ``False`` nothing.
    retries : int
        Dask retries of a point whose execution failed outside the task.
    retry_errors : bool
        Recompute stored points whose status is ``"error"``.
    max_points : int
        Largest grid accepted (checked before the product is built).

    Returns
    -------
    pandas.DataFrame
        One row per grid point, in grid order: the parameter columns (all of
        the task's parameters), the result columns, ``status`` (``"ok"`` or
        ``"error"``), ``error`` (message), ``seconds``, ``finished_utc``,
        ``key``, ``task``, ``task_version``, ``traceback`` (and ``arrays``
        when the task returned arrays: :func:`symquad.load_sweep_arrays`).
        ``df.attrs["sweep"]`` is a :class:`SweepInfo`.
    """
    import pandas as pd

    t0 = time.perf_counter()
    task = get_task(task)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    points = [task.bind(pt) for pt in expand_grid(grid, max_points)]
    keys = [point_key(task.name, task.version, pt) for pt in points]
    unique = dict(zip(keys, points))                 # a repeated grid value runs once

    st = SweepStore(store, task.name)
    st.record_params(list(task.defaults))
    st.remove_stale_temporaries()
    stored = st.keys()
    if retry_errors and stored:
        errors = {r["key"] for r in st.rows() if r.get("status") == "error"}
        stored -= errors
    todo = [(k, p) for k, p in unique.items() if k not in stored]

    lost = {}
    counts = {"ok": 0, "error": 0}
    bar = _progress_bar(progress, len(unique), len(unique) - len(todo), f"sweep {task.name}")

    def on_done(key, params, outcome, failure=None):
        if outcome is None:
            lost[key] = _row(task, key, params, ({}, {}, "error", failure, None, 0.0))
        else:
            st.write(_row(task, key, params, outcome), outcome[1])
            counts[outcome[2]] += 1
        if bar is not None:
            bar.update(1)

    executor = "serial"
    try:
        if todo:
            if client is not None:
                executor = f"dask {getattr(client, 'scheduler', None) and client.scheduler.address}"
                _run_dask(task, todo, on_done, client, retries)
            elif workers == 1:
                _run_serial(task, todo, on_done)
            else:
                n = min(workers or os.cpu_count() or 1, len(todo))
                executor = f"local dask cluster, {n} worker process{'es' if n > 1 else ''}"
                own_client, cluster = _local_client(n)
                try:
                    _run_dask(task, todo, on_done, own_client, retries)
                finally:
                    quiet_close(own_client, cluster)
    finally:
        if bar is not None:
            bar.close()

    df_all = st.dataframe(list(task.defaults))
    by_key = {} if df_all.empty else {k: i for i, k in enumerate(df_all["key"])}
    rows = []
    for k in unique:
        if k in by_key:
            rows.append(df_all.iloc[by_key[k]].to_dict())
        elif k in lost:
            rows.append(lost[k])
    df = pd.DataFrame.from_records(rows)
    if not df.empty:
        front = list(task.defaults)
        meta = [c for c in META_COLUMNS if c in df.columns]
        df = df[front + [c for c in df.columns if c not in front and c not in meta] + meta]
    df.attrs["sweep"] = SweepInfo(
        task=task.name, version=task.version, points=len(unique),
        skipped=len(unique) - len(todo), computed=counts["ok"] + counts["error"],
        ok=counts["ok"], errors=counts["error"], lost=len(lost),
        seconds=time.perf_counter() - t0, executor=executor, store=st.path)
    return df
