"""Cost of one unit of time ``t`` for the order-parameter SDE and the exact reduced simulator.

``simulate(method="sde")`` integrates ``dX = f dt + √(D/N) dB`` with a step set by the
drift (:mod:`symquad.numeric.sde`), so its cost per unit of time does not depend on
``N``; the reduced simulator makes ``N`` SGD steps per unit of time.  For each model
(activation pair and widths) and each ``N`` the table reports, side by side in one run,
the wall-clock seconds per unit of time of both (``R`` replicas from the random start,
``t`` in ``[0, --t-max]``), with the library's default threads and pinned to one thread
(threadpoolctl: BLAS and OpenMP), and their ratio.  The SDE runs with its default noise
(:func:`symquad.numeric.sde_noise.default_noise`: Gaussian with the exact ``D`` where
``D`` is cheap, sampled increments elsewhere) unless ``--noise`` says otherwise; its
step count is printed.  The reduced simulator's cost per step is fixed, so it is timed
on ``[0, t_red]`` with ``t_red = min(t_max, --max-seconds / (its estimated seconds per
unit time))`` and reported per unit of time (``t_red`` in the last column).

Usage::

    python benchmarks/bench_sde.py                          # the issue-26 table (minutes)
    python benchmarks/bench_sde.py --quick
    python benchmarks/bench_sde.py --models "z**2:4:2,relu:4:2,erf|relu:4:2" --ns 1e3,1e4
    python benchmarks/bench_sde.py --noise sampled --models "z**2:8:2"

A model is ``activation:p:p_star`` or ``activation|teacher_activation:p:p_star``.
"""

from __future__ import annotations

import time

import symquad as sq
from symquad.entry import ArgumentParser

#: The issue-26 table: z² and z² + z³/3 at (4, 2) and (8, 2); erf, ReLU and a mixed pair.
DEFAULT_MODELS = ("z**2:4:2,z**2:8:2,z**2 + z**3/3:4:2,z**2 + z**3/3:8:2,erf:4:2,relu:4:2,"
                  "erf|relu:4:2,relu:8:2")


def _model(text, lr):
    try:
        acts, p, ps = text.rsplit(":", 2)
        student, _, teacher = acts.partition("|")
        extra = dict(teacher_activation=teacher) if teacher else {}
        return sq.Model(int(p), int(ps), lr, activation=student, **extra)
    except ValueError as exc:
        raise SystemExit(f"--models: {text!r} is not activation[|teacher]:p:p_star ({exc})")


def _seconds_per_unit(model, N, R, method, t_max, noise):
    kw = dict(noise=noise) if method == "sde" else {}
    t0 = time.perf_counter()
    run = sq.simulate(model, N=N, t_max=t_max, replicas=R, seed=1, method=method,
                      t_eval=[0.0, t_max], on_divergence="stop", **kw)
    return (time.perf_counter() - t0) / t_max, getattr(run, "sde_steps", None), \
        getattr(run, "sde_noise", "")


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="comma-separated activation[|teacher]:p:p_star")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--t-max", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=5.0,
                        help="largest run of the reduced simulator per row and thread setting")
    parser.add_argument("--noise", choices=("gaussian", "sampled"), default=None)
    parser.add_argument("--quick", action="store_true", help="z**2 and relu at (4, 2), N <= 1e4")
    parser.add_argument("--ns", default="1e3,1e4,1e6", help="comma-separated N")
    args = parser.parse_args(argv)
    if args.replicas < 1 or not args.t_max > 0 or not args.max_seconds > 0:
        parser.error("replicas must be >= 1, t-max and max-seconds > 0")
    import threadpoolctl
    Ns = [int(float(x)) for x in args.ns.split(",")]
    models = [_model(m, args.lr) for m in args.models.split(",")]
    if args.quick:
        Ns = [10**3, 10**4]
        models = [_model("z**2:4:2", args.lr), _model("relu:4:2", args.lr)]
    R, t_max = args.replicas, args.t_max
    print(f"{R} replicas, random start, t in [0, {t_max}], lr {args.lr}; seconds per unit "
          f"of time; 'pinned' = threadpoolctl limit 1")
    print(f"{'model':<28} {'N':>8} {'noise':>8} {'steps':>6} {'SDE':>8} {'SDE pin':>8} "
          f"{'reduced':>8} {'red pin':>8} {'SDE/red':>8} {'pinned':>8} {'t_red':>7}")
    for model in models:
        label = (f"{model.activation_str}" + (f"/{model.teacher_activation_str}"
                                              if model.teacher_activation != model.activation
                                              else "") + f" ({model.p},{model.p_star})")
        # warm-up: kernels, numba compilation, the first D (not timed); with the timed
        # runs' replica count, so that the same compiled paths (a parallel loop above a
        # batch size) are loaded here -- loading one from numba's cache took ~2 s, which
        # the first timed row (N = 1e3) carried before
        sq.simulate(model, N=1000, t_max=0.05, replicas=R, seed=0, method="sde",
                    t_eval=[0.0, 0.05], noise=args.noise, on_divergence="stop")
        sq.simulate(model, N=1000, t_max=0.01, replicas=2, seed=0, t_eval=[0.0, 0.01])
        rate = None                              # reduced seconds per (unit time · N)
        for N in Ns:
            row = {}
            for name, limit in (("default", None), ("pinned", 1)):
                with threadpoolctl.threadpool_limits(limits=limit):
                    sde, steps, noise = _seconds_per_unit(model, N, R, "sde", t_max,
                                                          args.noise)
                    t_red = t_max if rate is None else min(
                        t_max, max(2.0 / N, args.max_seconds / (rate * N)))
                    red, _, _ = _seconds_per_unit(model, N, R, "reduced", t_red, None)
                    rate = red / N
                row[name] = (sde, red)
            (s0, r0), (s1, r1) = row["default"], row["pinned"]
            print(f"{label:<28} {N:>8.0e} {noise:>8} {steps:>6} {s0:>8.3g} {s1:>8.3g} "
                  f"{r0:>8.3g} {r1:>8.3g} {s0 / r0:>8.3g} {s1 / r1:>8.3g} {t_red:>7.3g}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
