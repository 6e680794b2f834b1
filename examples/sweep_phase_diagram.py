"""Phase diagram of the plateau over (learning rate, label noise), from a sweep.

Sweeps the built-in ``plateau`` task (fixed point ``ρ = 0, Q = qI`` of the full
ODE, η² term and noise included) over a grid of ``lr`` and ``noise`` for one
width, stores every point in ``OUT/store`` (a rerun recomputes nothing) and draws
heat maps of the growth rate κ of ρ (κ > 0: SGD escapes the plateau, with
escape time ≈ log N/(2κ)) and of the plateau risk.  Points where the plateau
does not exist (the step is too large) are error rows and blank cells.

    python examples/sweep_phase_diagram.py [--out DIR] [--p 4 --p-star 2] [--workers N]
                                           [--format png|pdf|svg]

Default ``--out``: ``./symquad_examples/sweep_phase_diagram``.  Measured: 96 points in
7.5 s serially on 2 cores shared with other jobs.
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "sweep_phase_diagram"


def main():
    ap = sq.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder (default ./{DEFAULT_OUT})")
    ap.add_argument("--p", type=int, default=4, help="student width (default 4)")
    ap.add_argument("--p-star", type=int, default=2, help="teacher width (default 2)")
    ap.add_argument("--workers", type=int, default=1, help="1: serial (default); N: Dask")
    ap.add_argument("--format", choices=("png", "pdf", "svg"), default="png",
                    help="figure file format (pdf, svg: vector; default png)")
    args = ap.parse_args()
    for name in ("p", "p_star", "workers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # errors (e.g. an unwritable --out) end as one line and exit status 2, no traceback
    return sq.run_main(run, args)


def run(args):
    """The sweep and its two heat maps."""
    start = time.perf_counter()
    out = Path(args.out)
    grid = {"p": [args.p], "p_star": [args.p_star],
            "lr": [round(x, 3) for x in np.linspace(0.05, 0.8, 16)],
            "noise": [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]}
    df = sq.sweep("plateau", grid, out / "store", workers=args.workers)
    print(df.attrs["sweep"].line())
    bad = df[df["status"] != "ok"]
    if len(bad):
        print(f"{len(bad)} points without a plateau, e.g. lr={bad['lr'].iloc[0]}, "
              f"noise={bad['noise'].iloc[0]}: {bad['error'].iloc[0]}")
    (out / "figures").mkdir(parents=True, exist_ok=True)
    title = (f"plateau growth rate κ of ρ; p = {args.p}, p* = {args.p_star}, σ = z², "
             "η = lr (lr scaling 'fixed')")
    sq.save_figure(sq.sweep_heatmap_figure(df, "lr", "noise", "rate", center=0.0, title=title),
                   out / "figures" / f"plateau_rate_lr_noise.{args.format}")
    sq.save_figure(sq.sweep_heatmap_figure(df, "lr", "noise", "risk", log=True,
                                           title="plateau risk (log10)"),
                   out / "figures" / f"plateau_risk_lr_noise.{args.format}")
    print("figures in", (out / "figures").resolve())
    print(f"runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
