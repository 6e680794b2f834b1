"""Escape from the plateau: prediction vs ODE vs SGD over p*, p, N and both lr conventions.

A sweep (``sq.sweep``) of the built-in ``escape`` task.  For every configuration
it measures the median escape time (first time the risk falls halfway from the
plateau risk to the minimum risk)

* predicted by the escape law (for the ODE from a random start, and for SGD
  including the noise seeding of ρ),
* of the ODE integrated from realised random starts (exact law of Q(0), ρ(0)),
* of SGD (reduced simulator, many replicas; the "sgd" part only),

then fits ``t_esc = log(N)/(2κ) + c/κ`` to the medians over N (rate κ and
log-prefactor c) and compares with the plateau rate.  Every finished point is
stored at once in ``OUT/store`` (Parquet), so an interrupted run resumes where
it stopped, and a rerun recomputes nothing.  Figures go to ``OUT/figures``.

Usage::

    python examples/escape_sweep.py --part ode              # prediction + ODE grid
    python examples/escape_sweep.py --part sgd              # SGD grid
    python examples/escape_sweep.py --part all --quick      # a small version of both
    python examples/escape_sweep.py --plot                  # figures from what is stored
    python examples/escape_sweep.py --part sgd --scheduler tcp://host:8786   # on a cluster

Options ``--out DIR`` (default ``./symquad_examples/escape_sweep``), ``--format
png|pdf|svg`` (figures; default png), ``--workers N``
(1: serial; default: a local Dask cluster with one process per core).  Measured with
``--part all --quick --workers 2`` on 2 cores shared with other jobs: 12 min (56 points).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "escape_sweep"

LR = {"width": 0.1, "fixed": 0.1}   # η = 0.1 p  or  η = 0.1 (DEFAULT_MODEL lr)


def ode_grids(quick):
    """One product grid per (convention, p*): p = p*..8, N = 1e2..1e5, no SGD."""
    for conv in ("width", "fixed"):
        for k in ((1, 2) if quick else (1, 2, 3)):
            ps = sorted({k, 4, 8}) if quick else list(range(k, 9))
            yield {"p": ps, "p_star": [k], "lr": [LR[conv]], "lr_scaling": [conv],
                   "N": [100, 1000, 10_000, 100_000], "replicas": [48 if quick else 96],
                   "seed": [0], "sgd": [False]}


def sgd_grids(quick):
    """SGD product grids: width convention at N = 1e2, 1e3 (and 1e4 for a few p); fixed at N = 1e2, 1e3."""
    for k in ((1, 2) if quick else (1, 2, 3)):
        ps = sorted({k, 8}) if quick else list(range(k, 9))
        yield {"p": ps, "p_star": [k], "lr": [LR["width"]], "lr_scaling": ["width"],
               "N": [100, 1000], "replicas": [96], "seed": [0], "sgd": [True]}
        if not quick:
            yield {"p": sorted({k, 4, 8}), "p_star": [k], "lr": [LR["width"]],
                   "lr_scaling": ["width"], "N": [10_000], "replicas": [48], "seed": [0],
                   "sgd": [True]}
            yield {"p": sorted({k, 4, 8}), "p_star": [k], "lr": [LR["fixed"]],
                   "lr_scaling": ["fixed"], "N": [100, 1000], "replicas": [96], "seed": [0],
                   "sgd": [True]}


def run(grids, store, executor):
    for grid in grids:
        df = sq.sweep("escape", grid, store, progress=True, **executor)
        print(df.attrs["sweep"].line(), flush=True)
        bad = df[df["status"] != "ok"]
        for _, row in bad.iterrows():
            print(f"  error at p={row['p']}, p*={row['p_star']}, N={row['N']}: {row['error']}")


def plot(store, fig_dir, fmt="png"):
    df = sq.load_sweep(store)
    print(sq.escape_sweep_summary(df))
    fig_dir.mkdir(parents=True, exist_ok=True)
    for name, fig in sq.escape_sweep_figures(df, lr=LR).items():
        sq.save_figure(fig, fig_dir / f"{name}.{fmt}")
    print("figures in", fig_dir.resolve())


def main():
    ap = sq.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("ode", "sgd", "all"))
    ap.add_argument("--quick", action="store_true", help="fewer configurations and replicas")
    ap.add_argument("--plot", action="store_true", help="figures from the stored results")
    ap.add_argument("--format", choices=("png", "pdf", "svg"), default="png",
                    help="figure file format (pdf, svg: vector; default png)")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder: store/ and figures/ (default ./{DEFAULT_OUT})")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, help="1: serial; N: local Dask cluster")
    where.add_argument("--scheduler", help="address of a running dask scheduler")
    args = ap.parse_args()
    start = time.perf_counter()
    out = Path(args.out)
    store = out / ("store_quick" if args.quick else "store")
    return sq.run_main(compute, args, store, out, start)


def compute(args, store, out, start):
    """The sweeps (one Dask client for all the grids) and the figures."""
    with contextlib.ExitStack() as stack:
        executor = {"workers": 1}
        if args.part and args.workers != 1:
            # a scheduler, or one local cluster for all the grids (one process per core)
            executor = {"client": stack.enter_context(
                sq.dask_client(args.scheduler, workers=args.workers))}
        if args.part in ("ode", "all"):
            run(ode_grids(args.quick), store, executor)
        if args.part in ("sgd", "all"):
            run(sgd_grids(args.quick), store, executor)
    if args.plot or args.part is not None:
        plot(store, out / ("figures_quick" if args.quick else "figures"), args.format)
    print(f"runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
