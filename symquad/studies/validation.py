r"""Validation of the ODE theory against Monte Carlo SGD: numbers, a verdict, figures.

:func:`validate` runs SGD for a model (by default with the exact reduced
simulator, whose law is that of full SGD and whose cost per step does not grow
with ``N``), integrates the ODE (:func:`symquad.integrate`) from the *realised*
initial overlaps of every replica, measures how far SGD is from the theory and
decides PASS/FAIL from the statistical criteria below.  :func:`compare` does
the same for trajectories the user supplies (another code, a GPU run, an
experiment): the same report, the same verdict.

What is compared
----------------
For replica ``r`` and recorded time ``t_i``:

* the risk deviation ``ε_SGD(t_i) − ε_ODE(t_i)`` (the SGD risk is computed from
  the overlaps by Isserlis' theorem, :func:`symquad.numeric.simulate.population_risk`,
  a route independent of the generated kernels);
* the overlap deviation ``D_r(t_i) = (‖Q_SGD − Q_ODE‖²_F + ‖ρ_SGD − ρ_ODE‖²_F)^{1/2}``.

Each replica's ODE starts from that replica's own ``(Q(0), ρ(0))``.  From a
random start this is necessary: ``ρ(0)`` has random entries of size ``N^{-1/2}``
whose replica mean is ``≈ 0``, and the ODE from the mean would never leave
the plateau.  From an informed start all replicas share the same initial
overlaps (the simulator realises them exactly), so one ODE serves all.

Escape
------
For a quadratic activation with ``T = I`` the plateau is the fixed point
``ρ = 0, Q = q I`` of the full ODE (:func:`symquad.plateau`).  A trajectory has
escaped at the first time its risk falls below
``ε_pl − f (ε_pl − ε_min)`` with ``f = escape_fraction`` (default ½) —
:func:`symquad.numeric.landscape.escape_threshold`, linear interpolation
between records.  "Before escape" of replica ``r`` means ``t < t_esc^ODE(r)``,
"after" means ``t >= t_esc^ODE(r)``.  At any fixed time before the escape SGD
and the ODE agree to ``O(N^{-1/2})`` (the finite-size scaling can be run from
the random start on such a window, ``fss_start="random"``).  But the SGD noise
that enters ρ on the plateau is of the same order ``N^{-1/2}`` as ``ρ(0)``
itself and is amplified with ρ at the plateau rate ``κ``, so the escape-time
difference ``t_esc^SGD − t_esc^ODE`` is ``O(1)`` and does not shrink with
``N``.  In the linearised plateau dynamics (:func:`symquad.escape_time`) SGD
escapes as if it had started from ``ρ̃ = ρ(0) + ξ`` with ``ξ`` isotropic of
variance ``J/N`` per entry (``J`` the integrated SGD noise of ρ on the
plateau), while ``ρ(0)`` has variance ``q0/N``: ``|ρ̃|²`` has the law of
``|ρ(0)|²·(1 + J/q0)``, so the mean paired difference is predicted to be

.. math::  \langle t_{esc}^{SGD} − t_{esc}^{ODE} \rangle = −\frac{\log(1 + J/q_0)}{2κ}

(SGD earlier), with an O(1/κ) spread.  For the default model this is
``−0.81`` against a spread of ``≈ 3`` (measured ``−1.07 ± 0.36``).  The
same seeding makes the mean SGD ``‖ρ‖²`` larger than the ODE's by the factor
``1 + J/q0`` once ρ has grown, a systematic deviation of the mean risk of
order ``e^{2κt}/N`` that the replicas resolve (at 64 replicas about 4
standard errors); it is a finite-``N`` effect of the escape, not a failure of
the theory, and the verdict tests it through the escape-time shift rather
than through the mean risk.

After the escape the two differ mostly by that shift in time, and for
``p > p*`` they end at *different points of the zero-risk manifold*: the
manifold ``{WᵀW/p = W*ᵀW*/p*}`` has dimension ``p·p* − p*(p*+1)/2 > 0``, the
noise on the plateau has turned the direction of ρ, and SGD and the ODE
converge to two different zero-risk points (same risk, overlaps that differ
by O(1)).  The overlap deviation after the escape is therefore O(1) at any N
(≈ 1 for the default model) while the risk deviation vanishes; it is reported,
not tested.

Finite-size scaling
-------------------
For several ``N`` (default: 5 values over two decades), the mean over replicas
of the root-mean-square in time of ``D_r(t)`` on ``[0, t_fss]`` is measured
from an *informed* start (no plateau, so no escape-time jitter; see above),
and ``log D = a + b log N`` is fitted by weighted least squares
(:func:`scipy.optimize.curve_fit`, weights from the replica standard errors).
The theory predicts ``b = −1/2`` (fluctuations of a sum of ``N t`` steps of
size ``1/N``); the report gives ``b`` with its standard error.

Bands
-----
``band`` (default the central 95 % of the replicas, percentiles 2.5 and 97.5)
is where a single SGD run lies; the ODE is "inside the band" at a time if it
is within it up to ``1e-9`` (the two risks are computed by different routes, so
they agree at ``t = 0`` only to round-off).  The mean of the replicas carries
its own confidence interval ``± 3`` standard errors.

Verdict
-------
Each criterion is a test at family level ``alpha`` (default 0.01) that the
report states with its numbers; ``report.passed`` is True when every criterion
that could be tested passed and the mean-deviation and band criteria were
tested (``report.verdict`` is ``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"``;
``report.reasons`` lists one line per criterion).

1. **Mean deviation on the approach to the plateau** (``mean_deviation``).
   ``z(t) = |mean_r(ε_SGD − ε_ODE)| / s.e.`` at every recorded time after the
   start in the window ``W``, against Student's ``t`` with ``R − 1`` degrees
   of freedom at level ``alpha/(2|W|)`` (Bonferroni over the times of the
   window).  ``W`` is the whole run when there is no escape analysis, and
   otherwise the times before the median ODE ``‖ρ‖²_F`` has grown to twice its
   start (``_RHO_GROWTH``): the relaxation onto the plateau, before the
   ``N^{-1}e^{2κt}`` seeding effect above.  Precision first: the test is
   *not tested* when its resolution ``t_crit · max s.e.`` exceeds 10 %
   (``verdict._RESOLUTION``) of the range of the mean ODE risk over ``W`` (too few
   replicas to see a wrong theory; the default run resolves about 1 %).
2. **Band coverage** (``band``): the fraction of (replica, time) pairs at which
   each replica's ODE risk lies inside the SGD band must be at least the
   coverage expected for a curve distributed like the replicas,
   ``(R − 1)(hi − lo)/100/(R + 1)``, minus ``0.10`` (``verdict._BAND_MARGIN``: the
   ODE curves are shifted by the O(1/κ) escape-time difference above).
3. **Finite-size exponent** (``finite_size_exponent``, :func:`validate` only):
   ``|b + ½| <= z_{1−alpha/2} s.e.(b) + 0.1`` (``verdict._FSS_TOL``: the O(N^{-1})
   bias of the deviation bends the log–log line over two decades); not tested
   when ``s.e.(b) > 0.1``.
4. **Escape-time shift** (``escape_time``, with an escape analysis): the mean
   paired difference ``d = t_esc^SGD − t_esc^ODE`` over the replicas where
   both escaped must agree with the prediction above:
   ``|d̄ − d_pred| <= t_{1−alpha/2, n−1} s.e.(d̄) + 0.1/κ`` (``verdict.ESCAPE_TOL``:
   a tenth of an e-folding time of ρ for the neglected nonlinear and
   anisotropic corrections of the linearised noise model; in every run we
   measured the gap was within the statistical part alone), and
   at most 10 % of the replicas may escape in one and not in the other.
   Not tested when fewer than half of the replicas escaped in both.
5. **Divergence** (``divergence``): SGD and the ODE diverge in the same
   replicas, up to 10 % of them.
6. **Whole run** (``whole_run_law``, ``lna_spread``; ``whole_run=True``, and
   :func:`compare` given ``N``): the replicas against the order-parameter SDE
   from the same starts, and their spread against the linear-noise
   prediction — see :mod:`symquad.studies.whole_run`, which also says how they
   enter the verdict.

Calibration (tests/test_validation_verdict.py): the default model passes;
the same SGD data compared with the ODE of a model whose learning rate is
30 % off fails, and so does the data with ρ scaled by 1.25.  Power at the
default statistics (``symquad validate``: N = 2000, 64 replicas, seed 0),
measured by comparing its SGD trajectories with the ODE of a perturbed
model: learning rate 0.105 or 0.095 instead of 0.1 fails the mean-deviation
criterion (7.1 and 4.7 s.e. against a critical 3.4), 0.11 and 0.09 fail the
mean-deviation, band and escape criteria; the true model passes all four
(1.7 s.e.; band 93.8 % against 82.1 %; escape shift −1.07 ± 0.36 against the
predicted −0.81).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from numbers import Real

import numpy as np

from ..numeric.checks import check_int as _check_int
from ..numeric.persist import json_default
from .verdict import ALPHA, ESCAPE_TOL, decide as _decide

__all__ = ["validate", "compare", "ValidationReport", "finite_size_scaling", "informed_start",
           "STARTS"]

STARTS = ("random", "informed")
_BAND_TOL = 1e-9
#: Mean-deviation window: until the median ODE ‖ρ‖² has grown by this factor.
_RHO_GROWTH = 2.0
#: Escape analysis applies to starts whose RMS entry of ρ(0) is below this.
_SMALL_RHO = 0.2


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def informed_start(model, overlap=0.5):
    """Initial overlaps of the "informed" start: ``Q(0) = I_p``, ``ρ(0) = α P``.

    ``P`` (p×p*) is the orthogonal polar factor of a fixed pseudo-random
    matrix (the same for every seed), so its singular values are all 1 and
    every student unit has a non-zero overlap with the teacher; with
    ``0 < α < 1`` the Gram matrix ``[[I, αP], [αPᵀ, I]]`` is positive definite
    (eigenvalues ``1 ± α``).  ``ρ(0)`` of order one: no plateau.  The signs of
    the rows of ``P`` are chosen so that the start is aligned with the teacher
    (:func:`_aligned_signs`; it matters for odd activations only).
    """
    if isinstance(overlap, bool) or not isinstance(overlap, Real) or not 0 < overlap < 1:
        raise ValueError(f"overlap must be in (0, 1), got {overlap!r}")
    p, ps = model.p, model.p_star
    A = np.random.default_rng(20240229).standard_normal((p, ps))
    U, _, Vt = np.linalg.svd(A, full_matrices=False)
    return np.eye(p), overlap * _aligned_signs(model, U @ Vt, overlap)


def _aligned_signs(model, P, overlap):
    """``P`` with student rows flipped (``w_k → −w_k``) while that lowers the starting risk.

    For an even activation (``σ = c z²``) the risk does not depend on the signs and
    ``P`` is returned unchanged.  For an odd one (``z³ − 3z``) a row of ``P`` whose
    correlation with the teacher has the wrong sign makes the "informed" start
    worse than the zero predictor (risk 4.85 against 3 for ``z³ − 3z`` at
    ``p = 2, p* = 1``) and puts the ODE on a saddle; flipping such rows (greedy,
    one row at a time, only on a strict decrease, ``T = I``) aligns the start.
    """
    from ..numeric.simulate import population_risk
    eye, T = np.eye(model.p), np.eye(model.p_star)

    def risk(M):
        return float(population_risk(model, eye, overlap * M, T))
    best = risk(P)
    improved = True
    while improved:
        improved = False
        for k in range(model.p):
            trial = P.copy()
            trial[k] *= -1
            value = risk(trial)
            if value < best - 1e-12 * max(1.0, abs(best)):
                P, best, improved = trial, value, True
    return P


def _ode_per_replica(model, Q0, rho0, T, t):
    """ODE trajectories from each initial state at times ``t`` (the ODE starts at ``t[0]``).

    All distinct starts are integrated in one vectorised solve
    (:func:`symquad.numeric.ode_batch.integrate_batch`, per-start divergence);
    replicas that share one start (informed start) share one trajectory.
    Returns arrays shaped like the SGD records, the status of each replica
    (``"ok"``/``"diverged"``) and whether all replicas share one start.
    """
    R = Q0.shape[0]
    same = bool(np.allclose(Q0, Q0[:1], rtol=0, atol=1e-14)
                and np.allclose(rho0, rho0[:1], rtol=0, atol=1e-14))
    tau = np.asarray(t, float) - float(t[0])
    horizon = float(tau[-1]) if tau[-1] > 0 else 1e-9
    starts = slice(0, 1) if same else slice(None)
    Q, rho, risk, status = _integrate_starts(model, Q0[starts], rho0[starts], T, horizon, tau)
    if same:
        Q, rho = np.repeat(Q, R, axis=0), np.repeat(rho, R, axis=0)
        risk, status = np.repeat(risk, R, axis=0), np.repeat(status, R)
    return Q, rho, risk, status, same


def _integrate_starts(model, Q0, rho0, T, horizon, tau):
    """Batched ODE solve of the starts; NaN after a start's divergence."""
    from ..numeric.ode_batch import integrate_batch

    sol = integrate_batch(model, Q0, rho0, T, horizon, t_eval=tau, rtol=1e-8, atol=1e-11)
    B, n = Q0.shape[0], len(tau)
    Q = np.full((B, n) + Q0.shape[1:], np.nan)
    rho = np.full((B, n) + rho0.shape[1:], np.nan)
    risk = np.full((B, n), np.nan)
    m = len(sol.t)
    Q[:, :m], rho[:, :m], risk[:, :m] = sol.Q, sol.rho, sol.risk
    return Q, rho, risk, np.asarray(sol.status)


