"""Cost of one unit of time ``t`` for the order-parameter SDE and the exact reduced simulator.

``simulate(method="sde")`` integrates ``dX = f dt + √(D/N) dB`` with a step set by the
drift (:mod:`symquad.numeric.sde`), so its cost per unit of time does not depend on
``N``; the reduced simulator makes ``N`` SGD steps per unit of time.  For each ``N``
the table reports the wall-clock seconds per unit of time of both (``R`` replicas,
the plateau of a random start, ``t`` in ``[0, --t-max]``).  The reduced simulator is
timed only where that takes at most ``--max-seconds``; beyond, its cost is
extrapolated linearly in ``N`` from the largest timed ``N`` and marked ``*``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_sde.py                 # N = 1e3 ... 1e9
    python benchmarks/bench_sde.py --quick
    python benchmarks/bench_sde.py --p 8 --p-star 2 --replicas 64
    python benchmarks/bench_sde.py --activation "z**2 + z**3/3" --ns 1e3,1e4,1e6 --t-max 1
"""

from __future__ import annotations

import time

import symquad as sq
from symquad.entry import ArgumentParser


def _per_unit_time(model, N, R, method, t_max):
    sq.simulate(model, N=N, t_max=min(t_max, 1.0), replicas=R, seed=0, method=method,
                t_eval=[0.0])                                   # warm-up (compilation)
    t0 = time.perf_counter()
    run = sq.simulate(model, N=N, t_max=t_max, replicas=R, seed=1, method=method,
                      t_eval=[0.0, t_max])
    return (time.perf_counter() - t0) / t_max, getattr(run, "sde_steps", None)


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--t-max", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="largest run of the reduced simulator that is timed")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--activation", default="z**2")
    parser.add_argument("--ns", default=None, help="comma-separated N (e.g. 1e3,1e4,1e6)")
    args = parser.parse_args(argv)
    if args.p < 1 or args.p_star < 1 or args.replicas < 1 or not args.t_max > 0:
        parser.error("p, p-star, replicas must be >= 1 and t-max > 0")
    Ns = [10**3, 10**4, 10**5] if args.quick else [10**k for k in range(3, 10)]
    if args.ns:
        Ns = [int(float(x)) for x in args.ns.split(",")]
    t_max = 1.0 if args.quick else args.t_max
    model = sq.Model(args.p, args.p_star, args.lr, activation=args.activation)
    print(f"{model.describe()}, {args.replicas} replicas, t in [0, {t_max}]")
    print(f"{'N':>12} {'SDE s/unit t':>14} {'SDE steps':>10} {'reduced s/unit t':>18}")
    reduced_rate = None                     # seconds per (unit of time · N)
    for N in Ns:
        sde, steps = _per_unit_time(model, N, args.replicas, "sde", t_max)
        if reduced_rate is None or reduced_rate * N * t_max <= args.max_seconds:
            red, _ = _per_unit_time(model, N, args.replicas, "reduced",
                                    min(t_max, max(1.0 / N, args.max_seconds / 10 / max(
                                        reduced_rate or 0, 1e-12) / N)))
            reduced_rate = red / N
            red_text = f"{red:18.3g}"
        else:
            red_text = f"{reduced_rate * N:17.3g}*"
        print(f"{N:12d} {sde:14.3g} {steps:10d} {red_text}", flush=True)
    print("* extrapolated linearly in N from the largest timed N")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
