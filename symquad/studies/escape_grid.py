r"""Escape from the plateau over a grid of (p*, p, N, lr convention): prediction, ODE, SGD.

For one configuration this measures the median escape time (first time the
risk falls halfway from the plateau risk to the minimum risk)

* predicted by :func:`symquad.numeric.landscape.escape_prediction` (for the ODE
  from a random start, and for SGD including the noise seeding of ρ),
* of the ODE integrated from realised random starts (exact law of Q(0), ρ(0)),
* of SGD (reduced simulator, many replicas),

and fits ``t_esc = A log N + B``, i.e. ``t_esc = log(N)/(2κ) + c/κ`` with
``κ = 1/(2A)`` and ``c = κB``, to medians over N.  Standard errors of medians
are bootstrap estimates.  ``examples/escape_sweep.py`` drives the grid and
:mod:`symquad.plotting` draws the figures.
"""

from __future__ import annotations

import math
import time

import numpy as np

__all__ = ["median_se", "fit_log_n", "ode_record", "sgd_record", "sgd_grid", "sgd_fits",
           "summary_lines"]


def median_se(x, seed=0, n_boot=300):
    """Bootstrap standard error of the median of the finite entries of `x`."""
    x = np.asarray(x)[~np.isnan(x)]
    rng = np.random.default_rng(seed)
    return float(np.std(np.median(rng.choice(x, size=(n_boot, x.size)), axis=1), ddof=1))


def fit_log_n(Ns, medians, ses):
    r"""Weighted least-squares fit of ``t = A log N + B``.

    Returns ``(κ, se κ, c, se c)`` with ``κ = 1/(2A)`` and ``c = κB = B/(2A)``;
    the standard errors propagate the covariance of ``(A, B)`` to first order.
    """
    x = np.log(np.asarray(Ns, float))
    y = np.asarray(medians, float)
    w = 1 / np.asarray(ses, float) ** 2
    X = np.stack([x, np.ones_like(x)], 1)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    A, B = cov @ X.T @ (w * y)
    kappa = 1 / (2 * A)
    se_kappa = kappa * math.sqrt(cov[0, 0]) / A
    c = kappa * B
    # c = B/(2A): gradient of c with respect to (A, B)
    g = np.array([-B / (2 * A ** 2), 1 / (2 * A)])
    se_c = math.sqrt(g @ cov @ g)
    return float(kappa), float(se_kappa), float(c), float(se_c)


