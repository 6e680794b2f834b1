"""Sweep engine: speed-up of one CPU-bound sweep on 1 vs 2 workers, where the time goes, overhead.

Part 1 runs the same CPU-bound sweep (the built-in ``escape`` task: prediction,
ODE and reduced-simulator SGD escape times; 8 grid points, ``p = 2..5``,
``p* = 1``, two seeds) three ways, side by side in one run, each into a fresh
store:

* ``serial``: ``workers=1`` (in this process);
* ``dask-1``: symquad's local Dask cluster (:func:`symquad.dask_client`, as
  ``sweep(..., workers=n)`` starts it) with 1 single-threaded worker process;
* ``dask-2``: the same with 2 worker processes.

Wall times include starting and warming the local cluster (imports, the
compiled SGD kernels) and stopping it: what a user waits for.  For each
executor it prints the phases (cluster start and warm-up, planning, the points,
the close), the sum of the points' own times, and for 2 workers the makespan
of the longest-first schedule of the measured point times (what a perfect
scheduler with no overhead would need), so that a shortfall can be told apart:
fixed overhead, scheduling, or a loaded machine (summed point time well above
serial's).  It checks that the three give identical numbers.

Part 2 measures the engine's cost per point with a task that does nothing
(``{"y": x}``): serial (bookkeeping + one atomic Parquet write per point)
and on an already running 2-worker cluster (scheduling + transfer + write).

``--suite`` runs the issue's four measurements, each in a fresh process: a sweep
of about 18 s serial and one of about 70 s (the issue's sizes), each with the
default threads and with ``OMP_NUM_THREADS=1``, and prints one table with the
speed-ups against the targets (>= 1.5x and >= 1.75x on 2 workers against 1).
The sizes are set by the SGD replicas per point, ``--suite-replicas N1,N2``
(default 224,1024: 18 s and 73-74 s serial on the 2-core machine since the
streamed escape crossings; when the issue was filed, 48 and 192 replicas took
about 18 s and 70 s).

Usage::

    python benchmarks/bench_sweep.py                     # 8 points, 48 replicas (~6.5 s serial)
    OMP_NUM_THREADS=1 python benchmarks/bench_sweep.py   # the same with pinned threads
    python benchmarks/bench_sweep.py --replicas 1024     # ~70 s serial
    python benchmarks/bench_sweep.py --suite --wait-load 1.0   # all four, once the load is low (~10 min)
    python benchmarks/bench_sweep.py --quick             # fewer replicas and no-ops
    python benchmarks/bench_sweep.py --schedule-check    # sleeping points: the order on 2 workers

Run on an otherwise idle machine: the speed-up of 2 workers over 1 is bounded
by the number of idle cores (the load average is printed before and after).
The numba kernels are compiled (in a separate process) before any timing, so
no executor pays a first compilation.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

import symquad as sq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLS = ["pred_sgd", "ode_median", "sgd_median"]
#: The issue's targets, by the sweep's size: the short sweep (its "≈ 18 s") and the long
#: one (its "≈ 70 s").
TARGETS = (1.5, 1.75)


def noop(x):
    """The cheapest possible task: measures the engine, not the work."""
    return {"y": x}


def nap(d, x=0):
    """Sleeps `d` s: a point whose length does not depend on the machine's load."""
    t = time.time()
    time.sleep(d)
    return {"start": t, "end": time.time(), "pid": os.getpid()}


nap.__symquad_cost__ = lambda params: params["d"]


def _schedule_check(root):
    """Sleeping points of the escape sweep's relative lengths on a running 2-worker cluster."""
    ds = [1.7, 1.71, 1.05, 1.06, 0.85, 0.86, 0.6, 0.61]      # p = 5, 4, 3, 2 (x2), seconds
    with sq.dask_client(workers=2) as client:
        sq.sweep(nap, {"d": [0.01, 0.02]}, os.path.join(root, "nap-warm"), client=client,
                 progress=False)
        t0 = time.perf_counter()
        df = sq.sweep(nap, {"d": ds[::-1]}, os.path.join(root, "nap"), client=client,
                      progress=False)        # submitted in the reverse (shortest first) grid order
        wall = time.perf_counter() - t0
    lpt = _lpt_makespan(ds, 2)
    per = {pid: [round(d, 2) for d in g.sort_values("start")["d"]]
           for pid, g in df.groupby("pid")}
    print(f"\nscheduling (8 sleeping points, 2 workers, already running): {wall:.2f} s against "
          f"the longest-first makespan {lpt:.2f} s; order per worker: {list(per.values())}")


