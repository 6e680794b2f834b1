"""Escape from the plateau: prediction vs ODE vs SGD over p*, p, N and both lr conventions.

For every configuration this measures the median escape time (first time the
risk falls halfway from the plateau risk to the minimum risk)

* predicted by :func:`symquad.numeric.landscape.escape_prediction` (for the ODE
  from a random start, and for SGD including the noise seeding of ρ),
* of the ODE integrated from realised random starts (exact law of Q(0), ρ(0)),
* of SGD (reduced simulator, many replicas),

then fits ``t_esc = log(N)/(2κ) + c/κ`` to the ODE medians over N (rate κ and
log-prefactor c) and compares with the plateau rate.  Results go to
``examples/output/escape_sweep_<part>.json``; ``--plot`` draws
``examples/figures/escape_*.png`` from whatever results exist.

Usage::

    python examples/escape_sweep.py --part ode     # prediction + ODE grid (~15 min)
    python examples/escape_sweep.py --part sgd     # SGD grid (~20 min)
    python examples/escape_sweep.py --plot
    python examples/escape_sweep.py --part ode --quick   # a 1-minute version
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

import symquad as sq
from symquad import plotting as P
from symquad.studies import escape_grid as G

HERE = Path(__file__).resolve().parent
OUT = HERE / "output"
FIG = HERE / "figures"

LR = {"width": 0.1, "fixed": 0.1}   # η = 0.1 p  or  η = 0.1 (DEFAULT_MODEL lr)


def model(p, k, conv):
    return sq.Model(p=p, p_star=k, lr=LR[conv], lr_scaling=conv)


def run_ode(quick):
    ks = (1, 2) if quick else (1, 2, 3)
    Ns = (100, 1000, 10_000, 100_000)
    n = 48 if quick else 96
    results = [r for r in load("ode") if r["lr"] == LR[r["conv"]]]   # resume
    done = {(r["conv"], r["p_star"], r["p"]) for r in results}
    for conv in ("width", "fixed"):
        for k in ks:
            ps = sorted({k, 4, 8}) if quick else range(k, 9)
            for p in ps:
                if (conv, k, p) in done:
                    continue
                rec = G.ode_record(model(p, k, conv), conv, Ns, n)
                results.append(rec)
                rel = np.array(rec["pred_ode"]) / np.array(rec["ode"]) - 1
                print(f"{conv:5s} p*={k} p={p}: κ={rec['rate']:.4f} fit κ={rec['fit_rate']:.4f}"
                      f"±{rec['fit_rate_se']:.4f} c={rec['fit_logpref']:.3f}"
                      f"±{rec['fit_logpref_se']:.3f} (pred {rec['pred_logpref']:.3f}); pred/ODE−1 = "
                      f"{np.array2string(rel, precision=4)} [{rec['seconds']:.0f}s]", flush=True)
                save("ode", results)
    return results


def run_sgd(quick):
    results = [r for r in load("sgd") if r.get("lr", LR["width"]) == LR[r["conv"]]]  # resume
    done = {(r["conv"], r["p_star"], r["p"], r["N"]) for r in results}
    for conv, k, p, N, reps in G.sgd_grid(quick, "extra" if TAG == "_extra" else "all"):
        if (conv, k, p, N) in done:
            continue
        rec = G.sgd_record(model(p, k, conv), conv, N, reps, TAG)
        results.append(rec)
        se = math.hypot(rec["pred_se"], rec["sgd_se"])
        print(f"{conv:5s} p*={k} p={p} N={N}: pred {rec['pred_sgd']:.3f} SGD {rec['sgd']:.3f}"
              f"±{rec['sgd_se']:.3f} (rel {rec['pred_sgd'] / rec['sgd'] - 1:+.4f}, "
              f"{(rec['pred_sgd'] - rec['sgd']) / se:+.2f} SE; no-noise pred "
              f"{rec['pred_ode']:.3f}) escaped {rec['escaped']:.2f} [{rec['seconds']:.0f}s]",
              flush=True)
        save("sgd", results)
    return results


TAG = ""   # set by --tag: separate output files for parallel runs


def save(part, results):
    OUT.mkdir(exist_ok=True)
    mine = [r for r in results if r.get("tag", "") == TAG]
    (OUT / f"escape_sweep_{part}{TAG}.json").write_text(json.dumps(mine, indent=1))


def load(part):
    """All results of a part (every tag)."""
    out = []
    for path in sorted(OUT.glob(f"escape_sweep_{part}*.json")):
        out += json.loads(path.read_text())
    return out


def summary():
    """Print the accuracy of the law against the ODE and SGD medians."""
    for line in G.summary_lines(load("ode"), load("sgd")):
        print(line)


def plot():
    FIG.mkdir(exist_ok=True)
    ode = load("ode")
    sgd = load("sgd")
    if ode:
        P.save_figure(P.escape_rate_prefactor_figure(ode, G.sgd_fits(sgd), LR),
                      FIG / "escape_rate_prefactor_vs_p.png")
        P.save_figure(P.escape_time_vs_N_figure(ode, sgd), FIG / "escape_time_vs_N.png")
        P.save_figure(P.escape_time_vs_p_figure(ode, sgd, N=1000), FIG / "escape_time_vs_p.png")
    print("figures in", FIG)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("ode", "sgd"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--tag", default="", choices=("", "_extra"),
                    help="'_extra': the additional SGD runs at N = 10^4 (own output file)")
    args = ap.parse_args()
    global TAG
    TAG = args.tag
    if args.part == "ode":
        run_ode(args.quick)
    elif args.part == "sgd":
        run_sgd(args.quick)
    if args.plot or args.part is None:
        summary()
        plot()


if __name__ == "__main__":
    main()
