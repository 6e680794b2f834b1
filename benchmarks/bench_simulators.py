"""Steps per second of the full and the reduced SGD simulators, side by side.

For every input dimension N and replica count R, both simulators of
:func:`symquad.simulate` run on the same model for enough steps to take about
``--min-time`` seconds, and the table reports replica-steps per second (one
replica-step = one SGD step of one replica), the speed-up of the reduced over
the full simulator, and the cost of the reduced simulator relative to drawing
the ``p + p* + 1`` random numbers a step needs (p + p* normals and one
chi-square, drawn in blocks as a simulator would).  The full simulator is
skipped where its weights would exceed ``--max-full-gib``.

Usage::

    python benchmarks/bench_simulators.py                  # N = 1e3, 1e4, 1e5; R = 1 ... 1000
    python benchmarks/bench_simulators.py --quick          # a few seconds
    python benchmarks/bench_simulators.py --N 10000 --replicas 64

The machine load matters (numpy is single-threaded for most of this work); run
on an otherwise idle machine for stable numbers.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import symquad as sq
from symquad.numeric.simulate import simulate


def _time_simulator(model, N, R, method, min_time, max_steps):
    """Replica-steps per second (best of a growing number of steps)."""
    steps = 16
    while True:
        t0 = time.perf_counter()
        simulate(model, N=N, t_max=steps / N, replicas=R, seed=0, method=method,
                 t_eval=[0.0])
        dt = time.perf_counter() - t0
        if dt >= min_time or steps >= max_steps:
            return steps * R / dt, steps
        steps = int(min(max_steps, max(2 * steps, steps * 1.2 * min_time / max(dt, 1e-6))))


def _time_rng(model, R, N, min_time, block=16):
    """Replica-steps per second of drawing p + p* normals and one chi-square per step."""
    rng = np.random.default_rng(0)
    d = model.p + model.p_star
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        rng.standard_normal((block, R, d))
        rng.chisquare(float(N), size=(block, R))
        n += block
    return n * R / (time.perf_counter() - t0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--N", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 8, 64, 1000])
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="seconds per measurement (approximately)")
    parser.add_argument("--max-full-gib", type=float, default=2.0,
                        help="skip the full simulator above this weight memory")
    parser.add_argument("--quick", action="store_true",
                        help="N = 1e3, 1e4; R = 1, 64; 0.3 s per measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.N, args.replicas, args.min_time = [1000, 10000], [1, 64], 0.3
    model = sq.Model(p=args.p, p_star=args.p_star, lr=0.05)
    print(f"model: {model}")
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}")
    head = (f"{'N':>8} {'R':>6} {'full rs/s':>12} {'reduced rs/s':>13} {'speed-up':>9} "
            f"{'rng rs/s':>12} {'red/rng cost':>12} {'reduced steps/s':>15}")
    print(head)
    print("-" * len(head))
    rows = []
    for N in args.N:
        for R in args.replicas:
            red, _ = _time_simulator(model, N, R, "reduced", args.min_time, 10**7)
            gib = 8 * R * (model.p + 2) * N / 2**30
            if gib <= args.max_full_gib:
                full, _ = _time_simulator(model, N, R, "full", args.min_time, 10**6)
                speed = red / full
            else:
                full, speed = math.nan, math.nan
            rng = _time_rng(model, R, N, min(args.min_time, 0.5))
            rows.append((N, R, full, red, speed, rng))
            print(f"{N:>8} {R:>6} {full:>12.4g} {red:>13.4g} {speed:>9.4g} {rng:>12.4g} "
                  f"{rng / red:>12.3g} {red / R:>15.4g}", flush=True)
    print("\nrs/s = replica-steps per second; speed-up = reduced/full per replica-step;\n"
          "red/rng cost = time of a reduced replica-step / time to draw its p+p*+1 random "
          "numbers;\nreduced steps/s = steps per second of the whole batch of R replicas.")
    return rows


if __name__ == "__main__":
    main()