def _grid(points, replicas):
    seeds = list(range(max(1, points // 4)))
    return {"p": [2, 3, 4, 5], "p_star": [1], "lr": [0.1], "lr_scaling": ["width"],
            "N": [1000], "replicas": [replicas], "seed": seeds}


def _lpt_makespan(seconds, workers):
    """Makespan of the longest-first list schedule of `seconds` on `workers` machines."""
    loads = [0.0] * workers
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + s)
    return max(loads)


def _compile_kernels():
    """Compile (or check) the numba cache in a separate process: no executor pays it."""
    code = "from symquad.numeric.simulate import warm_kernels; print(warm_kernels())"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    cached = out.stdout.strip().endswith("True")
    print(f"numba kernels: {'already cached' if cached else 'compiled now'} "
          f"({time.perf_counter() - t0:.1f} s, outside the timings)")


def _cpu_seconds():
    """CPU seconds (user + system) so far of this process and of each of its descendants.

    Keys: ``"main"`` (this process: the sweep's driver, and with a local cluster its
    scheduler, client and nannies, which run in this process's event loop) and
    ``"<pid> workers"`` per child process (the worker processes).  Read with psutil,
    which the Dask extra installs.
    """
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    out = {"main": t.user + t.system}
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            out[f"{child.pid} workers"] = c.user + c.system
        except psutil.Error:
            pass
    return out


def _cpu_during(before, after):
    """CPU seconds per role (main, workers) between two :func:`_cpu_seconds` readings."""
    roles = {}
    for key, v in after.items():
        role = key.split()[-1]
        roles[role] = roles.get(role, 0.0) + v - before.get(key, 0.0)
    return roles


def _cpu_bound(points, replicas, root):
    grid = _grid(points, replicas)
    out = {}
    t0 = time.perf_counter()
    c0 = _cpu_seconds()
    df = sq.sweep("escape", grid, os.path.join(root, "serial"), workers=1, progress=False)
    wall = time.perf_counter() - t0
    out["serial"] = {"df": df, "wall": wall, "phases": df.attrs["sweep"].phases,
                     "cpu": _cpu_during(c0, _cpu_seconds())}
    for n in (1, 2):
        # symquad's local cluster (started, warmed and stopped inside the timing; points
        # submitted longest first); sweep(workers=1) would run serially
        t0 = time.perf_counter()
        with sq.dask_client(workers=n) as client:
            t1 = time.perf_counter()
            c1 = _cpu_seconds()
            df = sq.sweep("escape", grid, os.path.join(root, f"dask{n}"), client=client,
                          progress=False)
            t2 = time.perf_counter()
            cpu = _cpu_during(c1, _cpu_seconds())
        t3 = time.perf_counter()
        phases = {"cluster_start+warm_up": t1 - t0, **df.attrs["sweep"].phases,
                  "close": t3 - t2}
        out[f"dask-{n}"] = {"df": df, "wall": t3 - t0, "phases": phases, "cpu": cpu}
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


def _command(args_list, pinned):
    env = "OMP_NUM_THREADS=1 " if pinned else ""
    return (f"cd {shlex.quote(ROOT)} && {env}PYTHONPATH=. python benchmarks/bench_sweep.py "
            + " ".join(args_list)).rstrip()


def run_one(args):
    # read now: starting a local cluster sets OMP_NUM_THREADS=1 in this process's environment
    omp = os.environ.get("OMP_NUM_THREADS")
    load0 = os.getloadavg()
    print(f"cores: {os.cpu_count()}, OMP_NUM_THREADS={omp}, "
          f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} (1, 5, 15 min)")
    _compile_kernels()
    with tempfile.TemporaryDirectory() as root:
        res = _cpu_bound(args.points, args.replicas, root)
        ref = res["serial"]["df"][COLS].to_numpy(float)
        same = all(np.array_equal(res[k]["df"][COLS].to_numpy(float), ref, equal_nan=True)
                   for k in ("dask-1", "dask-2"))
        n = len(res["serial"]["df"])
        print(f"\nCPU-bound sweep: task 'escape', {n} points (p=2..5, p*=1, N=1000, "
              f"{args.replicas} replicas, SGD on)")
        print(f"  {'executor':10s} {'wall s':>8s} {'points s':>9s} {'sum of points s':>16s} "
              f"{'in flight':>9s}  phases (s)")
        for k in ("serial", "dask-1", "dask-2"):
            r = res[k]
            busy = float(r["df"]["seconds"].sum())
            phases = ", ".join(f"{name} {v:.2f}" for name, v in r["phases"].items())
            print(f"  {k:10s} {r['wall']:8.2f} {r['phases'].get('points', float('nan')):9.2f} "
                  f"{busy:16.2f} {busy / r['wall']:9.2f}  {phases}")
        speedup = res["dask-1"]["wall"] / res["dask-2"]["wall"]
        print(f"  speed-up dask-2 vs dask-1: {speedup:.2f}x; dask-2 vs serial: "
              f"{res['serial']['wall'] / res['dask-2']['wall']:.2f}x")
        secs2 = res["dask-2"]["df"]["seconds"].to_numpy(float)
        lpt = _lpt_makespan(secs2, 2)
        print(f"  dask-2: longest-first makespan of its own point times {lpt:.2f} s against "
              f"{res['dask-2']['phases']['points']:.2f} s measured for the points; fixed "
              f"overhead (wall - points) {res['dask-2']['wall'] - res['dask-2']['phases']['points']:.2f} s")
        print(f"  sum of point times, dask-2 / serial: "
              f"{secs2.sum() / res['serial']['df']['seconds'].sum():.2f} (> 1: the two "
              f"workers slowed each other or other jobs took the cores)")
        print("  CPU seconds while the points ran (user + system), by process: the worker"
              " processes', this process's (driver; scheduler, client and nannies)")
        for k in ("serial", "dask-1", "dask-2"):
            c = res[k]["cpu"]
            busy = float(res[k]["df"]["seconds"].sum())
            own = c.get("workers", 0.0) if k != "serial" else c.get("main", 0.0)
            print(f"    {k:8s} " + ", ".join(f"{role} {v:.2f}" for role, v in sorted(c.items()))
                  + f"; summed point times {busy:.2f} (CPU / wall of the points "
                  f"{own / busy:.2f}: < 1, the points waited for a core)")
        print(f"  identical numbers on all three executors: {same}")
        if not same:            # say where: which executor, column and grid point differ
            for k in ("dask-1", "dask-2"):
                got = res[k]["df"][COLS].to_numpy(float)
                for j, c in enumerate(COLS):
                    bad = ~((got[:, j] == ref[:, j]) | (np.isnan(got[:, j]) & np.isnan(ref[:, j])))
                    if bad.any():
                        print(f"    {k} {c}: rows {np.flatnonzero(bad).tolist()}, serial "
                              f"{ref[bad, j].tolist()} vs {got[bad, j].tolist()}")
        if args.overhead_points:
            s, d, r = _overhead(args.overhead_points, root)
            print(f"\nengine overhead per point (no-op task, {args.overhead_points} points):")
            print(f"  serial (incl. atomic Parquet write): {1e3 * s:.1f} ms")
            print(f"  2-worker Dask cluster, already running: {1e3 * d:.1f} ms")
            print(f"  rerun of a complete store (nothing computed): {1e3 * r:.2f} ms")
    load1 = os.getloadavg()
    print(f"\nload average at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    summary = {"replicas": args.replicas, "omp": omp,
               "serial": res["serial"]["wall"], "dask1": res["dask-1"]["wall"],
               "dask2": res["dask-2"]["wall"], "speedup": speedup, "same": same,
               "lpt": lpt, "points2": res["dask-2"]["phases"]["points"],
               "sum_serial": float(res["serial"]["df"]["seconds"].sum()),
               "sum2": float(secs2.sum()), "load0": load0[0], "load1": load1[0],
               "dask1_sum": float(res["dask-1"]["df"]["seconds"].sum()),
               "cpu_serial": res["serial"]["cpu"].get("main", 0.0),
               "cpu1": res["dask-1"]["cpu"].get("workers", 0.0),
               "cpu2": res["dask-2"]["cpu"].get("workers", 0.0)}
    print("SUMMARY " + json.dumps(summary))
    print("rerun: " + _command(sys.argv[1:], omp == "1"))
    return summary


def _wait_for_load(limit, longest):
    t0 = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - t0 < longest:
        time.sleep(10)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} after waiting {time.monotonic() - t0:.0f} s for < {limit:g}"
          f"{'' if load < limit else ' (not reached; measuring anyway)'}")


