"""Running the SGD and study jobs of :func:`symquad.studies.validation.validate`:
cost plan, workers, and the runner of the side studies.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import time
import warnings

from ..entry import children_ignore_sigint, ignore_sigint
from ..numeric import simulate as S
from ..numeric.checks import check_int as _check_int
from ..progress import note



#: validate warns when its SGD runs are estimated to take longer than this (seconds;
#: the default run's estimate is 7 s, its measured time about 20 s)
VALIDATE_WARN_SECONDS = 120.0


def _plan_runs(model, method, runs):
    """Check every SGD run of a validation before the first starts; warn when it is long.

    `runs` lists ``(label, N, t_max, replicas, n_times)``.  Each run's sizes are
    checked as :func:`symquad.simulate` would (the error names the run, e.g. an
    ``fss_N`` value far too large), and the estimated times (lower bounds,
    :func:`symquad.numeric.simulate.estimate_seconds`) are added up: above
    ``VALIDATE_WARN_SECONDS`` a RuntimeWarning gives the total and the longest runs,
    above ``MAX_ESTIMATED_SECONDS`` the validation is refused.
    """
    estimates = []
    for label, n, t_max, replicas, n_times in runs:
        try:
            estimates.append((S.plan_simulation(model, n, t_max, replicas, method, n_times),
                              label))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"validate: {label}: {exc}") from None
    total = sum(sec for sec, _ in estimates)
    longest = ", ".join(f"{label} {S._duration(sec)}" for sec, label in
                        sorted(estimates, reverse=True)[:3])
    if total > S.MAX_ESTIMATED_SECONDS:
        raise ValueError(f"validate: its SGD runs are estimated to take at least "
                         f"{S._duration(total)} ({longest}; limit "
                         f"{S._duration(S.MAX_ESTIMATED_SECONDS)}): reduce N, t_max, replicas "
                         f"or fss_N / invariant_N")
    if total > VALIDATE_WARN_SECONDS:
        warnings.warn(f"validate: the SGD runs are estimated to take at least "
                      f"{S._duration(total)} ({longest})", RuntimeWarning, stacklevel=3)
    return total


def _resolve_workers(workers, n_jobs):
    """Number of processes for `n_jobs` studies (see :func:`validate`, `workers`)."""
    import multiprocessing

    workers = _check_int(workers, "workers", 1)
    if n_jobs == 0 or multiprocessing.current_process().daemon:
        return 1
    return min(workers, n_jobs + 1)


_STUDY_LABELS = {"finite_size_scaling": "finite-size scaling",
                 "invariant_drift": "drift study of the invariant S"}


class _StudyRunner:
    """Run the side studies (name -> (function, kwargs)) serially or in worker processes.

    With ``workers > 1`` the studies are submitted to a process pool (spawned
    interpreters: no fork of a process that may hold compiled-code threads)
    when the context is entered, and collected by :meth:`results`; the caller
    does its own work in between.  With ``workers == 1`` they run inside
    :meth:`results`.  Leaving the context early (an error, Ctrl-C, or SIGTERM,
    which :func:`validate` turns into an exception) cancels what has not
    started and stops the worker processes at once (terminate, then kill),
    instead of waiting for studies that may run for minutes.
    """

    def __init__(self, jobs, workers, progress):
        self.jobs, self.workers, self.progress = jobs, workers, progress
        self.pool, self.futures = None, {}

    def __enter__(self):
        if self.workers > 1 and self.jobs:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # the workers ignore Ctrl-C: it reaches this process, which stops the pool
            with children_ignore_sigint():
                self.pool = ProcessPoolExecutor(
                    max_workers=min(self.workers - 1, len(self.jobs)),
                    mp_context=multiprocessing.get_context("spawn"), initializer=ignore_sigint)
                self.futures = {name: self.pool.submit(_timed_call, fn, kwargs)
                                for name, (fn, kwargs) in self.jobs.items()}
        return self

    def results(self):
        out, times = {}, {}
        for name, (fn, kwargs) in self.jobs.items():
            if self.pool is not None:
                note(self.progress, f"validate: waiting for the {_STUDY_LABELS.get(name, name)} "
                                    f"(worker process)")
                out[name], times[name] = self.futures[name].result()
            else:
                note(self.progress, f"validate: {_STUDY_LABELS.get(name, name)}")
                out[name], times[name] = _timed_call(fn, dict(kwargs, progress=self.progress))
        return out, times

    def __exit__(self, exc_type, exc, tb):
        if self.pool is None:
            return False
        if exc_type is None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            return False
        # the pool's own shutdown would wait for the running studies to finish
        procs = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        return False


def _timed_call(fn, kwargs):
    tick = time.perf_counter()
    value = fn(**kwargs)
    return value, time.perf_counter() - tick