def ode_record(model, conv, Ns=(100, 1000, 10_000, 100_000), n=96) -> dict:
    """Prediction and ODE medians of the escape time over `Ns` for one model.

    For each N: ``n`` random starts (:func:`symquad.numeric.landscape.random_start`,
    seed ``N + 7``) integrated to 3× the predicted median; the prediction uses
    ``2n`` samples of its law (seed 0), whose N dependence is an exact shift.
    Then :func:`fit_log_n` on the ODE medians and on the predictions.
    """
    from ..numeric import landscape as L

    m = model
    t0 = time.time()
    fp = L.plateau(m)
    pred = L.escape_prediction(m, 1000, n_samples=2 * n, seed=0)
    # the law's N dependence is an exact shift; no-noise version: s² = q0/N
    shift_nonoise = math.log(pred.sigma2) / (2 * pred.rate)
    rec = {"p": m.p, "p_star": m.p_star, "conv": conv, "lr": m.lr, "eta": m.eta,
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
    return rec


def sgd_record(model, conv, N, replicas, tag="") -> dict:
    """Predicted and SGD (reduced simulator) median escape times for one (model, N).

    SGD runs to ``2.2×`` the 90 % quantile of the predicted law, seed
    ``1000 + N + 10 p + p*``, 1201 recorded times.
    """
    from ..numeric import landscape as L
    from ..numeric.simulate import simulate

    m = model
    p, k = m.p, m.p_star
    t0 = time.time()
    pred = L.escape_prediction(m, N, n_samples=256, seed=0)
    t_max = 2.2 * float(np.quantile(pred.samples, 0.9))
    run = simulate(m, N=N, t_max=t_max, replicas=replicas, seed=1000 + N + 10 * p + k,
                   method="reduced", t_eval=np.linspace(0, t_max, 1201))
    t_sgd = L.escape_times(run.t, run.risk, pred.threshold)
    ok = ~np.isnan(t_sgd)
    return {"tag": tag, "p": p, "p_star": k, "conv": conv, "lr": m.lr, "N": N,
            "replicas": replicas,
            "pred_sgd": pred.median, "pred_se": median_se(pred.samples),
            "pred_ode": float(np.median(pred.samples
                                        + math.log(pred.sigma2) / (2 * pred.rate))),
            "sgd": float(np.nanmedian(t_sgd)), "sgd_se": median_se(t_sgd),
            "escaped": float(ok.mean()), "diverged": int((run.status != "ok").sum()),
            "seconds": time.time() - t0}


def sgd_grid(quick, which="all"):
    """The SGD configurations ``(conv, p*, p, N, replicas)`` of the escape sweep."""
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


def sgd_fits(sgd):
    """Per (conv, p*, p): :func:`fit_log_n` of the SGD medians where >= 2 values of N exist.

    Returns ``{(conv, p*, p): (κ, se κ, c, se c, number of N)}``.
    """
    out = {}
    keys = sorted({(s["conv"], s["p_star"], s["p"]) for s in sgd})
    for key in keys:
        rows = sorted((s for s in sgd if (s["conv"], s["p_star"], s["p"]) == key),
                      key=lambda s: s["N"])
        if len(rows) >= 2:
            out[key] = fit_log_n([s["N"] for s in rows], [s["sgd"] for s in rows],
                                 [s["sgd_se"] for s in rows]) + (len(rows),)
    return out


def summary_lines(ode, sgd):
    """Text lines: accuracy of the escape law against the ODE and SGD medians."""
    lines = []
    for conv in ("width", "fixed"):
        rows = [r for r in ode if r["conv"] == conv]
        if rows:
            rel = np.array([np.array(r["pred_ode"]) / np.array(r["ode"]) - 1 for r in rows])
            z = np.array([(np.array(r["pred_ode"]) - np.array(r["ode"]))
                          / np.hypot(r["ode_se"], r["pred_se"]) for r in rows])
            lines.append(f"ODE {conv}: {len(rows)} configs; N = {rows[0]['N']}; max |pred/ODE − 1| "
                         f"per N = {np.array2string(np.abs(rel).max(0), precision=4)}; "
                         f"RMS z = {np.sqrt((z ** 2).mean()):.2f}")
        srows = [s for s in sgd if s["conv"] == conv]
        for N in sorted({s["N"] for s in srows}):
            sel = [s for s in srows if s["N"] == N]
            rel = np.array([s["pred_sgd"] / s["sgd"] - 1 for s in sel])
            z = np.array([(s["pred_sgd"] - s["sgd"]) / math.hypot(s["pred_se"], s["sgd_se"])
                          for s in sel])
            lines.append(f"SGD {conv} N={N}: {len(sel)} configs; max |pred/SGD − 1| = "
                         f"{np.abs(rel).max():.4f}, mean {rel.mean():+.4f}; RMS z = "
                         f"{np.sqrt((z ** 2).mean()):.2f}, max |z| = {np.abs(z).max():.2f}")
    for key, (kap, se_k, c, se_c, n) in sgd_fits(sgd).items():
        r = [o for o in ode if (o["conv"], o["p_star"], o["p"]) == key]
        ref = f" (plateau κ {r[0]['rate']:.4f})" if r else ""
        lines.append(f"SGD fit {key} over {n} N: κ = {kap:.4f} ± {se_k:.4f}{ref}, "
                     f"c = {c:.3f} ± {se_c:.3f}")
    return lines