def _overlap_deviation(Qa, rhoa, Qb, rhob):
    return np.sqrt(np.sum((Qa - Qb) ** 2, axis=(-2, -1)) + np.sum((rhoa - rhob) ** 2,
                                                                    axis=(-2, -1)))


def _rms_over(mask, values):
    """Per-replica root mean square of `values` over the masked times (NaN if none)."""
    cnt = mask.sum(-1)
    s = np.where(mask, values ** 2, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, np.sqrt(s / np.maximum(cnt, 1)), np.nan)


def _describe(x):
    """Mean, standard error, median and 5/95 % quantiles of a sample (NaN-aware)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": None, "se": None, "median": None, "q05": None, "q95": None}
    return {"n": int(x.size), "mean": float(x.mean()),
            "se": float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None,
            "median": float(np.median(x)), "q05": float(np.quantile(x, 0.05)),
            "q95": float(np.quantile(x, 0.95)), "std": float(x.std(ddof=1)) if x.size > 1
            else None}


def _escape_setup(model, T, escape_fraction):
    """Plateau fixed point and escape threshold, or (fp, None, reason)."""
    if not model.is_quadratic:
        return None, None, ("the plateau/escape analysis is for σ = c z² (this activation "
                            "has another plateau structure)")
    if not np.allclose(T, np.eye(model.p_star)):
        return None, None, "the plateau/escape analysis needs T = I"
    from ..numeric.landscape import escape_threshold, plateau
    try:
        fp = plateau(model)
    except ValueError as exc:
        return None, None, str(exc)
    if fp.rate <= 0:
        return fp, None, f"plateau is stable (rate {fp.rate:.3g} <= 0): no escape"
    return fp, float(escape_threshold(model, escape_fraction, fp)), ""


def _seeding_shift(model, q0, fp):
    """Predicted mean ``t_esc^SGD − t_esc^ODE = −log(1 + J/q0)/(2κ)`` and ``J`` (module docstring)."""
    from ..numeric.landscape import escape_prediction

    # J does not depend on N: any N gives the same seed noise
    pred = escape_prediction(model, 1000, q0=q0, sgd_noise=True, n_samples=2)
    J = float(pred.seed_noise)
    return -math.log1p(J / q0) / (2.0 * fp.rate), J
# ---------------------------------------------------------------------------
# finite-size scaling
# ---------------------------------------------------------------------------
def finite_size_scaling(model, Ns=(100, 300, 1000, 3000, 10000), t_max=10.0, replicas=64,
                        seed=0, start="informed", overlap=0.5, method="reduced",
                        n_times=51, T=None, progress=False):
    r"""Deviation SGD − ODE versus ``N`` and the fitted exponent.

    For each ``N``: ``D_r = [mean_{t ∈ (0, t_max]} D_r(t)²]^{1/2}`` (overlap
    deviation, module docstring) for every replica; ``D(N)`` is its replica
    mean with standard error ``s(N)``.  The fit ``log D = a + b log N`` uses
    the standard errors of ``log D`` (``s/D``) as absolute uncertainties.
    ``T`` (default ``I``) is the teacher overlap of the runs.

    Returns
    -------
    dict
        ``N``, ``deviation``, ``deviation_se``, ``exponent``, ``exponent_se``,
        ``intercept``, ``chi2_per_dof``, ``start``, ``t_max``, ``replicas``.
    """
    from scipy.optimize import curve_fit

    from ..numeric.simulate import simulate

    Ns = [_check_int(n, "fss N", 1) for n in Ns]
    if len(Ns) < 3:
        raise ValueError(f"finite-size scaling needs >= 3 values of N, got {Ns}")
    if max(Ns) / min(Ns) < 10:
        raise ValueError("finite-size scaling: the N values should span at least a decade")
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    kwargs = {}
    if start == "informed":
        kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
    t = np.linspace(0.0, t_max, n_times)
    dev, se = [], []
    for i, N in enumerate(Ns):
        run = simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed + 7919 * (i + 1),
                       method=method, t_eval=t, on_divergence="stop", progress=progress,
                       T=T, **kwargs)
        ok = run.status == "ok"
        if ok.sum() < 2:
            raise ValueError(f"finite-size scaling: SGD diverged at N={N} "
                             f"({run.n_diverged}/{replicas} replicas); reduce lr")
        Q, rho, _, _, _ = _ode_per_replica(model, run.Q[ok, 0], run.rho[ok, 0], run.T, run.t)
        d = _overlap_deviation(run.Q[ok], run.rho[ok], Q, rho)
        per = _rms_over(np.broadcast_to(run.t > 0, d.shape), d)
        dev.append(float(per.mean()))
        se.append(float(per.std(ddof=1) / math.sqrt(per.size)))
    dev, se = np.array(dev), np.array(se)
    x, y, sy = np.log(Ns), np.log(dev), se / dev
    (b, a), cov = curve_fit(lambda x, b, a: a + b * x, x, y, p0=(-0.5, float(y[0] + 0.5 * x[0])),
                            sigma=sy, absolute_sigma=True)
    resid = (y - (a + b * x)) / sy
    return {"N": [int(n) for n in Ns], "deviation": dev.tolist(), "deviation_se": se.tolist(),
            "exponent": float(b), "exponent_se": float(math.sqrt(cov[0, 0])),
            "intercept": float(a), "chi2_per_dof": float(np.sum(resid ** 2) / (len(Ns) - 2)),
            "start": start, "t_max": float(t_max), "replicas": int(replicas),
            "measure": "replica mean of the RMS over t in (0, t_max] of "
                       "(||Q_SGD-Q_ODE||_F^2 + ||rho_SGD-rho_ODE||_F^2)^(1/2)"}


# ---------------------------------------------------------------------------
# analysis of SGD (or user) trajectories against the ODE
# ---------------------------------------------------------------------------
def _escape_applies(model, T, rho0, risk0, escape, escape_fraction):
    """Resolve ``escape`` (True/False/None = auto) to (fp, threshold, reason)."""
    fp, threshold, reason = _escape_setup(model, T, escape_fraction)
    if threshold is None or escape is True:
        return fp, threshold, reason
    if escape is False:
        return None, None, "no plateau: the start is not near ρ = 0"
    rms = float(np.median(np.sqrt(np.mean(rho0 ** 2, axis=(-2, -1)))))
    if rms > _SMALL_RHO:
        return fp, None, (f"the start is not near the plateau's ρ = 0 (median RMS entry of "
                          f"ρ(0) {rms:.3g} > {_SMALL_RHO})")
    if np.min(risk0) <= threshold:
        return fp, None, "the start is already below the escape threshold"
    return fp, threshold, ""


def _mean_deviation_window(t, ode_rho, escape_defined):
    """Times (mask) of the mean-deviation test and the window's end (module docstring, 1)."""
    after_start = t > t[0]
    if not escape_defined:
        return after_start, float(t[-1])
    r2 = np.median(np.sum(ode_rho ** 2, axis=(-2, -1)), axis=0)
    grown = np.nonzero(r2 >= _RHO_GROWTH * r2[0])[0]
    end = grown[0] if grown.size else len(t)
    mask = after_start & (np.arange(len(t)) < end)
    return mask, float(t[max(end - 1, 0)])


