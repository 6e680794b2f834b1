"""BLAS threads of one large integration's products: time and bits, 1 thread against n.

From ``p + p* >= 48`` (and in the tensor form) the kernels' matrix products run
on :func:`symquad.numeric.kernels.blas_threads` threads: 1 by default
(deterministic), or the ``threads=`` keyword of ``sq.kernels`` / ``sq.integrate``,
or the environment variable ``SYMQUAD_THREADS``.  For each width this times the
ODE right-hand side (median of repeated calls) on 1 and on ``--threads``
threads, side by side in one run, and reports whether the two results are
equal bit for bit.

Usage::

    python benchmarks/bench_threads.py                       # p = 64, 128, 256; 1 vs 2 threads
    python benchmarks/bench_threads.py --form tensor --p 64 128  # the tensor products
    python benchmarks/bench_threads.py --threads 4 --p 256
    python benchmarks/bench_threads.py --integrate --p 256   # a whole sq.integrate, threads=1 vs 2

Run on an otherwise idle machine: more threads help only with idle cores.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import symquad as sq


def _point(p, ps, seed=0):
    rng = np.random.default_rng(seed)
    n = p + ps
    G = rng.standard_normal((n, n + 3))
    C = G @ G.T / (n + 3)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


def _time(k, args, repeats):
    k.rhs(*args)                        # warm (loading, first call)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = k.rhs(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def _integrate(p, ps, threads, t_max, form):
    """Wall time and solution of ``sq.integrate`` at width `p` on `threads` BLAS threads."""
    m = sq.Model(p, ps, 0.1)
    Q, rho, T = _point(p, ps)
    t0 = time.perf_counter()
    sol = sq.integrate(m, Q, rho, T, t_max, form=form, threads=threads)
    return time.perf_counter() - t0, sol


def main_integrate(args):
    """A whole integration (the RHS and the solver's own work) per thread count, alternating."""
    print(f"  {'p':>4s} {'form':7s} {'t_max':>6s} {'threads':>7s} {'wall s (best of ' + str(args.rounds) + ')':>18s} "
          f"{'times':>9s}  bit-identical to 1 thread")
    for p in args.p:
        sq.kernels(sq.Model(p, args.p_star, 0.1), args.form).rhs(*_point(p, args.p_star))  # load
        best, sols = {}, {}
        for _ in range(args.rounds):
            for n in (1, args.threads):       # alternating, so a burst of load hits both
                dt, sol = _integrate(p, args.p_star, n, args.t_max, args.form)
                best[n] = min(best.get(n, float("inf")), dt)
                sols[n] = sol
        for n in (1, args.threads):
            same = (np.array_equal(sols[n].t, sols[1].t) and np.array_equal(sols[n].Q, sols[1].Q)
                    and np.array_equal(sols[n].rho, sols[1].rho))
            print(f"  {p:4d} {args.form or sq.kernels(sq.Model(p, args.p_star, 0.1)).form:7s} "
                  f"{args.t_max:6g} {n:7d} {best[n]:18.2f} {len(sols[n].t):9d}  {same}")
        print(f"  speed-up {args.threads} threads vs 1: {best[1] / best[args.threads]:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--p", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--p-star", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--form", default=None, choices=["matrix", "tensor"],
                    help="kernel form (default: the model's default, matrix for z**2)")
    ap.add_argument("--integrate", action="store_true",
                    help="time a whole sq.integrate(threads=1 vs --threads) instead of one RHS")
    ap.add_argument("--t-max", type=float, default=2.0, help="--integrate: final time")
    ap.add_argument("--rounds", type=int, default=2, help="--integrate: alternating rounds")
    args = ap.parse_args()
    print(f"cores: {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"load average {os.getloadavg()[0]:.2f}")
    if args.integrate:
        main_integrate(args)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        return
    print(f"  {'p':>4s} {'form':7s} {'1 thread ms':>12s} {f'{args.threads} threads ms':>13s} "
          f"{'speed-up':>9s}  bit-identical")
    for p in args.p:
        m = sq.Model(p, args.p_star, 0.1)
        point = _point(p, args.p_star)
        one, out1 = _time(sq.kernels(m, args.form, threads=1), point, args.repeats)
        many, outn = _time(sq.kernels(m, args.form, threads=args.threads), point, args.repeats)
        same = all(np.array_equal(a, b) for a, b in zip(out1, outn))
        print(f"  {p:4d} {args.form or sq.kernels(m).form:7s} {1e3 * one:12.2f} {1e3 * many:13.2f} "
              f"{one / many:8.2f}x  {same}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
