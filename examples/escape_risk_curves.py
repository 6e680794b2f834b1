"""Risk curves for several student widths p at fixed p*: plateau, escape, convergence.

The ODE integrated from the realised random start of SGD replica 0 and the median
over SGD replicas (reduced simulator), for both learning-rate conventions
(docs/model.md §4, §8.2); the dotted lines mark the plateau risk of the ODE fixed
point (``sq.plateau``) and the arrows the predicted median escape time
(``sq.escape_time``). The printed SGD escape times are first passages below the
threshold ``sq.escape_threshold`` (``sq.escape_times``).

    python examples/escape_risk_curves.py [--p-star 2 --N 2000 --replicas 32] [--out DIR]

Writes ``DIR/escape_risk_curves.png`` (default ``./symquad_examples/escape_risk_curves``)
and prints the measured runtime.
"""

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import symquad as sq  # noqa: E402

LR = {"width": 0.1, "fixed": 0.15}
DEFAULT_OUT = Path("symquad_examples") / "escape_risk_curves"


def main(p_star=2, N=2000, replicas=32, ps=(2, 4, 8), out=DEFAULT_OUT):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, conv in zip(axes, ("width", "fixed")):
        for p, color in zip([p for p in ps if p >= 1], ("C0", "C1", "C2", "C3")):
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
            ax.semilogy(run.t, np.median(run.risk, axis=0), color=color, lw=2, alpha=0.5,
                        label=f"p={p}: SGD median ({replicas} replicas)")
            ax.semilogy(ode.t, ode.risk, color=color, lw=1, ls="-",
                        label=f"p={p}: ODE (replica 0 start)")
            ax.axhline(fp.risk, color=color, ls=":", lw=0.8)
            ax.annotate("", xy=(t_pred, fp.risk), xytext=(t_pred, 3 * fp.risk),
                        arrowprops=dict(arrowstyle="->", color=color))
            t_sgd = np.median(sq.escape_times(run.t, run.risk, pred.threshold))
            print(f"  eta={m.eta:.3g}: plateau q={fp.q:.4f} risk={fp.risk:.4f} "
                  f"rate={fp.rate:.4f}; escape predicted {t_pred:.2f} (quartiles "
                  f"{pred.quartiles[0]:.2f}-{pred.quartiles[2]:.2f}), SGD median {t_sgd:.2f}",
                  flush=True)
        ax.set_xlabel("t = steps / N")
        ax.set_ylabel("population risk")
        ax.set_title(f"p* = {p_star}, N = {N}, lr_scaling={conv!r} "
                     f"({'η = 0.1 p' if conv == 'width' else 'η = 0.15'})", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path = out / "escape_risk_curves.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p-star", type=int, default=2)
    ap.add_argument("--N", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder (default ./{DEFAULT_OUT})")
    a = ap.parse_args()
    raise SystemExit(sq.run_main(main, a.p_star, a.N, a.replicas, out=a.out))