def _analyse(model, t, sgd_Q, sgd_rho, sgd_risk, sgd_ok, T, *, band, escape_fraction, escape,
             progress):
    """ODE from every replica's start and all summary numbers (no verdict)."""
    tick = time.perf_counter()
    oQ, orho, orisk, ostatus, shared = _ode_per_replica(model, sgd_Q[:, 0], sgd_rho[:, 0], T, t)
    t_ode = time.perf_counter() - tick
    good = sgd_ok & (ostatus == "ok")
    n_good = int(good.sum())
    numbers = {"diverged_replicas": int(np.sum(~sgd_ok)),
               "ode_diverged_replicas": int(np.sum(ostatus != "ok")),
               "divergence_disagreements": int(np.sum(sgd_ok != (ostatus == "ok"))),
               "replicas_used": n_good}
    if n_good < 1:
        raise ValueError("no replica where both SGD and the ODE stayed finite: nothing to "
                         "compare (reduce lr)")
    d_risk = sgd_risk - orisk
    d_ov = _overlap_deviation(sgd_Q, sgd_rho, oQ, orho)

    fp, threshold, reason = _escape_applies(model, T, sgd_rho[:, 0], sgd_risk[:, 0], escape,
                                            escape_fraction)
    esc = {"defined": threshold is not None, "reason": reason}
    if threshold is not None:
        from ..numeric.landscape import escape_times
        ts = escape_times(t, sgd_risk[good], threshold)
        to = escape_times(t, orisk[good], threshold)
        q0 = float(np.mean(np.trace(sgd_Q[good, 0], axis1=-2, axis2=-1)) / model.p)
        shift, J = _seeding_shift(model, q0, fp)
        # A replica that escaped in only one of SGD and the ODE, close to the end
        # of the record, is censored, not a disagreement: the other would be
        # expected to escape within the escape-time jitter, after t_max.
        both = np.isfinite(ts) & np.isfinite(to)
        jitter = float(np.std(ts[both] - to[both])) if both.sum() >= 2 else 0.0
        margin = abs(shift) + 3.0 * jitter + ESCAPE_TOL / float(fp.rate)
        one_only = np.isfinite(ts) != np.isfinite(to)
        first = np.fmin(ts, to)
        censored = np.isfinite(first) & (first > float(t[-1]) - margin)
        esc.update({
            "plateau_risk": float(fp.risk), "plateau_q": float(fp.q),
            "plateau_rate": float(fp.rate), "threshold": threshold,
            "fraction": escape_fraction, "replicas": n_good,
            "sgd_escaped": int(np.isfinite(ts).sum()), "ode_escaped": int(np.isfinite(to).sum()),
            "escaped_in_one_only": int(np.sum(one_only & ~censored)),
            "escaped_in_one_only_censored": int(np.sum(one_only & censored)),
            "censoring_margin": margin,
            "sgd": _describe(ts), "ode": _describe(to), "difference": _describe(ts - to),
            "predicted_difference": shift, "seed_noise_J": J, "q0": q0,
            "sgd_times": _finite_or_none(ts), "ode_times": _finite_or_none(to),
            "definition": "first time the risk falls below plateau_risk - fraction * "
                          "(plateau_risk - minimum_risk), linear interpolation between records",
        })
        t_split = np.where(np.isfinite(to), to, np.inf)[:, None]
    else:
        t_split = np.full((n_good, 1), np.inf)
    numbers["escape"] = esc

    # deviations by phase
    tt = np.broadcast_to(t, (n_good, len(t)))
    phases = {"whole_run": np.ones_like(tt, bool)}
    if threshold is not None:
        phases.update(before_escape=tt < t_split, after_escape=tt >= t_split)
    dev = {}
    for name, mask in phases.items():
        dev[name] = {"risk_rms": _describe(_rms_over(mask, d_risk[good])),
                     "overlap_rms": _describe(_rms_over(mask, d_ov[good])),
                     "risk_max_abs": _describe(np.where(mask, np.abs(d_risk[good]), 0).max(-1))}
    numbers["deviation"] = dev

    # bands and the mean deviation
    sr = sgd_risk[good]
    lo, hi = np.percentile(sr, band[0], axis=0), np.percentile(sr, band[1], axis=0)
    scale = np.maximum(1.0, np.abs(sr).max(0))
    oc = orisk[good]
    inside = (oc >= lo - _BAND_TOL * scale) & (oc <= hi + _BAND_TOL * scale)
    inside_t = inside[0] if shared else inside.mean(0)
    mean_dev = d_risk[good].mean(0)
    se = d_risk[good].std(0, ddof=1) / math.sqrt(n_good) if n_good > 1 \
        else np.full(len(t), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(mean_dev) / se,
                     np.where(np.abs(mean_dev) <= _BAND_TOL * scale, 0.0, np.inf))
    pre = t < np.min(t_split)
    numbers["band_before_escape"] = {
        "t_end": float(t[pre][-1]) if pre.any() else None,
        "max_mean_z": _finite_float(np.max(z[pre])) if pre.any() else None,
        "max_abs_mean_risk_deviation": float(np.max(np.abs(mean_dev[pre]))) if pre.any()
        else None,
        "max_se": _finite_float(np.max(se[pre])) if pre.any() else None,
        "description": "mean over replicas of risk_SGD - risk_ODE(own start) at times before "
                       "the earliest ODE escape, in standard errors",
    }
    after = t > t[0]
    numbers["band"] = {
        "percentiles": [float(band[0]), float(band[1])],
        "ode_inside_fraction": float(np.mean(inside_t[after])) if after.any() else 1.0,
        "expected_inside_fraction": _exchangeable_coverage(n_good, band),
        "ode_outside_times": [float(x) for x in t[np.asarray(inside_t) < 1]][:50],
        "max_mean_z": _finite_float(np.max(z)),
        "max_se": _finite_float(np.max(se)),
        "mean_inside_3se_fraction": float(np.mean(z <= 3)),
        "description": ("replica band of the SGD risk; for a random start each replica's "
                        "own ODE is tested against the band" if not shared else
                        "replica band of the SGD risk vs the (common) ODE risk"),
    }
    window, t_end = _mean_deviation_window(t, orho[good], threshold is not None)
    omean = oc.mean(0)
    numbers["mean_deviation"] = {
        "t_start": float(t[window][0]) if window.any() else None, "t_end": t_end,
        "times": int(window.sum()),
        "max_z": _finite_float(np.max(z[window])) if window.any() else None,
        "t_at_max_z": float(t[window][np.argmax(z[window])]) if window.any() else None,
        "max_se": _finite_float(np.max(se[window])) if window.any() else None,
        "max_abs_mean_deviation": float(np.max(np.abs(mean_dev[window]))) if window.any()
        else None,
        "ode_risk_range": float(np.ptp(omean[window | (t == t[0])])),
        "window": ("relaxation onto the plateau: times before the median ODE |rho|^2 has "
                   f"grown {_RHO_GROWTH:g}-fold" if threshold is not None else "whole run"),
    }
    numbers["final_risk"] = {"sgd": _describe(sr[:, -1]), "ode": _describe(oc[:, -1])}
    arrays = dict(ode_Q=oQ, ode_rho=orho, ode_risk=orisk)
    return numbers, arrays, shared, t_ode


