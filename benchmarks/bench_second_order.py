"""Cost of the O(1/N) correction of the mean against the ODE's and the LNA's, side by side.

For each model the table reports the wall-clock seconds of one trajectory (``t`` in
``[0, --t-max]``, ``--n-times`` recorded times, kernels already derived and loaded: one
warm-up call of each first): the ODE alone (``sq.integrate``), the linear-noise
approximation (``sq.fluctuations(..., second_order=False)``: ODE + ``Σ``) and the LNA with
the correction (``second_order=True``: ODE + ``Σ`` + ``c``) by the kernel route
(symquad.numeric.drift_derivatives: stencils of the drift kernels, every pair, any width),
and the ratios to the ODE; for the small polynomial models also the LNA with the
correction by the symbolic entry route (``form="entries"``, ``entries s``; its one-time
derivation per structure, ``derive s``, is cached on disk afterwards).  Each row is
measured with the BLAS threads as they are and again pinned to one thread
(threadpoolctl), in the same run.  ``--variant`` adds the issue-22 variant (z² student,
erf teacher, p = 6, p* = 2, trained readout, weight decay, label noise) at ``t ≤ 100``.

Usage::

    python benchmarks/bench_second_order.py
    python benchmarks/bench_second_order.py --quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import symquad as sq


def _cases(quick):
    I1, I2 = np.eye(1), np.eye(2)
    out = [("(2,1) noise", sq.Model(2, 1, 0.3, noise=0.5), np.eye(2) * 0.8,
            np.array([[.5], [.3]]), I1),
           ("(2,2) readout", sq.Model(2, 2, 0.3, noise=0.1, lr_readout=0.3), 0.8 * I2,
            np.array([[.5, .1], [.1, .5]]), I2)]
    if not quick:
        out.append(("(3,2) z^3-3z teacher, readout",
                    sq.Model(3, 2, 0.3, teacher_activation="z**3 - 3*z", lr_readout=0.2),
                    np.eye(3), np.array([[.6, .1], [.1, .6], [.3, .3]]), I2))
        out.append(("(2,2) erf, readout", sq.Model(2, 2, 1.0, noise=0.3, activation="erf",
                                                   lr_readout=0.3),
                    0.8 * I2, np.array([[.5, .1], [.1, .5]]), I2))
        out.append(("(4,2) relu", sq.Model(4, 2, 1.0, activation="relu"), np.eye(4),
                    np.array([[.5, 0], [0, .5], [.1, .4], [.4, .1]]), I2))
        out.append(("(8,2) z^2, noise", sq.Model(8, 2, 0.3, noise=0.5), np.eye(8),
                    0.4 * np.vstack([I2] * 4), I2))
    return out


def _variant():
    from symquad.studies.validation_starts import informed_start
    m = sq.Model(6, 2, 0.1, teacher_activation="erf", lr_readout=0.1, weight_decay=1e-3,
                 noise=0.1)
    return ("(6,2) z^2/erf variant", m, *informed_start(m), np.eye(2))


def _time(fn, repeat):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--t-max", type=float, default=6.0)
    parser.add_argument("--n-times", type=int, default=31)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--variant", action="store_true",
                        help="also the issue-22 variant at t <= 100 (minutes)")
    args = parser.parse_args(argv)
    if not args.t_max > 0 or args.n_times < 2 or args.repeat < 1:
        parser.error("t-max must be > 0, n-times >= 2, repeat >= 1")
    import threadpoolctl
    times = np.linspace(0, args.t_max, args.n_times)
    print(f"t in [0, {args.t_max}], {args.n_times} times, best of {args.repeat}")
    print(f"{'model':>32} {'threads':>8} {'ODE s':>8} {'LNA s':>8} {'LNA+c s':>8} "
          f"{'LNA/ODE':>8} {'LNA+c/ODE':>10} {'derive s':>9} {'entries s':>9}")
    cases = [(c, times, args.t_max) for c in _cases(args.quick)]
    if args.variant:
        cases.append((_variant(), np.linspace(0, 100.0, 41), 100.0))
    for (name, m, Q0, rho0, T), ts, t_max in cases:
        entries = m.is_polynomial and m.p + m.p_star <= 5
        derive = np.nan
        if entries:
            t0 = time.perf_counter()
            sq.kernels(m, form="entries").second_order(
                Q0, rho0, T, np.array([float(c) for c in m.readout]) if m.readout_trained
                else None)
            derive = time.perf_counter() - t0
            sq.fluctuations(m, Q0, rho0, T, 1000, ts[:2], second_order=True, form="entries")
        sq.fluctuations(m, Q0, rho0, T, 1000, ts[:2], second_order=True)       # warm-up
        for label, limit in (("default", None), ("1", 1)):
            with threadpoolctl.threadpool_limits(limits=limit):
                ode = _time(lambda: sq.integrate(m, Q0, rho0, T, t_max, t_eval=ts),
                            args.repeat)
                lna = _time(lambda: sq.fluctuations(m, Q0, rho0, T, 1000, ts,
                                                    second_order=False), args.repeat)
                full = _time(lambda: sq.fluctuations(m, Q0, rho0, T, 1000, ts,
                                                     second_order=True), args.repeat)
                ent = _time(lambda: sq.fluctuations(m, Q0, rho0, T, 1000, ts,
                                                    second_order=True, form="entries"),
                            args.repeat) if entries else np.nan
            print(f"{name:>32} {label:>8} {ode:8.3f} {lna:8.3f} {full:8.3f} "
                  f"{lna / ode:8.1f} {full / ode:10.1f} {derive:9.2f} {ent:9.3f}", flush=True)
            derive = np.nan
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
