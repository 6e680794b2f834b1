"""Sweep engine: speed-up of one CPU-bound sweep on 1 vs 2 workers, and per-point overhead.

Part 1 runs the same CPU-bound sweep (the built-in ``escape`` task: prediction,
ODE and reduced-simulator SGD escape times; ``--points`` grid points) three
ways, side by side in one run, each into a fresh store:

* ``serial``: ``workers=1`` (in this process);
* ``dask-1``: symquad's local Dask cluster (:func:`symquad.dask_client`, as
  ``sweep(..., workers=n)`` starts it) with 1 single-threaded worker process;
* ``dask-2``: the same with 2 worker processes.

Wall times include starting, warming and stopping the local cluster (what a
user waits for).  It checks that the three give identical numbers.

Part 2 measures the engine's cost per point with a task that does nothing
(``{"y": x}``): serial (bookkeeping + one atomic Parquet write per point)
and on an already running 2-worker cluster (scheduling + transfer + write).

Usage::

    python benchmarks/bench_sweep.py                     # ~18 s serial sweep (8 points, 48 replicas)
    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py   # the same with pinned threads
    python benchmarks/bench_sweep.py --replicas 192      # 4x the work per point (~70 s serial)
    python benchmarks/bench_sweep.py --quick             # fewer points and replicas

Run on an otherwise idle machine: the speed-up of 2 workers over 1 is bounded
by the number of idle cores.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np

import symquad as sq


def noop(x):
    """The cheapest possible task: measures the engine, not the work."""
    return {"y": x}


def _grid(points, replicas):
    seeds = list(range(max(1, points // 4)))
    return {"p": [2, 3, 4, 5], "p_star": [1], "lr": [0.1], "lr_scaling": ["width"],
            "N": [1000], "replicas": [replicas], "seed": seeds}


def _cpu_bound(points, replicas, root):
    grid = _grid(points, replicas)
    out = {}
    t0 = time.perf_counter()
    out["serial"] = (sq.sweep("escape", grid, os.path.join(root, "serial"), workers=1,
                              progress=False), time.perf_counter() - t0)
    for n in (1, 2):
        # symquad's local cluster (started, warmed and stopped inside the timing; points
        # submitted longest first); sweep(workers=1) would run serially
        t0 = time.perf_counter()
        with sq.dask_client(workers=n) as client:
            df = sq.sweep("escape", grid, os.path.join(root, f"dask{n}"), client=client,
                          progress=False)
        out[f"dask-{n}"] = (df, time.perf_counter() - t0)
    return out


def _overhead(n_points, root):
    from distributed import Client, LocalCluster

    grid = {"x": list(range(n_points))}
    t0 = time.perf_counter()
    sq.sweep(noop, grid, os.path.join(root, "noop-serial"), workers=1, progress=False)
    serial = (time.perf_counter() - t0) / n_points
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(cluster)
    client.run(lambda: None)             # workers up before timing
    t0 = time.perf_counter()
    sq.sweep(noop, grid, os.path.join(root, "noop-dask"), client=client, progress=False)
    dask = (time.perf_counter() - t0) / n_points
    t0 = time.perf_counter()
    df = sq.sweep(noop, grid, os.path.join(root, "noop-dask"), client=client, progress=False)
    rerun = (time.perf_counter() - t0) / n_points
    assert df.attrs["sweep"].computed == 0
    client.close()
    cluster.close()
    return serial, dask, rerun


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=8, help="CPU-bound grid points (multiple of 4)")
    ap.add_argument("--replicas", type=int, default=48, help="SGD replicas per point")
    ap.add_argument("--overhead-points", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="4 points, 16 replicas, 100 no-ops")
    args = ap.parse_args()
    if args.quick:
        args.points, args.replicas, args.overhead_points = 4, 16, 100
    print(f"cores: {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as root:
        res = _cpu_bound(args.points, args.replicas, root)
        cols = ["pred_sgd", "ode_median", "sgd_median"]
        ref = res["serial"][0][cols].to_numpy(float)
        same = all(np.array_equal(res[k][0][cols].to_numpy(float), ref, equal_nan=True)
                   for k in ("dask-1", "dask-2"))
        n = len(res["serial"][0])
        print(f"\nCPU-bound sweep: task 'escape', {n} points (p=2..5, p*=1, N=1000, "
              f"{args.replicas} replicas, SGD on)")
        print(f"  {'executor':10s} {'wall s':>8s} {'per point s':>12s}")
        for k in ("serial", "dask-1", "dask-2"):
            print(f"  {k:10s} {res[k][1]:8.2f} {res[k][1] / n:12.3f}")
        print(f"  speed-up dask-2 vs dask-1: {res['dask-1'][1] / res['dask-2'][1]:.2f}x; "
              f"dask-2 vs serial: {res['serial'][1] / res['dask-2'][1]:.2f}x")
        print(f"  identical numbers on all three executors: {same}")
        if not same:            # say where: which executor, column and grid point differ
            for k in ("dask-1", "dask-2"):
                got = res[k][0][cols].to_numpy(float)
                for j, c in enumerate(cols):
                    bad = ~((got[:, j] == ref[:, j]) | (np.isnan(got[:, j]) & np.isnan(ref[:, j])))
                    if bad.any():
                        print(f"    {k} {c}: rows {np.flatnonzero(bad).tolist()}, serial "
                              f"{ref[bad, j].tolist()} vs {got[bad, j].tolist()}")
        # points in flight on average = summed task time / wall time: ~2 on 2 workers means
        # they ran concurrently; if the speed-up is still ~1, the cores were not idle
        for k in ("serial", "dask-1", "dask-2"):
            busy = float(res[k][0]["seconds"].sum())
            print(f"  {k}: summed task time {busy:.1f} s, points in flight on average "
                  f"{busy / res[k][1]:.2f}, mean task time {busy / n:.2f} s")
        s, d, r = _overhead(args.overhead_points, root)
        print(f"\nengine overhead per point (no-op task, {args.overhead_points} points):")
        print(f"  serial (incl. atomic Parquet write): {1e3 * s:.1f} ms")
        print(f"  2-worker Dask cluster, already running: {1e3 * d:.1f} ms")
        print(f"  rerun of a complete store (nothing computed): {1e3 * r:.2f} ms")
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
