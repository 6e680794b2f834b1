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
import time
from pathlib import Path

import numpy as np

import symquad as sq
from symquad.numeric import landscape as L

HERE = Path(__file__).resolve().parent
OUT = HERE / "output"
FIG = HERE / "figures"

LR = {"width": 0.1, "fixed": 0.1}   # η = 0.1 p  or  η = 0.1 (DEFAULT_MODEL lr)


def model(p, k, conv):
    return sq.Model(p=p, p_star=k, lr=LR[conv], lr_scaling=conv)


def median_se(x, seed=0, n_boot=300):
    x = np.asarray(x)[~np.isnan(x)]
    rng = np.random.default_rng(seed)
    return float(np.std(np.median(rng.choice(x, size=(n_boot, x.size)), axis=1), ddof=1))


def fit_log_n(Ns, medians, ses):
    """Weighted fit of ``t = A log N + B``; returns κ = 1/(2A), c = κ B and their SEs."""
    x = np.log(np.asarray(Ns, float))
    y = np.asarray(medians, float)
    w = 1 / np.asarray(ses, float) ** 2
    X = np.stack([x, np.ones_like(x)], 1)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    A, B = cov @ X.T @ (w * y)
    kappa = 1 / (2 * A)
    se_kappa = kappa * math.sqrt(cov[0, 0]) / A
    c = kappa * B
    # c = B/(2A): propagate the covariance of (A, B)
    g = np.array([-B / (2 * A ** 2), 1 / (2 * A)])
    se_c = math.sqrt(g @ cov @ g)
    return float(kappa), float(se_kappa), float(c), float(se_c)


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
                m = model(p, k, conv)
                t0 = time.time()
                fp = L.plateau(m)
                pred = L.escape_prediction(m, 1000, n_samples=2 * n, seed=0)
                # the law's N dependence is an exact shift; no-noise version: s² = q0/N
                shift_nonoise = math.log(pred.sigma2) / (2 * pred.rate)
                rec = {"p": p, "p_star": k, "conv": conv, "lr": m.lr, "eta": m.eta,
                       "rate": fp.rate, "rate_gf": fp.rate_gradient_flow, "q": fp.q,
                       "plateau_risk": fp.risk, "seed_noise_J": pred.seed_noise, "N": [],
                       "pred_ode": [], "pred_sgd": [], "ode": [], "ode_se": [], "pred_se": []}
                for N in Ns:
                    sgd_samples = pred.samples + math.log(N / 1000) / (2 * pred.rate)
                    ode_samples = sgd_samples + shift_nonoise
                    Q0, r0 = L.random_start(m, N, n, seed=N + 7)
                    t_ode = L.ode_escape_times(m, Q0, r0, 3 * float(np.median(ode_samples)))
                    rec["N"].append(N)
                    rec["pred_sgd"].append(float(np.median(sgd_samples)))
                    rec["pred_ode"].append(float(np.median(ode_samples)))
                    rec["pred_se"].append(median_se(ode_samples))
                    rec["ode"].append(float(np.nanmedian(t_ode)))
                    rec["ode_se"].append(median_se(t_ode))
                kap, se_k, c, se_c = fit_log_n(rec["N"], rec["ode"], rec["ode_se"])
                kap_p, _, c_p, _ = fit_log_n(rec["N"], rec["pred_ode"], rec["pred_se"])
                rec.update(fit_rate=kap, fit_rate_se=se_k, fit_logpref=c, fit_logpref_se=se_c,
                           pred_logpref=c_p, seconds=time.time() - t0)
                results.append(rec)
                rel = np.array(rec["pred_ode"]) / np.array(rec["ode"]) - 1
                print(f"{conv:5s} p*={k} p={p}: κ={fp.rate:.4f} fit κ={kap:.4f}±{se_k:.4f} "
                      f"c={c:.3f}±{se_c:.3f} (pred {c_p:.3f}); pred/ODE−1 = "
                      f"{np.array2string(rel, precision=4)} [{rec['seconds']:.0f}s]", flush=True)
                save("ode", results)
    return results


def sgd_grid(quick, which="all"):
    if which == "extra":   # more decades for SGD: N = 10^4 and p ∈ {p*, 4, 8}
        return [("width", k, p, 10_000, 48) for k in (1, 2, 3) for p in sorted({k, 4, 8})]
    grid = []
    for k in ((1, 2) if quick else (1, 2, 3)):
        for p in (sorted({k, 8}) if quick else range(k, 9)):
            grid += [("width", k, p, N, 96) for N in (100, 1000)]
    if not quick:
        grid += [("width", 1, 1, 10_000, 48), ("width", 1, 8, 10_000, 48),
                 ("width", 2, 2, 10_000, 48)]
        for k in (1, 2, 3):
            for p in sorted({k, 4, 8}):
                grid += [("fixed", k, p, N, 96) for N in (100, 1000)]
    return grid