def _exchangeable_coverage(R, band):
    """Chance that a curve distributed like the R replicas lies in their percentile band.

    With ``R`` exchangeable values and a band between the empirical percentiles
    ``lo, hi`` (linear interpolation, so between order statistics of rank
    ``1 + (R − 1) lo/100`` and ``1 + (R − 1) hi/100``), a new value falls inside
    with probability ``(R − 1)(hi − lo)/100 / (R + 1)`` — exactly for uniform
    values (the interpolation is then linear in the CDF), and slightly less
    than the truth for bell-shaped ones (0.014 at R = 8, Gaussian), which makes
    the band criterion lenient by that much.
    """
    return float((R - 1) * (band[1] - band[0]) / 100.0 / (R + 1)) if R > 1 else 0.0


def _finite_float(x):
    x = float(x)
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
_ARRAYS = ("t", "sgd_risk", "ode_risk", "sgd_Q", "ode_Q", "sgd_rho", "ode_rho", "T")
_FORMAT_VERSION = 1


@dataclass(repr=False)
class ValidationReport:
    """Result of :func:`validate` / :func:`compare`: configuration, numbers, verdict, trajectories.

    Attributes
    ----------
    config : dict
        Model and run parameters.
    numbers : dict
        All summary numbers (JSON-serialisable): deviations before/after the
        escape, band coverage, escape-time statistics, finite-size scaling and
        ``numbers["verdict"]`` (the criteria with their values).
    t : ndarray (n,)
    sgd_risk, ode_risk : ndarray (replicas, n)
    sgd_Q, ode_Q : ndarray (replicas, n, p, p)
    sgd_rho, ode_rho : ndarray (replicas, n, p, p*)
    T : ndarray (p*, p*)
        Teacher overlaps.
    invariant_study : dict or None
        Raw data of the drift study of ``S`` (for its figure).
    """

    config: dict
    numbers: dict
    t: np.ndarray
    sgd_risk: np.ndarray
    ode_risk: np.ndarray
    sgd_Q: np.ndarray
    ode_Q: np.ndarray
    sgd_rho: np.ndarray
    ode_rho: np.ndarray
    T: np.ndarray | None = None
    invariant_study: dict | None = None

    # -- verdict --------------------------------------------------------------
    @property
    def verdict(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"`` (module docstring, Verdict)."""
        return self.numbers["verdict"]["verdict"]

    @property
    def passed(self) -> bool:
        """True when the verdict is PASS."""
        return bool(self.numbers["verdict"]["passed"])

    @property
    def reasons(self) -> list:
        """One line per criterion: ``"pass: …"``, ``"FAIL: …"`` or ``"not tested: …"``."""
        label = {"pass": "pass", "fail": "FAIL", "not tested": "not tested"}
        return [f"{label[c['status']]}: {c['text']}" for c in self.numbers["verdict"]["checks"]]

    def __repr__(self) -> str:
        c = self.config
        checks = self.numbers["verdict"]["checks"]
        npass = sum(ch["status"] == "pass" for ch in checks)
        size = f"N={c['N']}, " if c.get("N") is not None else ""
        return (f"ValidationReport({self.verdict}: {npass}/{len(checks)} criteria passed; "
                f"{c['model']}; {size}replicas={self.sgd_risk.shape[0]}, "
                f"times={self.t.shape[0]}, t_max={self.t[-1]:.4g}, source={c['source']})")

    # -- numbers --------------------------------------------------------------
    def to_dict(self) -> dict:
        """Configuration and numbers (a copy; no trajectories)."""
        return json.loads(self.to_json())

    def to_json(self, indent=2) -> str:
        """The configuration and all numbers as a JSON string."""
        return json.dumps({"format": _report_format(), "format_version": _FORMAT_VERSION,
                           "config": self.config, "numbers": self.numbers}, indent=indent,
                          allow_nan=False, default=json_default)

    def summary(self) -> str:
        """Printable summary table, ending with the verdict and its reasons."""
        c, n = self.config, self.numbers
        lines = [f"symquad validate: {c['model']}"]
        if c["source"] == "simulation":
            lines.append(f"  N={c['N']}, replicas={c['replicas']}, t_max={c['t_max']:g}, "
                         f"start={c['start']}, method={c['method']}, seed={c['seed']}")
        else:
            lines.append(f"  {c['source']}: replicas={c['replicas']}, {len(self.t)} times in "
                         f"[{self.t[0]:g}, {self.t[-1]:g}]")
        if n["diverged_replicas"] or n["ode_diverged_replicas"]:
            lines.append(f"  WARNING: SGD diverged in {n['diverged_replicas']} replicas, the ODE "
                         f"in {n['ode_diverged_replicas']} (excluded from the statistics)")
        lines.append("")
        lines.append(f"  {'quantity':44s} {'mean':>10s} {'5%':>10s} {'95%':>10s}")
        for phase in ("whole_run", "before_escape", "after_escape"):
            for key, label in (("risk_rms", "|risk SGD-ODE| (RMS in t)"),
                               ("overlap_rms", "overlap deviation (RMS in t)")):
                d = n["deviation"].get(phase, {}).get(key)
                if d and d["n"]:
                    lines.append(f"  {label + ', ' + phase.replace('_', ' '):44s} "
                                 f"{d['mean']:10.3g} {d['q05']:10.3g} {d['q95']:10.3g}")
        b = n["band"]
        lines.append(f"  ODE risk inside the SGD {b['percentiles'][0]:g}-{b['percentiles'][1]:g}% "
                     f"band: {100 * b['ode_inside_fraction']:.1f}% of times")
        if b["max_mean_z"] is not None:
            lines.append(f"  max |mean SGD risk - ODE| / s.e., whole run: {b['max_mean_z']:.2f} "
                         f"(inside ±3 s.e. at {100 * b['mean_inside_3se_fraction']:.1f}% of "
                         f"times; the verdict tests the pre-escape window below)")
        e = n["escape"]
        if e.get("defined"):
            s, o, dd = e["sgd"], e["ode"], e["difference"]
            lines.append(f"  plateau risk {e['plateau_risk']:.4g}, escape threshold "
                         f"{e['threshold']:.4g}, plateau rate {e['plateau_rate']:.4g}")
            if s["n"]:
                lines.append(f"  escape time SGD: mean {s['mean']:.4g} ± {s['std'] or 0:.3g} "
                             f"(5-95%: {s['q05']:.4g}-{s['q95']:.4g}), escaped "
                             f"{e['sgd_escaped']}/{e['replicas']}")
            if o["n"]:
                lines.append(f"  escape time ODE: mean {o['mean']:.4g} ± {o['std'] or 0:.3g}, "
                             f"escaped {e['ode_escaped']}/{e['replicas']}")
            if dd["n"]:
                lines.append(f"  t_esc(SGD) - t_esc(ODE), same replica: mean {dd['mean']:.3g} "
                             f"± {dd['se'] or 0:.2g} (s.e.), std {dd['std'] or 0:.3g}; "
                             f"predicted {e['predicted_difference']:.3g}")
                lines.append("  (SGD noise on the plateau is as large as rho(0) ~ N^-1/2: it "
                             "shifts the escape by O(1/kappa) at any N, earlier on average)")
            after = n["deviation"].get("after_escape", {}).get("overlap_rms", {})
            if after.get("n") and c["p"] > c["p_star"]:
                lines.append("  after the escape the overlaps differ by O(1) while the risks "
                             "agree: SGD and the ODE reach different points of the zero-risk "
                             "manifold (dimension p p* - p*(p*+1)/2 > 0 for p > p*)")
        else:
            lines.append(f"  escape: not analysed ({e.get('reason', '')})")
        f = n.get("finite_size_scaling")
        if f:
            lines.append(f"  finite-size scaling ({f['start']} start, N={f['N'][0]}..{f['N'][-1]}): "
                         f"deviation ~ N^({f['exponent']:.3f} ± {f['exponent_se']:.3f}) "
                         f"[theory -1/2], chi2/dof {f['chi2_per_dof']:.2f}")
        inv = n.get("invariant_drift")
        if inv:
            lines.append("  implicit bias: " + inv["text"].replace("\n", "\n  "))
        elif n.get("invariant_drift_skipped"):
            lines.append(f"  implicit bias: drift study skipped ({n['invariant_drift_skipped']})")
        if n.get("runtime_s") is not None:
            lines.append(f"  runtime: {n['runtime_s']:.1f} s")
        lines.append("")
        lines.append(f"  VERDICT: {self.verdict}")
        lines.extend(f"    {r}" for r in self.reasons)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- figures and files ------------------------------------------------------
    def figures(self) -> dict:
        """Matplotlib figures ``{"risk", "overlaps", "fss", "escape"}`` of the report.

        Built with the object-oriented API: no global backend switch, nothing
        left open in pyplot.
        """
        from ..plotting import validation_figures

        return validation_figures(self)

    def save(self, folder="symquad_report", figures=True) -> dict:
        """Write the report folder atomically; return ``{name: path}`` of the files written.

        Files: ``report.json`` (configuration, numbers, verdict), ``summary.txt``,
        ``trajectories.npz`` (all arrays), ``invariant_study.npz`` when the drift
        study ran, and PNG figures (``figures=False`` skips them).  Everything
        is written into a temporary folder beside `folder`, which then replaces
        `folder` whole (one rename; see "Report folders" in the README): an interrupted save
        leaves the previous folder untouched, and no figure of an older run
        survives next to a new report.  `folder` is checked first: an existing
        file, a non-empty folder that is not a symquad report, or an unwritable
        location raise ValueError.
        """
        from .report_io import write_folder_atomically

        names = {}

        def write(tmp):
            names.update(self._write_files(tmp, figures))

        dest = write_folder_atomically(folder, write, name="folder")
        return {key: os.path.join(dest, name) for key, name in names.items()}

    def _write_files(self, folder, figures) -> dict:
        from ..plotting import plot_invariant_drift, save_figure
        from .report_io import split_arrays

        names = {"json": "report.json", "summary": "summary.txt",
                 "trajectories": "trajectories.npz"}
        head = json.loads(self.to_json())
        study_arrays = {}
        if self.invariant_study is not None:
            head["invariant_study"] = split_arrays(self.invariant_study, study_arrays)
            names["invariant_study"] = "invariant_study.npz"
        with open(os.path.join(folder, names["json"]), "w", encoding="utf-8") as fh:
            json.dump(head, fh, indent=2, allow_nan=False)
        with open(os.path.join(folder, names["summary"]), "w", encoding="utf-8") as fh:
            fh.write(self.summary() + "\n")
        arrays = {k: getattr(self, k) for k in _ARRAYS if getattr(self, k) is not None}
        np.savez_compressed(os.path.join(folder, names["trajectories"]), **arrays)
        if study_arrays:
            np.savez_compressed(os.path.join(folder, names["invariant_study"]), **study_arrays)
        if figures:
            for name, fig in self.figures().items():
                names[name] = f"{name}.png"
                save_figure(fig, os.path.join(folder, names[name]))
            if self.invariant_study is not None:
                names["invariant_drift"] = "invariant_drift.png"
                plot_invariant_drift(self.invariant_study,
                                     os.path.join(folder, names["invariant_drift"]))
        return names

    @classmethod
    def load(cls, folder) -> "ValidationReport":
        """Read a report folder written by :meth:`save` (arrays loaded without pickle)."""
        from .report_io import _as_path, join_arrays

        path = _as_path(folder)
        try:
            with open(os.path.join(path, "report.json"), encoding="utf-8") as fh:
                head = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"{folder!r} is not a report folder (no report.json)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{folder!r}: report.json is not valid JSON ({exc})") from None
        if not isinstance(head, dict) or head.get("format") != _report_format():
            raise ValueError(f"{folder!r}: report.json is not a symquad ValidationReport")
        if head.get("format_version", 0) > _FORMAT_VERSION:
            raise ValueError(f"{folder!r}: report format version {head['format_version']} is "
                             f"newer than this symquad reads ({_FORMAT_VERSION})")
        with np.load(os.path.join(path, "trajectories.npz"), allow_pickle=False) as data:
            missing = [k for k in _ARRAYS[:-1] if k not in data.files]
            if missing:
                raise ValueError(f"{folder!r}: trajectories.npz lacks {missing}")
            arrays = {k: data[k] for k in _ARRAYS if k in data.files}
        study = None
        if "invariant_study" in head:
            with np.load(os.path.join(path, "invariant_study.npz"), allow_pickle=False) as data:
                study = join_arrays(head["invariant_study"], {k: data[k] for k in data.files})
        return cls(config=head["config"], numbers=head["numbers"], invariant_study=study,
                   **arrays)


