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
  another machine, or a dask-jobqueue / dask-kubernetes cluster
  (:func:`connect_scheduler` makes one from an address within a deadline).

On Dask the points are submitted longest first by the task's run-time
estimate (:func:`longest_first`), and the workers of a local cluster import the
task's module and symquad's numerics, and load the compiled SGD kernels, once,
together, before the first point (``df.attrs["sweep"].phases`` says where the
time went).
Without ``timeout=`` a point runs in the worker process itself (no child
process).

Bounded waits
-------------
``timeout=`` bounds each point: the point runs in a child process
(:mod:`symquad.studies.point_runner`, on whichever executor) that is killed
when the time is up, and the point becomes an error row
(``"TimeoutError: ..."``, stored, retried with ``retry_errors``).  On Dask the
sweep waits at most ``worker_timeout`` seconds for a worker -- at the start
and whenever the cluster has none -- and then reports the points it could not
run as lost (not stored, so a rerun computes them).  SIGTERM (what batch
schedulers send) stops the sweep like Ctrl-C: the local cluster and any
point process are stopped, points in flight are cancelled, and every point
finished before it is in the store (:mod:`symquad._signals`).

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
of stopping the whole sweep.  Results that a store could not read back
(object arrays, integers beyond int64, text that is not valid UTF-8, Python
objects) are refused when the task returns them: the point becomes an error
row naming the result.

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
import queue
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from numbers import Real

import numpy as np

from .._signals import terminate_cleanly
from ..entry import children_ignore_sigint, muted_shutdown_logs, quiet_close
from ..numeric.simulate import warm_kernels
from ..progress import progress as _progress
from .point_outcome import _failure_message, _split_result, _storable_scalar, run_untimed  # noqa: F401
from .point_runner import close_thread_runner, run_with_timeout
from .store import META_COLUMNS, SweepStore, canonical_params, new_token, point_key
from .tasks import get_task

__all__ = ["sweep", "expand_grid", "run_point", "SweepInfo", "dask_client", "connect_scheduler",
           "longest_first"]

#: Local-cluster worker processes allowed per core (each is an interpreter of ~100 MB).
MAX_WORKERS_PER_CORE = 4
#: How often the Dask executor checks that the cluster still has workers (seconds).
_WATCH_EVERY = 2.0


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
    #: Seconds of each phase: ``plan`` (grid, store), ``cluster_start``, ``warm_up``
    #: (local cluster only), ``points`` (submission to the last point) and ``close``.
    phases: dict = field(default_factory=dict, compare=False)

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
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise ValueError(f"max_points must be an integer >= 1, got {max_points!r}")
    names, lengths = [], []
    for name, vals in grid.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"grid parameter names must be identifiers, got {name!r}")
        sequence = isinstance(vals, (list, tuple, np.ndarray, range))
        names.append(name)
        lengths.append(len(vals) if sequence else 1)
        if sequence and isinstance(vals, np.ndarray) and vals.ndim != 1:
            raise ValueError(f"grid[{name!r}] must be a 1-d list of values, got an array of "
                             f"shape {vals.shape}")
        if lengths[-1] == 0:
            raise ValueError(f"grid[{name!r}] is empty")
    # sizes before any list is built: range(10**12) must not be materialised
    size = math.prod(lengths)
    if size > max_points:
        raise ValueError(f"the grid has {size} points ({' x '.join(map(str, lengths))}), "
                         f"more than max_points={max_points}; split the sweep or raise "
                         f"max_points")
    values = []
    for name, vals in grid.items():
        if isinstance(vals, (list, tuple, np.ndarray, range)):
            vals = list(vals.tolist() if isinstance(vals, np.ndarray) else vals)
        else:
            vals = [vals]
        for v in vals:
            canonical_params({name: v})        # type and range check (TypeError/ValueError)
        values.append(vals)
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


# ---------------------------------------------------------------------------
# one point (runs on a worker; the untimed run is symquad.studies.point_outcome's)
# ---------------------------------------------------------------------------
def run_point(func, params, timeout=None):
    """Run ``func(**params)``; return ``(scalars, arrays, status, error, traceback, seconds)``.

    Exceptions raised by the task become ``status="error"`` with the message
    ``"ExceptionType: message"``; they are not re-raised.  ``sys.exit`` in a
    task (``SystemExit``) is such an error too, never the exit of the process
    or the worker; only ``KeyboardInterrupt`` stops the sweep.  With `timeout`
    (seconds) the point runs in this thread's child process
    (:mod:`symquad.studies.point_runner`) and is stopped after `timeout`
    seconds with an error outcome ``"TimeoutError: ..."``.
    """
    if timeout is not None:
        return run_with_timeout(func, params, timeout)
    return run_untimed(func, params)


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
    return _progress(progress, total, desc, "points", initial=initial)