def run_sgd(quick):
    results = [r for r in load("sgd") if r.get("lr", LR["width"]) == LR[r["conv"]]]  # resume
    done = {(r["conv"], r["p_star"], r["p"], r["N"]) for r in results}
    for conv, k, p, N, reps in sgd_grid(quick, "extra" if TAG == "_extra" else "all"):
        if (conv, k, p, N) in done:
            continue
        m = model(p, k, conv)
        t0 = time.time()
        pred = L.escape_prediction(m, N, n_samples=256, seed=0)
        t_max = 2.2 * float(np.quantile(pred.samples, 0.9))
        run = sq.simulate(m, N=N, t_max=t_max, replicas=reps, seed=1000 + N + 10 * p + k,
                          method="reduced", t_eval=np.linspace(0, t_max, 1201))
        t_sgd = L.escape_times(run.t, run.risk, pred.threshold)
        ok = ~np.isnan(t_sgd)
        rec = {"tag": TAG, "p": p, "p_star": k, "conv": conv, "lr": m.lr, "N": N,
               "replicas": reps,
               "pred_sgd": pred.median, "pred_se": median_se(pred.samples),
               "pred_ode": float(np.median(pred.samples
                                           + math.log(pred.sigma2) / (2 * pred.rate))),
               "sgd": float(np.nanmedian(t_sgd)), "sgd_se": median_se(t_sgd),
               "escaped": float(ok.mean()), "diverged": int((run.status != "ok").sum()),
               "seconds": time.time() - t0}
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


def sgd_fits(sgd):
    """Per (conv, p*, p): fit of the SGD medians vs log N where >= 2 values of N exist."""
    out = {}
    keys = sorted({(s["conv"], s["p_star"], s["p"]) for s in sgd})
    for key in keys:
        rows = sorted((s for s in sgd if (s["conv"], s["p_star"], s["p"]) == key),
                      key=lambda s: s["N"])
        if len(rows) >= 2:
            out[key] = fit_log_n([s["N"] for s in rows], [s["sgd"] for s in rows],
                                 [s["sgd_se"] for s in rows]) + (len(rows),)
    return out


def summary():
    """Print the accuracy of the law against the ODE and SGD medians."""
    ode, sgd = load("ode"), load("sgd")
    for conv in ("width", "fixed"):
        rows = [r for r in ode if r["conv"] == conv]
        if rows:
            rel = np.array([np.array(r["pred_ode"]) / np.array(r["ode"]) - 1 for r in rows])
            z = np.array([(np.array(r["pred_ode"]) - np.array(r["ode"]))
                          / np.hypot(r["ode_se"], r["pred_se"]) for r in rows])
            print(f"ODE {conv}: {len(rows)} configs; N = {rows[0]['N']}; max |pred/ODE − 1| "
                  f"per N = {np.array2string(np.abs(rel).max(0), precision=4)}; "
                  f"RMS z = {np.sqrt((z ** 2).mean()):.2f}")
        srows = [s for s in sgd if s["conv"] == conv]
        for N in sorted({s["N"] for s in srows}):
            sel = [s for s in srows if s["N"] == N]
            rel = np.array([s["pred_sgd"] / s["sgd"] - 1 for s in sel])
            z = np.array([(s["pred_sgd"] - s["sgd"]) / math.hypot(s["pred_se"], s["sgd_se"])
                          for s in sel])
            print(f"SGD {conv} N={N}: {len(sel)} configs; max |pred/SGD − 1| = "
                  f"{np.abs(rel).max():.4f}, mean {rel.mean():+.4f}; RMS z = "
                  f"{np.sqrt((z ** 2).mean()):.2f}, max |z| = {np.abs(z).max():.2f}")
    for key, (kap, se_k, c, se_c, n) in sgd_fits(sgd).items():
        r = [o for o in ode if (o["conv"], o["p_star"], o["p"]) == key]
        ref = f" (plateau κ {r[0]['rate']:.4f})" if r else ""
        print(f"SGD fit {key} over {n} N: κ = {kap:.4f} ± {se_k:.4f}{ref}, "
              f"c = {c:.3f} ± {se_c:.3f}")


def plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    FIG.mkdir(exist_ok=True)
    ode = load("ode")
    sgd = load("sgd")
    if ode:
        fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
        for col, conv in enumerate(("width", "fixed")):
            ax_r, ax_c = axes[0, col], axes[1, col]
            for k, color in zip((1, 2, 3), ("C0", "C1", "C2")):
                rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
                if not rows:
                    continue
                ps = [r["p"] for r in rows]
                ax_r.errorbar(ps, [r["fit_rate"] for r in rows],
                              [r["fit_rate_se"] for r in rows], fmt="o", color=color,
                              label=f"p*={k}: fit to ODE medians vs log N")
                ax_r.plot(ps, [r["rate"] for r in rows], "-", color=color,
                          label=f"p*={k}: plateau rate κ")
                fits = sgd_fits(sgd)
                sp_ = [p for p in ps if (conv, k, p) in fits and fits[(conv, k, p)][4] >= 3]
                if sp_:
                    ax_r.errorbar(sp_, [fits[(conv, k, p)][0] for p in sp_],
                                  [fits[(conv, k, p)][1] for p in sp_], fmt="s", mfc="none",
                                  color=color, label=f"p*={k}: fit to SGD medians (N=1e2..1e4)")
                    ax_c.errorbar(sp_, [fits[(conv, k, p)][2] for p in sp_],
                                  [fits[(conv, k, p)][3] for p in sp_], fmt="s", mfc="none",
                                  color=color, label=f"p*={k}: fit (SGD, N=1e2..1e4)")
                ax_r.plot(ps, [r["rate_gf"] for r in rows], ":", color=color)
                ax_c.errorbar(ps, [r["fit_logpref"] for r in rows],
                              [r["fit_logpref_se"] for r in rows], fmt="o", color=color,
                              label=f"p*={k}: fit (ODE)")
                ax_c.plot(ps, [r["pred_logpref"] for r in rows], "-", color=color,
                          label=f"p*={k}: prediction")
            title = f"η = {LR['width']}·p (lr_scaling='width')" if conv == "width" else f"η = {LR['fixed']} (fixed)"
            ax_r.set_title(f"rate: {title}")
            ax_r.set_xlabel("p")
            ax_r.set_ylabel("κ  (t_esc ≈ log N /(2κ) + c/κ)")
            ax_c.set_title(f"log-prefactor c: {title}")
            ax_c.set_xlabel("p")
            ax_c.set_ylabel("c = κ t_esc − ½ log N")
            ax_r.legend(fontsize=7)
            ax_c.legend(fontsize=7)
        fig.suptitle("Escape from the plateau: which of rate and prefactor depends on p "
                     "(dotted: gradient-flow rate 4η/(p p*))", fontsize=10)
        fig.tight_layout()
        fig.savefig(FIG / "escape_rate_prefactor_vs_p.png", dpi=120)
        plt.close(fig)

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, conv in zip(axes, ("width", "fixed")):
            for k, color in zip((1, 2, 3), ("C0", "C1", "C2")):
                for p, mk in ((k, "o"), (8, "s")):
                    rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k
                            and r["p"] == p]
                    for r in rows:
                        ax.errorbar(r["N"], r["ode"], r["ode_se"], fmt=mk, color=color,
                                    mfc="none", label=f"ODE p*={k}, p={p}")
                        ax.plot(r["N"], r["pred_ode"], "-", color=color)
                    srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                             and s["p"] == p]
                    if srows:
                        ax.errorbar([s["N"] for s in srows], [s["sgd"] for s in srows],
                                    [s["sgd_se"] for s in srows], fmt=mk, color=color,
                                    label=f"SGD p*={k}, p={p}")
                        ax.plot([s["N"] for s in srows], [s["pred_sgd"] for s in srows],
                                "--", color=color)
            ax.set_xscale("log")
            ax.set_xlabel("N")
            ax.set_ylabel("median escape time")
            ax.set_title(f"lr_scaling={conv!r} (lines: prediction)")
            ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(FIG / "escape_time_vs_N.png", dpi=120)
        plt.close(fig)

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, conv in zip(axes, ("width", "fixed")):
            for k, color in zip((1, 2, 3), ("C0", "C1", "C2")):
                rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
                if not rows:
                    continue
                i = rows[0]["N"].index(1000)
                ax.errorbar([r["p"] for r in rows], [r["ode"][i] for r in rows],
                            [r["ode_se"][i] for r in rows], fmt="o", color=color,
                            mfc="none", label=f"ODE p*={k}")
                ax.plot([r["p"] for r in rows], [r["pred_ode"][i] for r in rows], "-",
                        color=color, label=f"prediction p*={k}")
                srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                         and s["N"] == 1000]
                if srows:
                    ax.errorbar([s["p"] for s in srows], [s["sgd"] for s in srows],
                                [s["sgd_se"] for s in srows], fmt="s", color=color,
                                label=f"SGD p*={k}")
                    ax.plot([s["p"] for s in srows], [s["pred_sgd"] for s in srows], "--",
                            color=color)
            ax.set_xlabel("p")
            ax.set_ylabel("median escape time, N = 1000")
            ax.set_title(f"lr_scaling={conv!r}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(FIG / "escape_time_vs_p.png", dpi=120)
        plt.close(fig)
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