def _report_format():
    from .report_io import REPORT_FORMAT

    return REPORT_FORMAT


def _finite_or_none(values):
    return [float(v) if np.isfinite(v) else None for v in values]


# ---------------------------------------------------------------------------
# validate and compare
# ---------------------------------------------------------------------------
def _check_common(band, escape_fraction, alpha):
    if not (isinstance(band, (tuple, list)) and len(band) == 2
            and all(isinstance(x, Real) and not isinstance(x, bool) for x in band)
            and 0 <= band[0] < band[1] <= 100):
        raise ValueError(f"band must be two percentiles 0 <= lo < hi <= 100, got {band!r}")
    if isinstance(escape_fraction, bool) or not isinstance(escape_fraction, Real) \
            or not 0 < escape_fraction < 1:
        raise ValueError(f"escape_fraction must be in (0, 1), got {escape_fraction!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")


def _model_config(model):
    return {"model": repr(model), "p": model.p, "p_star": model.p_star, "lr": model.lr,
            "eta": model.eta, "noise": model.noise, "activation": model.activation_str,
            "lr_scaling": model.lr_scaling}


def validate(model=None, N=2000, t_max=None, replicas=64, start=None, seed=0, *,
             T=None, Q0=None, rho0=None, method="reduced", n_times=201, band=(2.5, 97.5),
             escape_fraction=0.5, overlap=0.5, alpha=ALPHA, fss=True, fss_N=None,
             fss_t_max=None, fss_replicas=None, fss_start="informed", invariant=True,
             invariant_N=(250, 500, 1000, 2000), invariant_replicas=16, workers=1,
             progress=False, whole_run=True):
    r"""Compare SGD with the ODE theory for `model`; return a :class:`ValidationReport`.

    The report carries a PASS/FAIL verdict (``report.passed``,
    ``report.reasons``; criteria in the module docstring).

    Parameters
    ----------
    model : symquad.Model, optional
        Default :data:`symquad.spec.DEFAULT_MODEL`.
    N : int
        Input dimension of the SGD runs (``>= 1``).
    t_max : float, optional
        Final time.  Default: for a random start with an escape,
        ``2.5 · log(N) / (2κ)`` (κ the plateau growth rate of ρ, so the
        escape, predicted at ``≈ log(N)/(2κ)`` plus a relaxation, is inside the
        window); otherwise ``10/η``.
    replicas : int
        Independent SGD runs (``>= 2``).
    start : {"random", "informed"}, optional
        ``"random"``: ``w_k ~ N(0, I)`` (plateau and escape);
        ``"informed"``: ``Q(0) = I``, ``ρ(0) = α P`` with ``α`` = `overlap` and
        ``P`` a fixed p×p* matrix with orthonormal columns (no plateau).
        Default: ``"random"`` for ``σ = c z²``; ``"informed"`` for other
        activations, whose plateau from a random start lasts far longer (the
        escape analysis is for ``σ = c z²``).  Not with `Q0`/`rho0`.
    seed : int
        Seed of the simulations (the same seed gives the same report numbers).
    T : array (p*, p*), optional
        Teacher overlaps (symmetric PSD); default ``I``.
    Q0, rho0 : arrays, optional
        Initial overlaps, ``(p, p)``/``(p, p*)`` or with a leading replicas
        axis (checked: shapes, finiteness, symmetry, PSD Gram matrix with `T`).
        The escape analysis is then done when it applies (σ = c z², T = I,
        small ρ(0), start above the escape threshold).
    method : {"reduced", "full"}
        Simulator (see :func:`symquad.simulate`).
    n_times : int
        Number of recorded times.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold ``ε_pl − f(ε_pl − ε_min)``.
    overlap : float
        ``α`` of the informed start.
    alpha : float
        Family-wise level of the verdict's tests, in ``(0, 0.5)``.
    fss : bool
        Run the finite-size scaling.
    fss_N, fss_t_max, fss_replicas, fss_start
        Finite-size scaling: N values (default 100, 300, 1000, 3000, 10000),
        time window (default ``min(t_max, max(5, 2/η))``), replicas (default
        `replicas`) and start (default ``"informed"``, see the module docstring).
    invariant : bool
        Measure the drift of the implicit-bias invariant ``S = ρ(ρᵀρ)^(-1/2)``
        along SGD as a function of N (random start from a time after the early
        re-randomisation, and an informed start), with a fitted exponent; see
        :func:`symquad.invariant_drift_study`.  Needs
        ``p >= p*`` and ``σ = c z²`` (skipped otherwise, with the reason in
        ``numbers["invariant_drift_skipped"]``).  Reported, not part of the
        verdict.
    invariant_N, invariant_replicas
        The N values and replicas per N of that study (t_max as the main run).
    workers : int
        Processes (``>= 1``, default 1): with ``workers > 1`` the finite-size
        scaling and the drift study run in spawned worker processes (up to
        ``workers − 1`` of them) while this one runs the main comparison.
        The numbers do not depend on it (every study has its own seeds).  It
        pays only on idle cores: each worker costs an interpreter start
        (about 2 s of CPU), and on our shared 2-core machine (load ≈ 3) the
        default run took 28.3 s with 3 workers against 26.0 s serially
        (``benchmarks/bench_validate.py --workers 1``).  Inside a daemonic
        process (e.g. a pool worker) the studies always run serially.
    progress : bool
        tqdm progress bars (main comparison only when studies run in workers).
    whole_run : bool
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`): SGD
        against the order-parameter SDE from the same starts, and the replica
        spread against the linear-noise prediction.

    Returns
    -------
    ValidationReport
    """
    from ..numeric.simulate import simulate
    from ..spec import DEFAULT_MODEL, check_model

    t_start = time.perf_counter()
    model = DEFAULT_MODEL if model is None else model
    check_model(model)
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 2)
    n_times = _check_int(n_times, "n_times", 3)
    _check_common(band, escape_fraction, alpha)
    given = Q0 is not None or rho0 is not None
    if given and (Q0 is None or rho0 is None):
        raise ValueError("Q0 and rho0 must be given together")
    if start is None:
        start = "given" if given else ("random" if model.is_quadratic else "informed")
        start_reason = "default for this activation" if not given else "Q0, rho0 given"
    else:
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        if given:
            raise ValueError(f"give either start={start!r} or Q0/rho0, not both")
        start_reason = "requested"
    T = np.eye(model.p_star) if T is None else _check_teacher(model, T)
    if given:
        _check_start(model, Q0, rho0, T)
    if fss and fss_start not in STARTS:
        raise ValueError(f"fss_start must be one of {STARTS}, got {fss_start!r}")
    if (start == "informed" or (fss and fss_start == "informed")):
        from ..numeric.checks import as_overlaps
        as_overlaps(model, *informed_start(model, overlap), T,
                    names=("informed Q0", "informed rho0 (overlap)", "T"))

    escape = {"random": None, "informed": False, "given": None}[start]
    fp, threshold = None, None
    if start != "informed":
        fp, threshold, _ = _escape_setup(model, T, escape_fraction)
    if t_max is None:
        if threshold is not None:
            t_max = float(np.ceil(2.5 * math.log(max(N, 2)) / (2 * fp.rate)))
        else:
            t_max = float(np.ceil(10.0 / model.eta))
    if isinstance(t_max, bool) or not isinstance(t_max, Real) or not math.isfinite(t_max) \
            or t_max <= 0:
        raise ValueError(f"t_max must be a finite number > 0, got {t_max!r}")
    t_max = float(t_max)
    if fss:
        fss_N = list(fss_N) if fss_N is not None else [100, 300, 1000, 3000, 10000]
        fss_t = float(fss_t_max) if fss_t_max is not None \
            else float(min(t_max, max(5.0, 2.0 / model.eta)))
        _check_fss_args(fss_N, fss_t, fss_replicas)

    jobs = {}
    if fss:
        jobs["finite_size_scaling"] = (finite_size_scaling, dict(
            model=model, Ns=fss_N, t_max=fss_t, replicas=fss_replicas or replicas, seed=seed,
            start=fss_start, overlap=overlap, method=method, T=T))
    skipped = None
    if invariant and not (model.p >= model.p_star and model.is_quadratic):
        skipped = ("the conservation of S is a result for sigma = c z^2" if not model.is_quadratic
                   else "S = rho (rho^T rho)^(-1/2) needs p >= p_star")
    elif invariant:
        # docs/model.md §8.4 at finite N: drift of S = rho (rho^T rho)^(-1/2) vs N
        from .invariant_drift import invariant_drift_study
        jobs["invariant_drift"] = (invariant_drift_study, dict(
            model=model, Ns=list(invariant_N), t_max=t_max, replicas=invariant_replicas,
            seed=seed, method=method, T=T))
    workers = _resolve_workers(workers, len(jobs))

    phases = {}
    with _StudyRunner(jobs, workers, progress) as studies:
        tick = time.perf_counter()
        kwargs = {"T": T}
        if start == "informed":
            kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
        elif given:
            kwargs["Q0"], kwargs["rho0"] = Q0, rho0
        t_eval = np.linspace(0.0, t_max, n_times)
        run = simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed, method=method,
                       t_eval=t_eval, on_divergence="stop", progress=progress, **kwargs)
        phases["sgd"] = time.perf_counter() - tick
        ok = run.status == "ok"
        if ok.sum() < 2:
            from ..numeric.errors import DivergenceError
            raise DivergenceError(
                f"validate: SGD diverged in {run.n_diverged}/{replicas} replicas (first at "
                f"t = {np.nanmin(run.t_diverged):.4g}); reduce lr", np.nanmin(run.t_diverged),
                {k: v[0] for k, v in run.last_finite.items()}, partial=run)
        tick = time.perf_counter()
        numbers, ode, shared, phases["ode"] = _analyse(
            model, run.t, run.Q, run.rho, run.risk, ok, run.T, band=band,
            escape_fraction=escape_fraction, escape=escape, progress=progress)
        phases["analysis"] = time.perf_counter() - tick - phases["ode"]
        results, study_times = studies.results()
    phases.update(study_times)
    if fss:
        numbers["finite_size_scaling"] = results["finite_size_scaling"]
    study = results.get("invariant_drift")
    if study is not None:
        from .invariant_drift import summarize_drift_study
        numbers["invariant_drift"] = summarize_drift_study(study)
    if skipped:
        numbers["invariant_drift_skipped"] = skipped
    numbers["verdict"] = _decide(numbers, replicas, alpha)
    if whole_run:
        from .whole_run import add_whole_run
        tick = time.perf_counter()
        numbers["verdict"] = add_whole_run(numbers, model, run.t, run.Q[ok], run.rho[ok],
                                           run.risk[ok], run.T, N, alpha, seed=seed,
                                           shared=shared)
        phases["whole_run"] = time.perf_counter() - tick
    numbers["runtime_s"] = time.perf_counter() - t_start
    numbers["runtime_phases_s"] = phases

    config = {**_model_config(model), "source": "simulation", "N": N, "t_max": t_max,
              "replicas": replicas, "start": start, "start_reason": start_reason, "seed": seed,
              "workers": workers,
              "method": method, "n_times": n_times,
              "overlap": overlap if start == "informed" else None,
              "T_is_identity": bool(np.array_equal(T, np.eye(model.p_star))),
              "replicas_share_ode": bool(shared), "alpha": alpha,
              "ode_start": ("common initial overlaps (realised exactly by the simulator)"
                            if shared else "each replica's realised initial overlaps")}
    return ValidationReport(config=config, numbers=numbers, t=run.t, sgd_risk=run.risk,
                            sgd_Q=run.Q, sgd_rho=run.rho, T=np.asarray(run.T, float),
                            invariant_study=study, **ode)


