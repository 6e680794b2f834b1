"""``symquad validate``: compare the ODE theory with Monte Carlo SGD (or your own data).

With no arguments it runs :data:`symquad.spec.DEFAULT_MODEL` from a random
start (plateau and escape), prints a short table ending with a PASS/FAIL
verdict and writes the report folder (``./symquad_report``: ``report.json``,
``summary.txt``, ``trajectories.npz``, ``risk.png``, ``overlaps.png``,
``escape.png``, ``fss.png``, ``invariant_drift.png``, ``invariant_study.npz``).

``--data FILE.npz`` compares trajectories from elsewhere instead of
simulating (:func:`symquad.compare`): keys ``t`` (n,), ``Q`` (replicas, n, p, p)
or (n, p, p), ``rho`` (replicas, n, p, p*) or (n, p, p*), optional ``T``; the
model comes from ``--p --p-star --lr --noise --lr-scaling``.

``--quick`` is a short version (small N, few replicas) for smoke
tests; explicit ``--N`` / ``--replicas`` win over it.

The destination ``--out`` is checked before any computation.  Exit status:
0 PASS, 1 FAIL, 2 bad arguments or destination, 3 SGD diverged,
4 INCONCLUSIVE (too little data to test the criteria).
"""

from __future__ import annotations

import argparse
import os
import sys

# --quick: small enough for a test, still every stage (SGD, ODE, escape, FSS, drift)
_QUICK = dict(N=400, replicas=32, fss_N=[50, 200, 800, 3200], fss_replicas=16, fss_t_max=4.0,
              n_times=121, invariant_N=(100, 400), invariant_replicas=4)
# flags that describe a simulation, meaningless with --data
_SIMULATION_FLAGS = ("N", "t_max", "replicas", "seed", "start", "method", "quick")
_DATA_KEYS = ("t", "Q", "rho", "T")


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
        help="compare the ODE theory with SGD simulations or your data (verdict + figures)",
        description="Run SGD (exact reduced simulator by default), integrate the ODE from the "
                    "realised initial overlaps of every replica, report the deviation before "
                    "and after the escape, the spread of escape times and the finite-size "
                    "scaling of the deviation (fitted exponent, theory -1/2), and decide "
                    "PASS/FAIL. With --data, compare your own trajectories instead. Exit "
                    "status: 0 PASS, 1 FAIL, 2 bad arguments, 3 SGD diverged, 4 INCONCLUSIVE.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ps.add_argument("--p", type=_positive_int, default=d.p, help="student width")
    ps.add_argument("--p-star", type=_positive_int, default=d.p_star, help="teacher width")
    ps.add_argument("--lr", type=_positive_float, default=d.lr, help="learning rate")
    ps.add_argument("--noise", type=float, default=d.noise, help="label-noise variance Δ >= 0")
    ps.add_argument("--activation", default=d.activation_str,
                    help="polynomial activation in z, e.g. 'z**3 - 3*z' (read by a restricted "
                         "parser, never evaluated; for activations other than c z**2 the "
                         "default start is informed and the escape analysis is skipped)")
    ps.add_argument("--lr-scaling", choices=LR_SCALINGS, default=d.lr_scaling,
                    help="'fixed': η = lr; 'width': η = lr·p")
    ps.add_argument("--N", type=_positive_int, default=None,
                    help="input dimension (default 2000; 400 with --quick)")
    ps.add_argument("--t-max", type=_positive_float, default=None,
                    help="final time steps/N (default: 2.5·log(N)/(2κ) from the plateau "
                         "growth rate κ for a random start, 10/η otherwise)")
    ps.add_argument("--replicas", type=_positive_int, default=None,
                    help="SGD replicas, >= 2 (default 64; 32 with --quick)")
    ps.add_argument("--seed", type=int, default=None, help="random seed >= 0 (default 0)")
    ps.add_argument("--start", choices=("random", "informed"), default=None,
                    help="random: w ~ N(0, I) (plateau, escape); informed: ρ(0) of order 1 "
                         "(default: random)")
    ps.add_argument("--method", choices=("reduced", "full"), default=None,
                    help="SGD simulator (reduced: exact in law, cost independent of N; "
                         "default reduced)")
    ps.add_argument("--no-fss", action="store_true", help="skip the finite-size scaling")
    ps.add_argument("--no-invariant", action="store_true",
                    help="skip the finite-N drift study of the invariant S = ρ(ρᵀρ)^(-1/2)")
    ps.add_argument("--no-whole-run", action="store_true",
                    help="skip the whole-run criteria (SGD vs the order-parameter SDE from "
                         "the same starts, replica spread vs the linear-noise prediction)")
    ps.add_argument("--workers", type=_positive_int, default=1,
                    help="processes: > 1 runs the finite-size scaling and the drift study "
                         "in worker processes beside the main comparison (pays on idle cores)")
    ps.add_argument("--data", default=None, metavar="FILE.npz",
                    help="compare trajectories from FILE.npz (keys t, Q, rho, optional T) "
                         "instead of simulating; not with the simulation flags")
    ps.add_argument("--out", default="symquad_report",
                    help="report folder (replaced whole; checked before computing)")
    ps.add_argument("--quick", action="store_true",
                    help="short version (N=400, 32 replicas, small FSS and drift "
                         "study) for smoke tests; explicit --N/--replicas win")
    ps.set_defaults(func=run)