def _run_serial(task, todo, on_done, timeout):
    try:
        for key, params in todo:
            on_done(key, params, run_point(task.func, params, timeout))
    finally:
        if timeout is not None:
            close_thread_runner()


def _n_workers(client):
    """Workers the scheduler knows now (0 if it does not answer within a few seconds)."""
    try:
        return len(client.nthreads(callback_timeout=5))
    except Exception:       # scheduler gone or silent: no usable worker
        return 0


def _wait_for_a_worker(client, worker_timeout):
    if _n_workers(client):
        return
    if worker_timeout is None:
        client.wait_for_workers(1)
        return
    try:
        client.wait_for_workers(1, timeout=worker_timeout)
    except Exception as exc:       # distributed's TimeoutError, or a lost scheduler
        raise TimeoutError(f"no Dask worker joined the scheduler within worker_timeout="
                           f"{worker_timeout:g} s ({type(exc).__name__}); start workers or "
                           f"raise worker_timeout") from None


def longest_first(task, todo):
    """`todo` ((key, params) pairs) ordered by the task's run-time estimate, longest first.

    On several workers the sweep's wall time is at least the largest point's
    time plus whatever ran before it on its worker: submitted in grid order, the
    largest points of a grid that grows along its last axis start last, and
    one worker computes them while the other is idle.  Sorting by the
    estimate (:attr:`symquad.studies.tasks.Task.cost`; the longest-processing-
    time-first rule, within 4/3 of the best schedule) starts them first.  The
    sort is stable, points without an estimate go first (they may be long), and
    without any estimate the grid order is kept.
    """
    costs = [task.estimated_cost(params) for _, params in todo]
    if all(c is None for c in costs):
        return list(todo)
    order = sorted(range(len(todo)),
                   key=lambda i: (costs[i] is not None, -(costs[i] or 0.0)))
    return [todo[i] for i in order]


def _warm_modules(task):
    """Modules a worker imports before its first point, and whether it loads the SGD kernels.

    A task of symquad's own warms symquad's numerics: the landscape, the
    simulators, SciPy's statistics (imported on first use by the random
    starts) and the reduced simulator's compiled kernels
    (:func:`symquad.numeric.simulate.warm_kernels`).  A task of another
    module warms that module only.
    """
    module = getattr(task.func, "__module__", None) or ""
    mods = [module] if module and module != "__main__" else []
    own = module.startswith("symquad.")
    if own:
        mods += ["symquad.numeric.landscape", "symquad.numeric.simulate", "scipy.stats"]
    return mods, own