def _resolve_workers(workers, n_jobs):
    """Number of processes for `n_jobs` studies (see :func:`validate`, `workers`)."""
    import multiprocessing

    workers = _check_int(workers, "workers", 1)
    if n_jobs == 0 or multiprocessing.current_process().daemon:
        return 1
    return min(workers, n_jobs + 1)


class _StudyRunner:
    """Run the side studies (name -> (function, kwargs)) serially or in worker processes.

    With ``workers > 1`` the studies are submitted to a process pool (spawned
    interpreters: no fork of a process that may hold compiled-code threads)
    when the context is entered, and collected by :meth:`results`; the caller
    does its own work in between.  With ``workers == 1`` they run inside
    :meth:`results`.  Leaving the context early (an error, an interrupt)
    cancels what has not started and waits for the workers to exit.
    """

    def __init__(self, jobs, workers, progress):
        self.jobs, self.workers, self.progress = jobs, workers, progress
        self.pool, self.futures = None, {}

    def __enter__(self):
        if self.workers > 1 and self.jobs:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=min(self.workers - 1, len(self.jobs)),
                                            mp_context=multiprocessing.get_context("spawn"))
            self.futures = {name: self.pool.submit(_timed_call, fn, kwargs)
                            for name, (fn, kwargs) in self.jobs.items()}
        return self

    def results(self):
        out, times = {}, {}
        for name, (fn, kwargs) in self.jobs.items():
            if self.pool is not None:
                out[name], times[name] = self.futures[name].result()
            else:
                out[name], times[name] = _timed_call(fn, dict(kwargs, progress=self.progress))
        return out, times

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return False