def run_suite(args):
    rows = []
    sizes = args.suite_replicas
    for replicas in sizes:
        for pinned in (False, True):
            cmd = [sys.executable, os.path.abspath(__file__), "--replicas", str(replicas),
                   "--overhead-points", "0"]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            env.pop("OMP_NUM_THREADS", None)
            if pinned:
                env["OMP_NUM_THREADS"] = "1"
            print(f"\n=== {replicas} replicas, {'OMP_NUM_THREADS=1' if pinned else 'default threads'}",
                  flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            sys.stdout.write(proc.stdout)
            if proc.returncode:
                sys.stdout.write(proc.stderr[-3000:])
                raise SystemExit(f"the run failed (exit {proc.returncode})")
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")][-1]
            rows.append(json.loads(line[len("SUMMARY "):]))
    print("\n| replicas | threads | serial s | 1 worker s | 2 workers s | 2 vs 1 | target | "
          "sum of points 2w / serial | points' CPU / wall: serial, 1w, 2w | "
          "load before / after | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        target = TARGETS[sizes.index(r["replicas"])]
        print(f"| {r['replicas']} | {'OMP_NUM_THREADS=1' if r['omp'] == '1' else 'default'} | "
              f"{r['serial']:.1f} | {r['dask1']:.1f} | {r['dask2']:.1f} | {r['speedup']:.2f}x | "
              f">= {target:.2f}x | {r['sum2'] / r['sum_serial']:.2f} | "
              f"{r['cpu_serial'] / r['sum_serial']:.2f}, {r['cpu1'] / r['dask1_sum']:.2f}, "
              f"{r['cpu2'] / r['sum2']:.2f} | "
              f"{r['load0']:.2f} / {r['load1']:.2f} | {r['same']} |")
    print("\nrerun: " + _command(sys.argv[1:], False))


def _two_sizes(text):
    """``"48,192"`` → ``(48, 192)``: two increasing positive replica counts."""
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 2 or not 0 < sizes[0] < sizes[1]:
        raise argparse.ArgumentTypeError(f"--suite-replicas must be two increasing positive "
                                         f"integers N1,N2, got {text!r}")
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--points", type=int, default=8, help="CPU-bound grid points (multiple of 4)")
    ap.add_argument("--replicas", type=int, default=48, help="SGD replicas per point")
    ap.add_argument("--overhead-points", type=int, default=200,
                    help="no-op points of part 2 (0: leave part 2 out)")
    ap.add_argument("--schedule-check", action="store_true",
                    help="only time 8 sleeping points on 2 workers (a scheduling check that "
                         "does not depend on the load)")
    ap.add_argument("--quick", action="store_true", help="16 replicas, 100 no-ops")
    ap.add_argument("--suite", action="store_true",
                    help="a short and a long sweep (--suite-replicas), default and pinned "
                         "threads, one table")
    ap.add_argument("--suite-replicas", type=_two_sizes, default=(224, 1024), metavar="N1,N2",
                    help="replicas per point of the ~18 s and the ~70 s sweep of --suite "
                         "(targets >= 1.5x and >= 1.75x; default 224,1024)")
    ap.add_argument("--wait-load", type=float, default=None, metavar="LOAD",
                    help="first wait (up to --wait-max s) until the 1-min load is below LOAD")
    ap.add_argument("--wait-max", type=float, default=900.0)
    args = ap.parse_args()
    if args.quick:
        args.replicas, args.overhead_points = 16, 100
    if args.wait_load is not None:
        _wait_for_load(args.wait_load, args.wait_max)
    if args.schedule_check:
        print(f"load average {os.getloadavg()[0]:.2f}")
        with tempfile.TemporaryDirectory() as root:
            _schedule_check(root)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    elif args.suite:
        run_suite(args)
    else:
        run_one(args)


if __name__ == "__main__":
    main()
