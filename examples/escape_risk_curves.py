"""Risk curves for several student widths p at fixed p*: plateau, escape, convergence.

The ODE integrated from the realised random start of SGD replica 0 and the median
over SGD replicas (reduced simulator), for both learning-rate conventions
(docs/model.md §4, §8.2); the dotted lines mark the plateau risk of the ODE fixed
point (``sq.plateau``) and the arrows the predicted median escape time
(``sq.escape_time``). The printed SGD escape times are first passages below the
threshold ``sq.escape_threshold`` (``sq.escape_times``).

    python examples/escape_risk_curves.py [--p-star 2 --N 2000 --replicas 32] [--out DIR]
                                          [--format png|pdf|svg]

Writes ``DIR/escape_risk_curves.png`` (or ``.pdf``/``.svg``; default ``DIR``
``./symquad_examples/escape_risk_curves``)
and prints the measured runtime.
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

LR = {"width": 0.1, "fixed": 0.15}
DEFAULT_OUT = Path("symquad_examples") / "escape_risk_curves"
FORMATS = ("png", "pdf", "svg")


def main(p_star=2, N=2000, replicas=32, ps=(2, 4, 8), out=DEFAULT_OUT, fmt="png"):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    panels = []
    for conv in ("width", "fixed"):
        curves = []
        for p in [p for p in ps if p >= 1]:
            m = sq.Model(p=p, p_star=p_star, lr=LR[conv], lr_scaling=conv)
            print(f"{conv:5s} p*={p_star} p={p}: escape prediction, SGD ({replicas} "
                  f"replicas, N={N}) and ODE ...", flush=True)
            fp = sq.plateau(m)
            pred = sq.escape_time(m, N, n_samples=128)
            t_pred = float(pred)
            t_max = 2.0 * t_pred
            t_eval = np.linspace(0, t_max, 600)
            run = sq.simulate(m, N=N, t_max=t_max, replicas=replicas, seed=p,
                              method="reduced", t_eval=t_eval)
            ode = sq.integrate(m, run.Q[0, 0], run.rho[0, 0], run.T, t_max, t_eval=t_eval)
            curves.append({"p": p, "t": run.t, "sgd_median": np.median(run.risk, axis=0),
                           "ode_t": ode.t, "ode_risk": ode.risk, "plateau_risk": fp.risk,
                           "t_pred": t_pred})
            t_sgd = np.median(sq.escape_times(run.t, run.risk, pred.threshold))
            print(f"  eta={m.eta:.3g}: plateau q={fp.q:.4f} risk={fp.risk:.4f} "
                  f"rate={fp.rate:.4f}; escape predicted {t_pred:.2f} (quartiles "
                  f"{pred.quartiles[0]:.2f}-{pred.quartiles[2]:.2f}), SGD median {t_sgd:.2f}",
                  flush=True)
        title = (f"η = {LR[conv]:g}·p (lr scaling 'width')" if conv == "width"
                 else f"η = {LR[conv]:g} (lr scaling 'fixed')")
        panels.append((title, curves))
    fig = sq.escape_risk_curves_figure(
        panels, suptitle=f"p* = {p_star}, σ = z², N = {N}, {replicas} SGD replicas")
    path = sq.save_figure(fig, out / f"escape_risk_curves.{fmt}")
    print(f"wrote {path}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    ap = sq.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p-star", type=int, default=2)
    ap.add_argument("--N", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder (default ./{DEFAULT_OUT})")
    ap.add_argument("--format", choices=FORMATS, default="png",
                    help="figure file format (pdf, svg: vector; default png)")
    a = ap.parse_args()
    raise SystemExit(sq.run_main(main, a.p_star, a.N, a.replicas, out=a.out, fmt=a.format))