def _timed_call(fn, kwargs):
    tick = time.perf_counter()
    value = fn(**kwargs)
    return value, time.perf_counter() - tick


def _check_teacher(model, T):
    """``T`` checked as teacher overlaps (shape, finite, symmetric PSD)."""
    from ..numeric.checks import as_overlaps

    # with Q = I and rho = 0 the Gram matrix is PSD exactly when T is
    return as_overlaps(model, np.eye(model.p), np.zeros((model.p, model.p_star)), T)[2]


def _check_start(model, Q0, rho0, T):
    """Check initial overlaps (one start or one per replica) before any simulation."""
    from ..numeric.checks import as_overlaps

    Q0, rho0 = np.asarray(Q0), np.asarray(rho0)
    if Q0.ndim == 2 and rho0.ndim == 2:
        as_overlaps(model, Q0, rho0, T)
        return
    if Q0.ndim != 3 or rho0.ndim != 3 or Q0.shape[0] != rho0.shape[0]:
        raise ValueError(f"Q0 and rho0 must be (p, p) and (p, p*) or carry the same leading "
                         f"replicas axis; got shapes {Q0.shape} and {rho0.shape}")
    for r in range(Q0.shape[0]):
        as_overlaps(model, Q0[r], rho0[r], T, names=(f"Q0[{r}]", f"rho0[{r}]", "T"))