def _import_modules(modules, kernels=False):
    """Import `modules` (and load the SGD kernels): what a worker runs once, before its points."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:          # the point itself reports what is wrong with its module
            pass
    if kernels:
        try:
            warm_kernels()
        except Exception:          # e.g. numba missing: the points report it
            pass


def _warm_up(client, modules, kernels=False):
    """Import `modules` (and load the SGD kernels) on every worker at once, before any point.

    A fresh worker process pays its imports (SciPy, numba, the task's module)
    and the loading of the compiled kernels -- seconds -- in its first point;
    warmed together at the start, each point's ``seconds`` is its own work
    and no worker starts its first (largest) point late.  With an empty numba
    cache the workers compile one after the other under a file lock, so the
    code is compiled once (:func:`symquad.numeric.simulate.warm_kernels`).
    """
    if not modules and not kernels:
        return
    try:
        client.run(_import_modules, list(modules), kernels)
    except Exception:              # a worker that cannot import is reported by its points
        pass


def _run_dask(task, todo, on_done, client, retries, timeout, worker_timeout):
    _wait_for_a_worker(client, worker_timeout)
    token = new_token()
    futures = {}
    done_queue = queue.Queue()
    todo = longest_first(task, todo)
    for rank, (key, params) in enumerate(todo):
        # the priority keeps the submission order on the scheduler (higher runs first)
        fut = client.submit(run_point, task.func, params, timeout, priority=len(todo) - rank,
                            key=f"{task.name}-{key[:12]}-{token}", pure=False, retries=retries)
        futures[fut] = (key, params)
        fut.add_done_callback(done_queue.put)
    idle_since = None
    next_watch = time.monotonic() + _WATCH_EVERY
    try:
        while futures:
            try:
                fut = done_queue.get(timeout=_WATCH_EVERY)
            except queue.Empty:
                fut = None
            if fut is not None and fut in futures:
                key, params = futures.pop(fut)
                try:
                    outcome = fut.result()
                except Exception as exc:    # outside the task: KilledWorker, cancelled, ...
                    on_done(key, params, None, f"{type(exc).__name__}: {exc}")
                else:
                    on_done(key, params, outcome)
                fut.release()
            now = time.monotonic()
            if futures and worker_timeout is not None and now >= next_watch:
                next_watch = now + _WATCH_EVERY
                if _n_workers(client):
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since > worker_timeout:
                    why = (f"TimeoutError: the Dask cluster had no worker for worker_timeout="
                           f"{worker_timeout:g} s; the point was not run (rerun to retry)")
                    for fut, (key, params) in list(futures.items()):
                        on_done(key, params, None, why)
                    break
    finally:
        if futures:          # interrupted: do not leave our points running on the cluster
            try:
                client.cancel(list(futures))
            except Exception:       # the scheduler is gone: nothing to cancel
                pass


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
    if address is not None:
        from distributed import Client
        client = Client(address, timeout=timeout)
        try:
            yield client
        finally:
            quiet_close(client)
        return
    client, cluster, started = _local_client(workers or os.cpu_count() or 1)
    try:
        _warm_up(client, ["symquad.numeric.landscape", "symquad.numeric.simulate", "scipy.stats"],
                 kernels=True)
        yield client
    except BaseException:
        _close_local(client, cluster, started, abort=True)
        raise
    _close_local(client, cluster, started)


#: Dask configuration of the local clusters symquad starts (see :func:`_local_client`):
#: no statistical profiler (it samples every worker's stack every 10 ms for a dashboard
#: these clusters do not serve), and glibc's own allocator settings in the workers, as in
#: the user's process.  distributed's nannies set ``MALLOC_TRIM_THRESHOLD_=65536``, and an
#: explicit trim threshold also turns off glibc's dynamic mmap threshold: every array
#: above 128 KiB is then mapped and unmapped again, each page faulted in anew.  Measured on
#: the escape sweep's ``p = 5`` point (192 replicas, one BLAS thread, idle 2-core machine,
#: ``benchmarks/bench_escape_point.py --allocator``):
#: 3.58–3.74 s of CPU and 8.8·10⁵ page faults with it, 2.7 s and 1.1·10⁵ without; a sweep's
#: points took 1.3–1.4× their serial time on a worker.  ``None`` drops the variable
#: (a value the user exports is still inherited).
LOCAL_WORKER_CONFIG = {"distributed.worker.profile.enabled": False,
                       "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def _local_client(workers):
    """A local cluster, its client, and its worker processes (psutil handles)."""
    import logging

    import dask
    import psutil
    from distributed import Client, LocalCluster

    # Workers ignore Ctrl-C (it stops the sweep here, which stops them; symquad.entry):
    # they are started while SIGINT is ignored here, so they inherit that.  A Ctrl-C
    # during the cluster's start-up (about a second) is therefore ignored; the
    # constructor itself reports a worker that cannot start.  No dashboard, and the
    # scheduler's HTTP routes on a free port: 8787 may be taken by another cluster
    # (distributed would warn "Port 8787 is already in use").
    # The workers' statistical profiler is off: it wakes every 10 ms in each worker to
    # sample the task's stack for a dashboard this cluster does not serve, and on a
    # machine whose cores the points fill, those wake-ups take time from the points.
    # (Each nanny copies the configuration set here into its worker at start-up.)
    with children_ignore_sigint(), dask.config.set(LOCAL_WORKER_CONFIG):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR,
                               preload=["symquad._dask_preload"],
                               scheduler_kwargs={"dashboard_address": ":0"})
    started = []
    for nanny in list(cluster.workers.values()):
        pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
        try:
            if pid:
                started.append(psutil.Process(pid))      # the worker process of this nanny
        except psutil.Error:
            pass
    try:
        client = Client(cluster)
    except BaseException:
        quiet_close(cluster)
        raise
    return client, cluster, started


def _close_local(client, cluster, started, abort=False):
    """Close the local cluster; worker processes that do not leave in time are killed.

    The nannies are closed first, all at once, each giving its worker a grace
    period (1 s with `abort`, 3 s otherwise), and then the client and the
    cluster.  distributed's own cluster close retires the workers one by one
    and took 3.4-3.8 s for 2 idle workers on the loaded 2-core machine, against
    1.0-1.1 s for the nannies closed together (load 13-14, side by side): after
    a finished sweep nothing is left on the workers to wait for.  With `abort`
    (an exception, Ctrl-C or SIGTERM ends the sweep) the client and the cluster
    get 2 s instead of 10 -- a graceful close would wait for the points the
    workers are computing -- so the clean-up fits in a batch scheduler's grace
    period.  Only the cluster's worker processes are touched (psutil handles,
    so a reused process id is never mistaken for one of them).  distributed's
    shutdown logs are muted (symquad.entry.muted_shutdown_logs).
    """
    import asyncio

    import psutil

    def stop(procs, grace):
        alive = [c for c in procs if c.is_running()]
        for c in alive:
            try:
                c.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for c in alive:
            try:
                c.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace)

    grace = 1 if abort else 3
    reason = "symquad-abort" if abort else "symquad-done"

    async def close_nannies(nannies):
        # a nanny would restart a worker killed under it: each stops its own, together
        await asyncio.gather(*(n.close(timeout=grace, reason=reason) for n in nannies),
                             return_exceptions=True)

    with muted_shutdown_logs():
        try:
            cluster.sync(close_nannies, list(getattr(cluster, "workers", {}).values()),
                         callback_timeout=grace + 4)
        except Exception:       # their processes are killed below
            pass
        for closer in (client.close, cluster.close):
            try:
                closer(timeout=2 if abort else 10)
            except Exception:       # already closing, or the loop is gone: killed below
                pass
    stop(started, 5.0)


def connect_scheduler(address, timeout=30.0):
    """A :class:`distributed.Client` for the scheduler at `address`, or an error within `timeout`.

    ``distributed.Client(address, timeout=...)`` can wait forever on a peer
    that accepts the TCP connection and never answers; here the scheduler is
    first asked for its identity with a hard deadline (an ``asyncio`` timeout
    that cancels the read), and the client is then made in a helper thread
    that is abandoned if it has not connected in time (at most 1 s after the
    deadline).

    Raises
    ------
    TimeoutError
        No Dask scheduler answered at `address` within `timeout` seconds.
    OSError
        The connection was refused or the address is unreachable.
    ValueError
        A malformed address.
    """
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    timeout = _check_seconds(timeout, "timeout")
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"scheduler address must be a non-empty string such as "
                         f"'tcp://host:8786', got {address!r}")
    deadline = time.monotonic() + timeout

    async def identity():
        from distributed.comm import connect as comm_connect

        comm = await comm_connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    # a thread of its own: asyncio.run cannot run inside a running loop (e.g. Jupyter)
    with ThreadPoolExecutor(1) as pool:
        probe = pool.submit(asyncio.run, asyncio.wait_for(identity(), timeout))
        try:
            reply = probe.result()
        except (asyncio.TimeoutError, TimeoutError):
            raise TimeoutError(f"no Dask scheduler answered at {address!r} within {timeout:g} "
                               f"s (the peer accepted the connection but did not speak the "
                               f"Dask protocol, or nothing is listening)") from None
        except ValueError as exc:
            raise ValueError(f"bad scheduler address {address!r}: {exc}") from None
        except OSError as exc:
            raise OSError(f"cannot reach a Dask scheduler at {address!r}: {exc}") from None
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise OSError(f"the peer at {address!r} is not a Dask scheduler "
                      f"(identity {str(reply)[:80]!r})")
    box = {}

    def make():
        from distributed import Client
        try:
            box["client"] = Client(address, timeout=max(1.0, deadline - time.monotonic()))
        except BaseException as exc:       # reported to the caller below
            box["error"] = exc

    helper = threading.Thread(target=make, name="symquad-connect", daemon=True)
    helper.start()
    helper.join(max(1.0, deadline - time.monotonic()))
    if helper.is_alive():
        raise TimeoutError(f"the Dask scheduler at {address!r} did not accept a client "
                           f"within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        raise OSError(f"cannot connect to the Dask scheduler at {address!r}: "
                      f"{type(exc).__name__}: {exc}") from None
    return box["client"]


#: Longest wait any ``*timeout`` argument accepts (about 116 days): the operating
#: system's waits (``select``, locks) overflow on larger numbers (``1e300`` was an
#: OverflowError, exit 5); ``None`` means no limit where it is allowed.
MAX_SECONDS = 1e7


def _check_seconds(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{name} must be a number of seconds in (0, {MAX_SECONDS:.0e}]"
                         f"{' or None (no limit)' if allow_none else ''}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------
def sweep(task, grid, store, *, client=None, workers=None, progress=None, retries=2,
          retry_errors=False, max_points=1_000_000, timeout=None, worker_timeout=300.0):
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
    timeout : float, optional
        Seconds a point may run.  With a timeout each point runs in a child
        process (:mod:`symquad.studies.point_runner`; also on Dask workers),
        killed when the time is up; the point then becomes an error row
        ``"TimeoutError: ..."`` (stored; ``retry_errors`` retries it).  The
        task and its results must then be picklable (cloudpickle: functions
        of a script's ``__main__`` are fine).  Default: no limit, the point
        runs in the executor's own process.
    worker_timeout : float or None
        Dask only: seconds to wait for a worker, at the start and whenever the
        cluster has none (all workers lost, or a queue that has not started
        them).  After that the points not run are reported lost (``status``
        ``"error"``, not stored: a rerun computes them).  ``None`` waits
        forever (e.g. a batch queue that may take hours to start workers).

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
    cores = os.cpu_count() or 1
    if client is None and workers is not None and workers > MAX_WORKERS_PER_CORE * max(cores, 2):
        raise ValueError(f"workers={workers} local worker processes on {cores} cores is beyond "
                         f"{MAX_WORKERS_PER_CORE * max(cores, 2)} ({MAX_WORKERS_PER_CORE} per "
                         f"core; each is a Python process); pass client= for a larger cluster")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    clash = [name for name in task.defaults if name in META_COLUMNS]
    if clash:
        raise TypeError(f"task {task.name!r} has parameter(s) {clash}, names a sweep's table "
                        f"uses for its own columns {META_COLUMNS}; rename them")
    timeout = _check_seconds(timeout, "timeout", allow_none=True)
    if timeout is not None and os.name != "posix":
        raise ValueError("timeout= runs each point in a child process watched through POSIX "
                         "pipes; it is not available on this system")
    worker_timeout = _check_seconds(worker_timeout, "worker_timeout", allow_none=True)
    points = [task.bind(pt) for pt in expand_grid(grid, max_points)]
    keys = [point_key(task.name, task.version, pt) for pt in points]
    unique = dict(zip(keys, points))                 # a repeated grid value runs once

    st = SweepStore(store, task.name)
    st.record_params(list(task.defaults))
    st.remove_stale_temporaries()
    # reading the rows (not just the file names) sets aside damaged point files,
    # whose points then count as missing and are computed again
    stored_rows = st.rows(quarantine=True)
    stored = {r["key"] for r in stored_rows}
    if retry_errors:
        stored -= {r["key"] for r in stored_rows if r.get("status") == "error"}
    todo = [(k, p) for k, p in unique.items() if k not in stored]

    lost = {}
    counts = {"ok": 0, "error": 0}
    bar = _progress_bar(progress, len(unique), len(unique) - len(todo), f"sweep {task.name}")

    def on_done(key, params, outcome, failure=None):
        if outcome is not None and outcome[2] == "interrupted":
            # a point whose process was stopped (point_runner._stopped): never stored
            outcome, failure = None, outcome[3]
        if outcome is None:
            lost[key] = _row(task, key, params, ({}, {}, "error", failure, None, 0.0))
        else:
            st.write(_row(task, key, params, outcome), outcome[1])
            counts[outcome[2]] += 1
        if bar is not None:
            bar.update(1)

    executor = "serial"
    finished = False
    phases = {"plan": time.perf_counter() - t0}

    def phase(name, since):
        now = time.perf_counter()
        phases[name] = now - since
        return now

    try:
        with terminate_cleanly():
            if todo:
                t = time.perf_counter()
                if client is not None:
                    executor = (f"dask "
                                f"{getattr(client, 'scheduler', None) and client.scheduler.address}")
                    _run_dask(task, todo, on_done, client, retries, timeout, worker_timeout)
                    phase("points", t)
                elif workers == 1:
                    _run_serial(task, todo, on_done, timeout)
                    phase("points", t)
                else:
                    n = min(workers or cores, len(todo))
                    executor = f"local dask cluster, {n} worker process{'es' if n > 1 else ''}"
                    own_client, cluster, started = _local_client(n)
                    t = phase("cluster_start", t)
                    try:
                        _warm_up(own_client, *_warm_modules(task))
                        t = phase("warm_up", t)
                        _run_dask(task, todo, on_done, own_client, retries, timeout,
                                  worker_timeout)
                        t = phase("points", t)
                    except BaseException:
                        _close_local(own_client, cluster, started, abort=True)
                        raise
                    _close_local(own_client, cluster, started)
                    phase("close", t)
        finished = True
    finally:
        if bar is not None:
            # an interrupted sweep says so, never "done"
            bar.close(interrupted=not finished)

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
        seconds=time.perf_counter() - t0,
        executor=executor + (f", timeout {timeout:g} s per point" if timeout else ""),
        store=st.path, phases={k: round(v, 3) for k, v in phases.items()})
    return df