def _fail(message) -> int:
    print(f"symquad validate: error: {message}", file=sys.stderr)
    return 2


def load_data(path) -> dict:
    """Arrays of a ``--data`` file: keys t, Q, rho and optionally T, nothing else.

    Read with ``allow_pickle=False`` (an npz holding Python objects is
    refused, never unpickled).
    """
    import numpy as np

    if not os.path.isfile(path):
        raise ValueError(f"--data {path!r}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError(f"--data {path!r} is a single .npy array, not an .npz with keys "
                                 f"t, Q, rho")
            extra = sorted(set(data.files) - set(_DATA_KEYS))
            if extra:
                raise ValueError(f"--data {path!r} holds unexpected array(s) {extra}; allowed "
                                 f"keys: t, Q, rho, T (optional)")
            missing = [k for k in ("t", "Q", "rho") if k not in data.files]
            if missing:
                raise ValueError(f"--data {path!r} lacks the array(s) {missing} (keys: t, Q, "
                                 f"rho, optional T)")
            return {k: data[k] for k in data.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise ValueError(f"--data {path!r} holds Python objects (pickled arrays); only "
                             f"numeric arrays are read") from None
        raise
    except (OSError, EOFError) as exc:
        raise ValueError(f"--data {path!r} is not a readable .npz file ({exc})") from None


def _simulation_kwargs(args) -> dict:
    """validate() keyword arguments; explicit flags win over --quick."""
    kwargs = dict(N=2000, replicas=64)
    if args.quick:
        kwargs.update(_QUICK)
    for name in ("N", "replicas", "t_max", "seed", "start", "method"):
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    kwargs.setdefault("method", "reduced")
    kwargs.setdefault("seed", 0)
    kwargs.update(fss=not args.no_fss, invariant=not args.no_invariant, workers=args.workers,
                  progress=sys.stderr.isatty(), whole_run=not args.no_whole_run)
    return kwargs


def run(args) -> int:
    """Execute ``symquad validate``; returns the exit status."""
    from ..numeric.errors import DivergenceError
    from ..spec import Model
    from ..studies.report_io import check_destination
    from ..studies.validation import compare, validate

    try:
        # everything that can be refused is refused before the computation
        check_destination(args.out, name="--out")
        model = Model(p=args.p, p_star=args.p_star, lr=args.lr, noise=args.noise,
                      lr_scaling=args.lr_scaling, activation=args.activation)
        if args.data is not None:
            given = [f"--{n.replace('_', '-')}" for n in _SIMULATION_FLAGS
                     if getattr(args, n) not in (None, False)]
            if given or args.no_fss or args.no_invariant:
                given += ["--no-fss"] * args.no_fss + ["--no-invariant"] * args.no_invariant
                return _fail(f"--data compares given trajectories; {', '.join(given)} "
                             f"describe a simulation and cannot be combined with it")
            data = load_data(args.data)
            report = compare(model, data["t"], data["Q"], data["rho"], data.get("T"),
                             progress=sys.stderr.isatty())
        else:
            if args.seed is not None and args.seed < 0:
                return _fail(f"--seed must be >= 0, got {args.seed}")
            report = validate(model, **_simulation_kwargs(args))
    except (ValueError, TypeError) as exc:
        return _fail(exc)
    except DivergenceError as exc:
        print(f"symquad validate: SGD diverged: {exc}", file=sys.stderr)
        return 3
    print(report.summary())
    try:
        paths = report.save(args.out)
    except (ValueError, OSError) as exc:
        # the destination changed during the computation (checked before it)
        return _fail(f"could not write the report to {args.out!r}: {exc}")
    print(f"\nreport written to {args.out}/: " + ", ".join(
        sorted(os.path.basename(p) for p in paths.values())))
    return {"PASS": 0, "FAIL": 1}.get(report.verdict, 4)
