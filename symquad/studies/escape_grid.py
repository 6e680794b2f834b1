r"""Escape from the plateau over a grid of (p*, p, N, lr convention): fits and summaries.

The ``escape`` task (:mod:`symquad.studies.tasks`) measures, for one
configuration, the median escape time (first time the risk falls halfway from
the plateau risk to the minimum risk) predicted by
:func:`symquad.numeric.landscape.escape_prediction`, of the ODE from realised
random starts and of SGD.  Over a sweep of it, this module groups the rows by
configuration (:func:`records_from_sweep`) and fits ``t_esc = A log N + B``,
i.e. ``t_esc = log(N)/(2κ) + c/κ`` with ``κ = 1/(2A)`` and ``c = κB``, to
medians over N.  Standard errors of medians
are bootstrap estimates.  ``examples/escape_sweep.py`` drives the grid and
:mod:`symquad.plotting` draws the figures.
"""

from __future__ import annotations

import math

import numpy as np

from ..spec import CLASSIC_FIELDS, model_fields

__all__ = ["median_se", "fit_log_n", "records_from_sweep", "sgd_fits", "summary_lines",
           "escape_sweep_summary"]


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


def records_from_sweep(df):
    """ODE and SGD records (lists of dicts) from the table of an ``escape`` sweep.

    ODE records, one per ``(lr_scaling, p*, p)`` measured at >= 2 values of N:
    lists over N of the ODE medians (``ode``, ``ode_se``) and predictions
    (``pred_ode``, ``pred_sgd``, ``pred_se``), the plateau rates (``rate``,
    ``rate_gf``), and :func:`fit_log_n` fits of the ODE medians (``fit_rate``,
    ``fit_logpref`` and standard errors) and of the predictions
    (``pred_logpref``).  SGD records, one per row with SGD: ``sgd`` (median),
    ``sgd_se``, ``pred_sgd``, ``pred_se``, ``pred_ode``, ``escaped``.
    Error rows are left out.  The ok rows must share one value of every
    model-specification field (``weight_decay``, ``batch_size``, ...; the
    records are grouped by ``(lr_scaling, p*, p)`` only): ``ValueError`` names
    a field that varies (select one value first, e.g. ``df[df.batch_size == 1]``).
    """
    ok = df[df["status"] == "ok"]
    for name in (f.name for f in model_fields() if f.name not in CLASSIC_FIELDS):
        if name in ok.columns and ok[name].astype(str).nunique() > 1:
            raise ValueError(f"records_from_sweep groups rows by (lr_scaling, p_star, p); the "
                             f"model field {name} takes several values "
                             f"{sorted(ok[name].astype(str).unique())}: select one first")
    ode, sgd = [], []
    for (conv, k, p), sub in ok.groupby(["lr_scaling", "p_star", "p"], sort=True):
        sub = sub.sort_values("N").drop_duplicates("N")
        rec = {"p": int(p), "p_star": int(k), "conv": conv, "lr": float(sub["lr"].iloc[0]),
               "rate": float(sub["rate"].iloc[0]), "rate_gf": float(sub["rate_gf"].iloc[0]),
               "N": [int(n) for n in sub["N"]], "ode": sub["ode_median"].tolist(),
               "ode_se": sub["ode_median_se"].tolist(), "pred_ode": sub["pred_ode"].tolist(),
               "pred_sgd": sub["pred_sgd"].tolist(), "pred_se": sub["pred_se"].tolist()}
        if len(rec["N"]) >= 2:
            kap, se_k, c, se_c = fit_log_n(rec["N"], rec["ode"], rec["ode_se"])
            rec.update(fit_rate=kap, fit_rate_se=se_k, fit_logpref=c, fit_logpref_se=se_c,
                       pred_logpref=fit_log_n(rec["N"], rec["pred_ode"], rec["pred_se"])[2])
            ode.append(rec)
    if "sgd_median" in ok.columns:
        for _, r in ok[ok["sgd_median"].notna()].iterrows():
            sgd.append({"p": int(r["p"]), "p_star": int(r["p_star"]), "conv": r["lr_scaling"],
                        "lr": float(r["lr"]), "N": int(r["N"]), "replicas": int(r["replicas"]),
                        "sgd": float(r["sgd_median"]), "sgd_se": float(r["sgd_median_se"]),
                        "pred_sgd": float(r["pred_sgd"]), "pred_se": float(r["pred_se"]),
                        "pred_ode": float(r["pred_ode"]), "escaped": float(r["sgd_escaped"])})
    return ode, sgd


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


def escape_sweep_summary(df) -> str:
    """Text summary of an ``escape`` sweep table: the escape law against ODE and SGD medians."""
    return "\n".join(summary_lines(*records_from_sweep(df)))
