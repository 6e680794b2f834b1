"""``symquad validate``: compare the ODE theory with Monte Carlo SGD.

With no arguments it runs :data:`symquad.spec.DEFAULT_MODEL` from a random
start (plateau and escape), prints a short table and writes the report folder
(``./symquad_report``: ``report.json``, ``summary.txt``, ``trajectories.npz``,
``risk.png``, ``overlaps.png``, ``escape.png``, ``fss.png``,
``invariant_drift.png``).  ``--quick`` is a
seconds-long version (small N, few replicas) for smoke tests.
"""

from __future__ import annotations

import argparse
import sys

# --quick: small enough for a test, still every stage (SGD, ODE, escape, FSS)
_QUICK = dict(N=200, replicas=8, fss_N=[50, 200, 800, 3200], fss_replicas=8, fss_t_max=4.0,
              n_times=61, invariant_N=(100, 400), invariant_replicas=4)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {value}")
    return value


def register(subparsers) -> None:
    """Add the ``validate`` sub-command."""
    from ..spec import DEFAULT_MODEL, LR_SCALINGS

    d = DEFAULT_MODEL
    ps = subparsers.add_parser(
        "validate",
        help="compare the ODE theory with SGD simulations (numbers + figures)",
        description="Run SGD (exact reduced simulator by default), integrate the ODE from the "
                    "realised initial overlaps of every replica, report the deviation before "
                    "and after the escape, the spread of escape times and the finite-size "
                    "scaling of the deviation (fitted exponent, theory -1/2).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ps.add_argument("--p", type=_positive_int, default=d.p, help="student width")
    ps.add_argument("--p-star", type=_positive_int, default=d.p_star, help="teacher width")
    ps.add_argument("--lr", type=_positive_float, default=d.lr, help="learning rate")
    ps.add_argument("--noise", type=float, default=d.noise, help="label-noise variance Δ >= 0")
    ps.add_argument("--lr-scaling", choices=LR_SCALINGS, default=d.lr_scaling,
                    help="'fixed': η = lr; 'width': η = lr·p")
    ps.add_argument("--N", type=_positive_int, default=2000, help="input dimension")
    ps.add_argument("--t-max", type=_positive_float, default=None,
                    help="final time steps/N (default: 2.5·log(N)/(2κ) from the plateau "
                         "growth rate κ for a random start, 10/η otherwise)")
    ps.add_argument("--replicas", type=_positive_int, default=64, help="SGD replicas (>= 2)")
    ps.add_argument("--seed", type=int, default=0, help="random seed (>= 0)")
    ps.add_argument("--start", choices=("random", "informed"), default="random",
                    help="random: w ~ N(0, I) (plateau, escape); informed: ρ(0) of order 1")
    ps.add_argument("--method", choices=("reduced", "full"), default="reduced",
                    help="SGD simulator (reduced: exact in law, cost independent of N)")
    ps.add_argument("--no-fss", action="store_true", help="skip the finite-size scaling")
    ps.add_argument("--no-invariant", action="store_true",
                    help="skip the finite-N drift study of the invariant S = ρ(ρᵀρ)^(-1/2)")
    ps.add_argument("--out", default="symquad_report", help="report folder")
    ps.add_argument("--quick", action="store_true",
                    help="seconds-long version (N=300, 8 replicas, small FSS) for tests")
    ps.set_defaults(func=run)


def run(args) -> int:
    """Execute ``symquad validate``; returns the exit status."""
    from ..numeric.errors import DivergenceError
    from ..spec import Model
    from ..studies.validation import validate

    try:
        model = Model(p=args.p, p_star=args.p_star, lr=args.lr, noise=args.noise,
                      lr_scaling=args.lr_scaling)
        kwargs = dict(N=args.N, t_max=args.t_max, replicas=args.replicas, start=args.start,
                      seed=args.seed, method=args.method, fss=not args.no_fss,
                      invariant=not args.no_invariant,
                      progress=sys.stderr.isatty())
        if args.quick:
            kwargs.update(_QUICK)
        report = validate(model, **kwargs)
    except (ValueError, TypeError) as exc:
        print(f"symquad validate: error: {exc}", file=sys.stderr)
        return 2
    except DivergenceError as exc:
        print(f"symquad validate: SGD diverged: {exc}", file=sys.stderr)
        return 3
    print(report.summary())
    paths = report.save(args.out)
    print(f"\nreport written to {args.out}/: " + ", ".join(
        sorted(p.split('/')[-1] for p in paths.values())))
    return 0