def _check_fss_args(Ns, t_max, replicas):
    for n in Ns:
        _check_int(n, "fss_N entries", 1)
    if len(Ns) < 3:
        raise ValueError(f"finite-size scaling needs >= 3 values of N (fss_N), got {Ns}")
    if max(Ns) / min(Ns) < 10:
        raise ValueError("finite-size scaling: the N values (fss_N) should span at least a "
                         "decade")
    if not (isinstance(t_max, Real) and math.isfinite(t_max) and t_max > 0):
        raise ValueError(f"fss_t_max must be a finite number > 0, got {t_max!r}")
    if replicas is not None:
        _check_int(replicas, "fss_replicas", 2)


def _as_trajectories(model, t, Q, rho, T):
    """Check user trajectories; return float arrays ``t (n,)``, ``Q (R,n,p,p)``,
    ``rho (R,n,p,p*)``, ``T (p*,p*)`` (errors name the parameter)."""
    from ..numeric.checks import as_overlaps

    p, k = model.p, model.p_star
    out = []
    for name, value in (("t", t), ("Q", Q), ("rho", rho)):
        try:
            arr = np.asarray(value)
        except Exception as exc:        # ragged lists and the like
            raise ValueError(f"{name} must be a numeric array: {exc}") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                       or arr.dtype == bool):
            raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
        if np.iscomplexobj(arr):
            raise TypeError(f"{name} must be real, got a complex array")
        out.append(arr.astype(float))
    t, Q, rho = out
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"t must be a 1-d array of >= 3 times, got shape {t.shape}")
    if not np.all(np.isfinite(t)) or t[0] < 0 or np.any(np.diff(t) <= 0):
        raise ValueError("t must be finite, >= 0 and strictly increasing")
    n = t.size
    if Q.ndim == 3:
        Q = Q[None]
    if rho.ndim == 3:
        rho = rho[None]
    if Q.ndim != 4 or Q.shape[1:] != (n, p, p):
        raise ValueError(f"Q must have shape (replicas, n, p, p) or (n, p, p) with n = len(t) "
                         f"= {n}, p = {p}; got {np.shape(out[1])}")
    if rho.ndim != 4 or rho.shape[1:] != (n, p, k):
        raise ValueError(f"rho must have shape (replicas, n, p, p_star) or (n, p, p_star) with "
                         f"n = {n}, p = {p}, p_star = {k}; got {np.shape(out[2])}")
    if Q.shape[0] != rho.shape[0]:
        raise ValueError(f"Q and rho must have the same number of replicas, got {Q.shape[0]} "
                         f"and {rho.shape[0]}")
    for name, arr in (("Q", Q), ("rho", rho)):
        bad = ~np.isfinite(arr)
        if bad.any():
            r, i = np.argwhere(bad)[0][:2]
            raise ValueError(f"{name} must be finite; replica {r} has a non-finite entry at "
                             f"t = {t[i]:.6g} (drop diverged runs before comparing)")
    scale = np.maximum(1.0, np.max(np.abs(Q), axis=(-2, -1)))
    asym = np.max(np.abs(Q - np.swapaxes(Q, -1, -2)), axis=(-2, -1)) / scale
    if np.max(asym) > 1e-6:
        r, i = np.unravel_index(np.argmax(asym), asym.shape)
        raise ValueError(f"Q must be symmetric (relative asymmetry {asym[r, i]:.3g} > 1e-6 in "
                         f"replica {r} at t = {t[i]:.6g})")
    Q = 0.5 * (Q + np.swapaxes(Q, -1, -2))
    if T is None:
        T = np.eye(k)
    for r in range(Q.shape[0]):
        # the ODE starts here, so the start must be a Gram matrix (later times are data)
        _, _, T = as_overlaps(model, Q[r, 0], rho[r, 0], T,
                              names=(f"Q[{r}, 0]", f"rho[{r}, 0]", "T"), tol=1e-6)
    return t, Q, rho, T


def compare(model, t, Q, rho, T=None, *, band=(2.5, 97.5), escape_fraction=0.5, escape=None,
            alpha=ALPHA, progress=False, N=None, whole_run=None, seed=0) -> ValidationReport:
    r"""Compare trajectories you supply with the ODE theory of `model`: report and verdict.

    For each replica the ODE is integrated from that replica's own first
    state ``(Q[r, 0], ρ[r, 0])`` over the times ``t`` (it starts at ``t[0]``);
    the SGD risk is computed from the overlaps by Isserlis' theorem.  The
    numbers and the verdict are those of :func:`validate` (module docstring),
    without the finite-size scaling, which needs runs at several ``N``.

    Parameters
    ----------
    model : symquad.Model
        The model whose ODE is the theory (its ``lr``, ``lr_scaling``,
        ``noise``, activation must be those of the data).
    t : array (n,)
        Times ``steps/N`` (``>= 0``, strictly increasing, ``n >= 3``).
    Q : array (replicas, n, p, p) or (n, p, p)
        Student overlaps ``W Wᵀ/N`` (finite, symmetric).
    rho : array (replicas, n, p, p*) or (n, p, p*)
        Student–teacher overlaps ``W W*ᵀ/N`` (finite).
    T : array (p*, p*), optional
        Teacher overlaps (default ``I``).  ``[[Q, ρ], [ρᵀ, T]]`` must be
        positive semi-definite at the first time.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold.
    escape : bool, optional
        Do the plateau/escape analysis; default (None): when it applies
        (σ = c z², ``T = I``, RMS entry of ``ρ(0)`` below 0.2, start above
        the escape threshold).
    alpha : float
        Family-wise level of the verdict's tests.
    progress : bool
        Accepted for symmetry with :func:`validate` (the ODE solve of all
        replicas is one batched call).
    N : int, optional
        The input dimension of the data: needed by the whole-run criteria.
    whole_run : bool, optional
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`; default:
        when `N` is given).
    seed : int
        Seed of the SDE ensemble of the whole-run criteria.

    Returns
    -------
    ValidationReport
        ``report.passed``, ``report.verdict``, ``report.reasons``; with one
        replica the verdict is ``"INCONCLUSIVE"`` (no standard errors).

    Examples
    --------
    >>> import symquad as sq
    >>> m = sq.Model(p=2, p_star=1, lr=0.3)
    >>> run = sq.simulate(m, N=500, t_max=3.0, replicas=8, seed=1)
    >>> rep = sq.compare(m, run.t, run.Q, run.rho)
    >>> rep.verdict in ("PASS", "FAIL", "INCONCLUSIVE")
    True
    """
    from ..numeric.simulate import population_risk
    from ..spec import check_model

    t_start = time.perf_counter()
    check_model(model)
    _check_common(band, escape_fraction, alpha)
    if escape not in (None, True, False):
        raise ValueError(f"escape must be None, True or False, got {escape!r}")
    t, Q, rho, T = _as_trajectories(model, t, Q, rho, T)
    risk = population_risk(model.activation, Q, rho, T)
    R = Q.shape[0]
    numbers, ode, shared, t_ode = _analyse(
        model, t, Q, rho, risk, np.ones(R, bool), T, band=band,
        escape_fraction=escape_fraction, escape=escape, progress=progress)
    numbers["verdict"] = _decide(numbers, R, alpha)
    if whole_run is None:
        whole_run = N is not None
    if whole_run:
        if N is None:
            raise ValueError("whole_run=True needs N (the input dimension of the data)")
        from .whole_run import add_whole_run
        numbers["verdict"] = add_whole_run(numbers, model, t, Q, rho, risk, T,
                                           _check_int(N, "N", 1), alpha, seed=seed,
                                           shared=shared)
    total = time.perf_counter() - t_start
    numbers["runtime_s"] = total
    numbers["runtime_phases_s"] = {"ode": t_ode, "analysis": total - t_ode}
    config = {**_model_config(model), "source": "user data", "N": N,
              "t_max": float(t[-1]), "replicas": R, "n_times": int(t.size),
              "T_is_identity": bool(np.array_equal(T, np.eye(model.p_star))),
              "replicas_share_ode": bool(shared), "alpha": alpha,
              "ode_start": "each replica's first state"}
    return ValidationReport(config=config, numbers=numbers, t=t, sgd_risk=risk, sgd_Q=Q,
                            sgd_rho=rho, T=T, **ode)
