"""Steps per second of the full and the reduced SGD simulators, side by side.

For every input dimension N and replica count R, both simulators of
:func:`symquad.simulate` run on the same model for enough steps to take about
``--min-time`` seconds, and the table reports replica-steps per second (one
replica-step = one SGD step of one replica), the speed-up of the reduced over
the full simulator, and the cost of the reduced simulator relative to its
random-number floor: drawing the ``p + p*`` normals and the one chi-square
(``N − p − p*`` degrees of freedom) that the exact law of a step needs, with
numpy, in exactly the batch shape the simulator draws them
(``(chunk, R, p+p*)`` and ``(chunk, R)``).  Everything is single-threaded
(the reduced kernel runs replicas in SIMD lanes, not threads).  The full
simulator is skipped where its weights would exceed ``--max-full-gib``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_simulators.py   # N = 1e3, 1e4, 1e5; R = 1, 16, 64
    python benchmarks/bench_simulators.py --quick             # a few seconds
    python benchmarks/bench_simulators.py --N 10000 --replicas 64

The machine load matters; run on an otherwise idle machine for stable numbers.
The first run compiles the numba kernels (cached on disk afterwards); a
warm-up call keeps that out of the timings.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

import symquad as sq
from symquad.entry import ArgumentParser
from symquad.numeric import simulate as _sim
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


def _time_rng(model, R, N, min_time):
    """Replica-steps per second of drawing what the reduced simulator draws per step.

    ``p + p*`` normals and one ``χ²_{N−p−p*}`` per replica-step, in the
    simulator's chunk shape (:func:`symquad.numeric.simulate._reduced_chunk`).
    """
    rng = np.random.default_rng(0)
    k = min(model.p + model.p_star, N)
    chunk = _sim._reduced_chunk(R, k)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        rng.standard_normal((chunk, R, k))
        if N > k:
            rng.chisquare(float(N - k), size=(chunk, R))
        n += chunk
    return n * R / (time.perf_counter() - t0)


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--N", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.5,
                        help="seconds per measurement (approximately)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved measurements per cell; the best of each is kept")
    parser.add_argument("--max-full-gib", type=float, default=2.0,
                        help="skip the full simulator above this weight memory")
    parser.add_argument("--quick", action="store_true",
                        help="N = 1e3, 1e4; R = 1, 64; 0.3 s per measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.N, args.replicas, args.min_time, args.rounds = [1000, 10000], [1, 64], 0.3, 1
    import numba
    model = sq.Model(p=args.p, p_star=args.p_star, lr=0.05)
    print(f"model: {model}")
    print(f"numpy {np.__version__}, numba {numba.__version__}, python {sys.version.split()[0]}")
    # warm-up: compile (or load from the cache) every kernel outside the timings
    for R in sorted(set(args.replicas) | {1, 4}):
        for method in ("reduced", "full"):
            simulate(model, 100, 0.2, R, 0, method, None, None, None, [0.0])
    head = (f"{'N':>7} {'R':>4} {'full rs/s':>10} {'reduced rs/s':>13} {'red/full':>9} "
            f"{'floor rs/s':>11} {'cost/floor':>11}")
    print(head)
    print("-" * len(head))
    rows = []
    for N in args.N:
        for R in args.replicas:
            # best of `rounds` interleaved measurements: on a shared machine the
            # load changes between them, and the ratio needs both at their best
            red = rng = 0.0
            for _ in range(args.rounds):
                red = max(red, _time_simulator(model, N, R, "reduced", args.min_time, 10**7)[0])
                rng = max(rng, _time_rng(model, R, N, args.min_time))
            gib = 8 * R * (model.p + 2) * N / 2**30
            if gib <= args.max_full_gib:
                full, _ = _time_simulator(model, N, R, "full", args.min_time, 10**6)
                speed = red / full
            else:
                full, speed = math.nan, math.nan
            rows.append((N, R, full, red, speed, rng))
            print(f"{N:>7} {R:>4} {full:>10.4g} {red:>13.4g} {speed:>9.4g} {rng:>11.4g} "
                  f"{rng / red:>11.3g}", flush=True)
    print("\nrs/s = replica-steps per second; red/full = reduced over full per\n"
          "replica-step; cost/floor = time of a reduced replica-step / time to draw its\n"
          "p+p* normals and one chi-square in the simulator's batch shape.")
    return rows


if __name__ == "__main__":
    main()
