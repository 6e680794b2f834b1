"""Learning curves on power-law input spectra: exponents against alpha and L, escape of z^2.

Two sweeps (``sq.sweep``) of the studies in ``symquad.studies.power_law``
(docs/model.md §1a, issue 24):

* ``curves``: the linear student and teacher (sigma = z, p = p* = 1, lr 0.5, start
  w = 0) on the L-block truncation of s_j ~ j^-alpha with the teacher's power
  t_j ~ j^-beta (``sq.power_law_spectrum``); the exponent gamma of the risk's decay,
  eps ~ t^-gamma, fitted on u = 2 eta s_1 t in [10, 1000], for alpha = 1.5, 2, 3,
  beta = 0, 1 and L = 4 ... 256, from the derived block ODE and from the linear
  model's exact solution (matrix exponential), next to gamma_inf = (alpha + beta - 1)/alpha;
* ``escape``: the quadratic network (sigma = z^2, p = 2, p* = 1, lr 0.1) from random
  starts at N = 1000: plateau risk, growth rate kappa of rho at the plateau and escape
  times of the ODE (32 starts) and of SGD (exact reduced simulator, 16 replicas, L = 2).

Every finished point is stored in ``OUT/store`` (so a rerun recomputes nothing);
figures go to ``--figures`` (default ``OUT/figures``) and the markdown tables to
``--table`` (default ``OUT/power_law_table.md``).

Usage::

    python examples/power_law_scaling.py --part all
    python examples/power_law_scaling.py --part all --quick     # a small version
    python examples/power_law_scaling.py --plot                 # figures, tables from the store

Options ``--out DIR`` (default ``./symquad_examples/power_law``), ``--format
png|pdf|svg``.  Timing: ``docs/power-law.md``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "power_law"
WINDOW = (10.0, 1000.0)
ESCAPE_N = 1000


def curve_grid(quick):
    return {"alpha": [2.0] if quick else [1.5, 2.0, 3.0],
            "teacher_exponent": [0.0] if quick else [0.0, 1.0],
            "L": [4, 16, 64] if quick else [4, 8, 16, 32, 64, 128, 256],
            "lr": [0.5], "u_from": [WINDOW[0]], "u_to": [WINDOW[1]]}


def escape_grids(quick):
    alphas = [0.0, 1.0, 2.0] if quick else [0.0, 0.5, 1.0, 1.5, 2.0]
    base = {"alpha": alphas, "p": [2], "p_star": [1], "lr": [0.1], "N": [ESCAPE_N],
            "replicas": [16 if quick else 32]}
    yield {**base, "L": [2], "sgd": [not quick], "sgd_replicas": [16]}
    yield {**base, "L": [4] if quick else [4, 8], "sgd": [False]}


def run(func, grids, store):
    for grid in grids:
        df = sq.sweep(func, grid, store, workers=1, progress=True)
        print(df.attrs["sweep"].line(), flush=True)
        for _, row in df[df["status"] != "ok"].iterrows():
            print(f"  error at {row.to_dict()}: {row['error']}")


def _rows(store):
    """The finished points of a store (empty if it does not exist yet)."""
    if not Path(store).exists():
        return None
    df = sq.load_sweep(store)
    return df[df["status"] == "ok"]


def _curve_table(curves) -> list:
    lines = [f"Exponent `γ` of `ε ∝ t^{{-γ}}`, fitted on `u = 2η s_1 t ∈ [{WINDOW[0]:g}, "
             f"{WINDOW[1]:g}]` (linear model, `η = 0.5`, start `w = 0`): the block ODE / the "
             f"exact solution; then the gradient-flow sum without truncation on the same "
             f"window (`L = 10⁵`, `η → 0`) and `γ_∞ = (α + β − 1)/α`.", ""]
    Ls = sorted(curves["L"].unique())
    lines.append("| α | β | " + " | ".join(f"L = {L}" for L in Ls) + " | L = ∞, η → 0 | γ_∞ |")
    lines.append("|---|---|" + "---|" * len(Ls) + "---|---|")
    for (a, b), g in curves.groupby(["alpha", "teacher_exponent"]):
        cells = []
        for L in Ls:
            r = g[g["L"] == L]
            cells.append("" if r.empty else
                         f"{r.iloc[0]['exponent']:.4f} / {r.iloc[0]['exponent_exact']:.4f}")
        lines.append(f"| {a:g} | {b:g} | " + " | ".join(cells)
                     + f" | {g.iloc[0]['exponent_untruncated']:.4f}"
                     + f" | {g.iloc[0]['exponent_asymptotic']:.4f} |")
    return lines + ["", "Largest deviation of the ODE's risk from the exact solution over "
                    f"every point and time, relative to `ε(0)`: "
                    f"{curves['max_error_exact'].max():.2g}.", ""]


def _escape_table(escapes) -> list:
    lines = [f"Quadratic network (`σ = z²`, `p = 2`, `p* = 1`, `η = 0.1`, `β = 0`), random "
             f"starts at `N = {ESCAPE_N}`: plateau risk, growth rate `κ` of `ρ` at the "
             f"plateau, `log N/(2κ)`, median escape time of the ODE (5–95 %) and of SGD.",
             "", "| α | L | plateau risk | κ | log N/(2κ) | ODE t_esc | SGD t_esc |",
             "|---|---|---|---|---|---|---|"]
    for _, r in escapes.sort_values(["L", "alpha"]).iterrows():
        sgd = r.get("sgd_median", np.nan)
        lines.append(f"| {r['alpha']:g} | {r['L']} | {r['plateau_risk']:.4f} | "
                     f"{r['rate']:.4f} | {r['escape_scale']:.2f} | {r['ode_median']:.2f} "
                     f"({r['ode_q05']:.1f}–{r['ode_q95']:.1f}) | "
                     + ("" if not np.isfinite(sgd) else f"{sgd:.2f}") + " |")
    return lines


def tables(curves, escapes) -> str:
    """The markdown tables of the two studies (what of them is stored)."""
    lines = []
    if curves is not None and len(curves):
        lines += _curve_table(curves)
    if escapes is not None and len(escapes):
        lines += _escape_table(escapes)
    return "\n".join(lines) + "\n"


def plot(store, fig_dir, table, fmt="png"):
    curves, escapes = _rows(store / "curves"), _rows(store / "escape")
    fig_dir.mkdir(parents=True, exist_ok=True)
    if curves is not None and len(curves):
        pick = curves[(curves["alpha"] == 2.0) & (curves["teacher_exponent"] == 0.0)]
        shown = [(int(r["L"]), {**sq.load_sweep_arrays(store / "curves", r["key"]),
                                 **r.to_dict()})
                 for _, r in pick.sort_values("L").iterrows()
                 if int(r["L"]) in (4, 16, 64, 256)]
        fig = sq.power_law_figure(shown, curves.to_dict("records"), WINDOW)
        sq.save_figure(fig, fig_dir / f"power_law_exponents.{fmt}")
    if escapes is not None and len(escapes):
        fig = sq.power_law_escape_figure(escapes.to_dict("records"), ESCAPE_N)
        sq.save_figure(fig, fig_dir / f"power_law_escape.{fmt}")
    text = tables(curves, escapes)
    Path(table).parent.mkdir(parents=True, exist_ok=True)
    Path(table).write_text(text, encoding="utf-8")
    print(text)


def main():
    ap = sq.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("curves", "escape", "all"))
    ap.add_argument("--quick", action="store_true", help="a small grid")
    ap.add_argument("--plot", action="store_true", help="figures and tables from the store")
    ap.add_argument("--format", choices=("png", "pdf", "svg"), default="png")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (store, figures)")
    ap.add_argument("--figures", default=None, help="figure folder (default OUT/figures)")
    ap.add_argument("--table", default=None,
                    help="markdown file of the tables (default OUT/power_law_table.md)")
    args = ap.parse_args()
    return sq.run_main(compute, args)


def compute(args):
    start = time.perf_counter()
    out = Path(args.out)
    store = out / ("store_quick" if args.quick else "store")
    if args.part in ("curves", "all"):
        run(sq.power_law_curve_study, [curve_grid(args.quick)], store / "curves")
    if args.part in ("escape", "all"):
        run(sq.power_law_escape_study, escape_grids(args.quick), store / "escape")
    if args.plot or args.part is not None:
        plot(store, Path(args.figures) if args.figures else out / "figures",
             args.table or out / "power_law_table.md", args.format)
    print(f"runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
