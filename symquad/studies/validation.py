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
* the overlap deviation ``D_r(t_i) = (‖Q_SGD − Q_ODE‖²_F + ‖ρ_SGD − ρ_ODE‖²_F)^{1/2}``
  (plus ``‖a_SGD − a_ODE‖²`` under the root when the readout is trained, whose
  deviation is also reported alone as ``readout_rms``).

Each replica's ODE starts from that replica's own ``(Q(0), ρ(0))`` (and
``a(0)`` for a trained readout).  From a
random start this is necessary: ``ρ(0)`` has random entries of size ``N^{-1/2}``
whose replica mean is ``≈ 0``, and the ODE from the mean would never leave
the plateau.  From an informed start all replicas share the same initial
overlaps (the simulator realises them exactly), so one ODE serves all.

Model specification
-------------------
SGD and the ODE are those of the model with every field of
:class:`symquad.Model` (teacher activation, readouts, trained readout, weight
decay, mini-batch, spherical constraint); the SGD risk uses the readouts (the
recorded ``a(t)`` when trained).  The statistics below (mean deviation, band,
finite-size exponent, divergence) hold for every field; the analyses derived
for the classic model — the plateau/escape analysis and the drift study of
``S`` — are skipped with a reason that names each changed field they do not
handle (:mod:`symquad.studies.applicability`; a refusal of
:func:`symquad.plateau` or of the escape law is turned into the same stated
skip), and then the default start is the informed one (from a random start
the comparison would be dominated by the unanalysed escape-time jitter).

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
import warnings
from dataclasses import dataclass
from numbers import Real

import numpy as np

from ..numeric.checks import MAX_TIMES, check_int as _check_int
from ..numeric.persist import json_default
from ..progress import note
from .verdict import ALPHA, ESCAPE_TOL, decide as _decide, verdict_headline

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
    act = model.activation
    if isinstance(act, tuple) and not any(c for c in act[1::2]):
        return P            # even σ: the risk does not depend on the signs (and p risks at
        #                     large p would take minutes before the run-time check)
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


def _ode_per_replica(model, Q0, rho0, T, t, a0=None, progress=False):
    """ODE trajectories from each initial state at times ``t`` (the ODE starts at ``t[0]``).

    All distinct starts are integrated in one vectorised solve
    (:func:`symquad.numeric.ode_batch.integrate_batch`, per-start divergence);
    replicas that share one start (informed start) share one trajectory.
    ``a0`` (replicas, p) is each replica's initial readout when the readout is
    trained (None otherwise).  With ``constraint="sphere"`` the start's rows
    are normalised to ``Q_kk = 1`` (a no-op to round-off for SGD starts; user
    data may carry a small error there).  Returns arrays shaped like the SGD
    records, the status of each replica (``"ok"``/``"diverged"``), whether
    all replicas share one start and the ODE readouts (replicas, n, p) or None.
    """
    R = Q0.shape[0]
    if model.constraint == "sphere":
        scale = 1.0 / np.sqrt(np.diagonal(Q0, axis1=-2, axis2=-1))
        Q0 = Q0 * scale[:, :, None] * scale[:, None, :]
        rho0 = rho0 * scale[:, :, None]
    same = bool(np.allclose(Q0, Q0[:1], rtol=0, atol=1e-14)
                and np.allclose(rho0, rho0[:1], rtol=0, atol=1e-14)
                and (a0 is None or np.allclose(a0, a0[:1], rtol=0, atol=1e-14)))
    tau = np.asarray(t, float) - float(t[0])
    horizon = float(tau[-1]) if tau[-1] > 0 else 1e-9
    starts = slice(0, 1) if same else slice(None)
    Q, rho, risk, status, a = _integrate_starts(model, Q0[starts], rho0[starts], T, horizon,
                                                tau, None if a0 is None else a0[starts],
                                                progress)
    if same:
        Q, rho = np.repeat(Q, R, axis=0), np.repeat(rho, R, axis=0)
        risk, status = np.repeat(risk, R, axis=0), np.repeat(status, R)
        a = None if a is None else np.repeat(a, R, axis=0)
    return Q, rho, risk, status, same, a


def _integrate_starts(model, Q0, rho0, T, horizon, tau, a0=None, progress=False):
    """Batched ODE solve of the starts; NaN after a start's divergence."""
    # lazy: scipy
    from ..numeric.ode_batch import integrate_batch

    sol = integrate_batch(model, Q0, rho0, T, horizon, t_eval=tau, rtol=1e-8, atol=1e-11,
                          a0=a0, progress=progress)
    B, n = Q0.shape[0], len(tau)
    Q = np.full((B, n) + Q0.shape[1:], np.nan)
    rho = np.full((B, n) + rho0.shape[1:], np.nan)
    risk = np.full((B, n), np.nan)
    m = len(sol.t)
    Q[:, :m], rho[:, :m], risk[:, :m] = sol.Q, sol.rho, sol.risk
    a = None
    if sol.readout is not None:
        a = np.full((B, n, model.p), np.nan)
        a[:, :m] = sol.readout
    return Q, rho, risk, np.asarray(sol.status), a


def _overlap_deviation(Qa, rhoa, Qb, rhob, aa=None, ab=None):
    """``(‖Q_a − Q_b‖²_F + ‖ρ_a − ρ_b‖²_F + ‖a_a − a_b‖²)^{1/2}`` (readouts when trained)."""
    sq = np.sum((Qa - Qb) ** 2, axis=(-2, -1)) + np.sum((rhoa - rhob) ** 2, axis=(-2, -1))
    if aa is not None:
        sq = sq + np.sum((aa - ab) ** 2, axis=-1)
    return np.sqrt(sq)


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


def _escape_unsupported(model):
    """Why the plateau/escape analysis does not apply to `model` (names the field), or None.

    The analysis rests on :func:`symquad.plateau` and the escape law, which
    were derived for the classic model: a changed specification field they do
    not handle is named (:mod:`symquad.studies.applicability`), and so is a
    refusal of :func:`symquad.plateau` itself.
    """
    from .applicability import refusal

    reason = refusal(model, "escape")
    if reason:
        return reason
    if not model.is_quadratic:
        return ("the plateau/escape analysis is for σ = c z² (this activation has another "
                "plateau structure)")
    return None


def _escape_setup(model, T, escape_fraction):
    """Plateau fixed point and escape threshold, or (fp, None, reason)."""
    reason = _escape_unsupported(model)
    if reason:
        return None, None, reason
    if not np.allclose(T, np.eye(model.p_star)):
        return None, None, "the plateau/escape analysis needs T = I"
    # lazy: scipy
    from ..numeric.landscape import escape_threshold, plateau
    try:
        fp = plateau(model)
    except ValueError as exc:
        return None, None, str(exc)
    if fp.rate <= 0:
        return fp, None, f"plateau is stable (rate {fp.rate:.3g} <= 0): no escape"
    try:
        return fp, float(escape_threshold(model, escape_fraction, fp)), ""
    except ValueError as exc:           # the escape law refuses this model
        return None, None, str(exc)


def _seeding_shift(model, q0, fp):
    """Predicted mean ``t_esc^SGD − t_esc^ODE = −log(1 + J/q0)/(2κ)`` and ``J`` (module docstring)."""
    # lazy: scipy
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
    from .applicability import require_analysis

    require_analysis(model, "finite_size_scaling")
    Ns = [_check_int(n, "fss N", 1) for n in Ns]
    n_times = _check_int(n_times, "n_times", 2, MAX_TIMES)
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
        note(progress, f"finite-size scaling: N = {N} ({i + 1} of {len(Ns)}), {replicas} "
                       f"replicas, t <= {t_max:g}")
        run = simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed + 7919 * (i + 1),
                       method=method, t_eval=t, on_divergence="stop", progress=progress,
                       T=T, **kwargs)
        ok = run.status == "ok"
        if ok.sum() < 2:
            raise ValueError(f"finite-size scaling: SGD diverged at N={N} "
                             f"({run.n_diverged}/{replicas} replicas); reduce lr")
        sgd_a = None if run.readout is None else run.readout[ok]
        Q, rho, _, _, _, a = _ode_per_replica(model, run.Q[ok, 0], run.rho[ok, 0], run.T,
                                              run.t, None if sgd_a is None else sgd_a[:, 0],
                                              progress)
        d = _overlap_deviation(run.Q[ok], run.rho[ok], Q, rho, sgd_a, a)
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
                       "(||Q_SGD-Q_ODE||_F^2 + ||rho_SGD-rho_ODE||_F^2"
                       + (" + ||a_SGD-a_ODE||^2" if model.readout_trained else "") + ")^(1/2)"}


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


#: finite_n=None (automatic) computes the O(1/N) correction when its one-time derivation
#: (per model structure, then cached) is estimated at most this many seconds.
FINITE_N_AUTO_SECONDS = 30.0


def _finite_n_correction(model, t, Q0, rho0, T, a0, N, finite_n=None):
    """``(c_ε(t), valid(t), reason)``: the O(1/N) correction of the mean risk from one start.

    ``E[ε_SGD(t) | start] = ε_ODE(t) + c_ε(t)/N + O(N⁻²)`` (:func:`symquad.fluctuations`,
    Σ(0) = 0: the ODE starts at the replica's realised overlaps).  Replicas with their own
    starts share ``c_ε`` up to ``O(N^-1/2)`` relative (their starts differ by that much), so
    one start serves them all.  ``valid`` is the expansion's own validity flag; where it is
    False the correction is not applied.  None and a reason where it is not available.
    """
    from .whole_run import entry_route_cost
    if N is None:
        return None, None, ("the data's input dimension N is not given (compare(..., N=) or "
                            "--N): tested against the N -> infinity ODE")
    if not model.is_polynomial:
        return None, None, "not derived for erf and relu: tested against the ODE"
    costly = entry_route_cost(model)      # (its Jacobian and drift Hessian: entry route)
    if costly:
        return None, None, f"too costly here {costly}: tested against the ODE"
    if finite_n is False:
        return None, None, "finite_n=False: tested against the ODE"
    if finite_n is None:
        from ..second_order_cost import second_order_estimate
        estimate = second_order_estimate(model)
        if estimate > FINITE_N_AUTO_SECONDS:
            return None, None, (f"its one-time derivation for this structure is estimated at "
                                f"{estimate:.0f} s > {FINITE_N_AUTO_SECONDS:.0f} s; "
                                f"finite_n=True computes it: tested against the ODE")
    from ..numeric.errors import DivergenceError
    from ..numeric.fluctuations import fluctuations
    try:
        fl = fluctuations(model, Q0, rho0, T, N, t - t[0], a0=a0, second_order=True)
    except (ValueError, ArithmeticError, NotImplementedError, DivergenceError) as exc:
        return None, None, f"not available ({exc}): tested against the ODE"
    if fl.risk_mean_correction is None:
        return None, None, f"not computed ({fl.second_order_note}): tested against the ODE"
    c = np.asarray(fl.risk_mean_correction, float)
    valid = np.asarray(fl.expansion_valid, bool) & np.isfinite(c)
    return np.where(valid, c, 0.0), valid, ""


def _finite_n_numbers(t, N, window, mean_dev, se, c, valid, reason, z_plain):
    """``numbers["finite_n_bias"]``: N·(mean SGD − ODE) next to the predicted ``c_ε``."""
    if c is None:
        return {"applies": False, "reason": reason}
    idx = np.nonzero(window & valid)[0]
    pick = idx[np.unique(np.round(np.linspace(0, len(idx) - 1, min(5, len(idx))))
                         .astype(int))] if len(idx) else idx
    return {"applies": True, "reason": "", "N": int(N),
            "valid_fraction": float(np.mean(valid[window])) if window.any() else 0.0,
            "times": [float(v) for v in t[pick]],
            "N_times_mean_deviation": [float(v) for v in N * mean_dev[pick]],
            "N_times_se": [float(v) for v in N * se[pick]],
            "predicted": [float(v) for v in c[pick]],
            "max_z_against_ode": _finite_float(np.max(z_plain[window])) if window.any()
            else None,
            "description": "E[risk_SGD] = risk_ODE + c/N + O(N^-2): the mean-deviation and band "
                           "criteria compare SGD with ODE + c/N where the expansion holds"}


def _analyse(model, t, sgd_Q, sgd_rho, sgd_risk, sgd_ok, T, *, band, escape_fraction, escape,
             progress, sgd_readout=None, N=None, finite_n=None):
    """ODE from every replica's start and all summary numbers (no verdict).

    `sgd_readout` (replicas, n, p): the recorded readouts of a trained readout
    (the ODE starts from each replica's ``a(0)``); None for a fixed one.  `N`: the input
    dimension, for the O(1/N) correction of the mean (None: against the ODE alone).
    """
    tick = time.perf_counter()
    oQ, orho, orisk, ostatus, shared, oa = _ode_per_replica(
        model, sgd_Q[:, 0], sgd_rho[:, 0], T, t,
        None if sgd_readout is None else sgd_readout[:, 0], progress)
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
    d_ov = _overlap_deviation(sgd_Q, sgd_rho, oQ, orho, sgd_readout, oa)

    fp, threshold, reason = _escape_applies(model, T, sgd_rho[:, 0], sgd_risk[:, 0], escape,
                                            escape_fraction)
    if threshold is not None:
        q0 = float(np.mean(np.trace(sgd_Q[good, 0], axis1=-2, axis2=-1)) / model.p)
        try:
            shift, J = _seeding_shift(model, q0, fp)
        except ValueError as exc:       # the escape law refuses this model
            threshold, reason = None, str(exc)
    esc = {"defined": threshold is not None, "reason": reason}
    if threshold is not None:
        # lazy: scipy
        from ..numeric.landscape import escape_times
        ts = escape_times(t, sgd_risk[good], threshold)
        to = escape_times(t, orisk[good], threshold)
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
        if sgd_readout is not None:
            d_a = np.sqrt(np.sum((sgd_readout[good] - oa[good]) ** 2, axis=-1))
            dev[name]["readout_rms"] = _describe(_rms_over(mask, d_a))
    numbers["deviation"] = dev

    # the O(1/N) correction of the mean: SGD is compared with ODE + c/N where it holds, with
    # the O(N^-2) remainder bounded by |c|/N^(3/2) (conservative) in the standard error
    # (integrated over the mean-deviation window only: beyond it a plateau's escape ends
    # the expansion's validity, and the band criterion there tests against the ODE)
    first = int(np.nonzero(good)[0][0])
    window, t_end = _mean_deviation_window(t, orho[good], threshold is not None)
    upto = int(np.nonzero(window)[0][-1]) + 1 if window.any() else 1
    c, c_valid, c_reason = _finite_n_correction(
        model, t[:upto], sgd_Q[first, 0], sgd_rho[first, 0], T,
        None if sgd_readout is None else sgd_readout[first, 0], N, finite_n)
    if c is not None:
        c = np.concatenate([c, np.zeros(len(t) - upto)])
        c_valid = np.concatenate([c_valid, np.zeros(len(t) - upto, bool)])
    shift = np.zeros(len(t)) if c is None else c / N
    remainder = np.zeros(len(t)) if c is None else np.abs(c) / N ** 1.5

    # bands and the mean deviation
    sr = sgd_risk[good]
    lo, hi = np.percentile(sr, band[0], axis=0), np.percentile(sr, band[1], axis=0)
    scale = np.maximum(1.0, np.abs(sr).max(0))
    oc = orisk[good] + shift
    inside = (oc >= lo - _BAND_TOL * scale) & (oc <= hi + _BAND_TOL * scale)
    inside_t = inside[0] if shared else inside.mean(0)
    plain_dev = d_risk[good].mean(0)
    mean_dev = plain_dev - shift
    se_sgd = d_risk[good].std(0, ddof=1) / math.sqrt(n_good) if n_good > 1 \
        else np.full(len(t), np.nan)
    se = np.sqrt(se_sgd ** 2 + remainder ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(mean_dev) / se,
                     np.where(np.abs(mean_dev) <= _BAND_TOL * scale, 0.0, np.inf))
        z_plain = np.where(se_sgd > 0, np.abs(plain_dev) / se_sgd,
                           np.where(np.abs(plain_dev) <= _BAND_TOL * scale, 0.0, np.inf))
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
        "reference": "ODE + c/N" if c is not None else "ODE",
    }
    numbers["finite_n_bias"] = _finite_n_numbers(t, N, window, plain_dev, se_sgd, c, c_valid,
                                                 c_reason, z_plain)
    numbers["final_risk"] = {"sgd": _describe(sr[:, -1]), "ode": _describe(oc[:, -1])}
    arrays = dict(ode_Q=oQ, ode_rho=orho, ode_risk=orisk, ode_readout=oa)
    return numbers, arrays, shared, t_ode


def _add_resolution(numbers, model, t, sgd_risk, ode, sgd_Q, sgd_rho, T, sgd_readout, shared):
    """``numbers["resolution"]``: the smallest parameter changes the run detects
    (:mod:`symquad.studies.resolution`), from the mean-deviation test's window and critical
    value and the replicas' standard errors."""
    from .resolution import resolution_numbers
    orisk = ode["ode_risk"]
    good = np.all(np.isfinite(sgd_risk), axis=1) & np.all(np.isfinite(orisk), axis=1)
    md = next(c for c in numbers["verdict"]["checks"] if c["name"] == "mean_deviation")
    window, _ = _mean_deviation_window(t, ode["ode_rho"][good],
                                       bool(numbers["escape"].get("defined")))
    a0 = None if sgd_readout is None else sgd_readout[good, 0]
    numbers["resolution"] = resolution_numbers(
        model, t, sgd_risk[good] - orisk[good], sgd_Q[good, 0], sgd_rho[good, 0], T, a0,
        window, md.get("critical") if md["status"] != "not tested" else None, shared=shared)


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
#: saved only for a trained readout
_READOUT_ARRAYS = ("sgd_readout", "ode_readout")
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
    sgd_readout, ode_readout : ndarray (replicas, n, p) or None
        The student readouts ``a(t)`` when the readout is trained, else None.
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
    sgd_readout: np.ndarray | None = None
    ode_readout: np.ndarray | None = None

    @property
    def model(self):
        """The :class:`~symquad.Model` of the report, every field included (from `config`)."""
        from ..numeric.persist import model_from_dict

        c = self.config
        spec = c.get("model_spec")
        if spec is None:        # reports written before the model specification
            spec = {k: c[k] for k in ("p", "p_star", "lr", "noise", "lr_scaling")}
            spec["activation"] = _activation_list(c["activation"])
        return model_from_dict(spec)

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

    @property
    def resolution(self) -> dict:
        """Parameter name → the smallest change this run's mean-deviation test detects
        (about 50 % power; :mod:`symquad.studies.resolution`); None: not detectable.
        Empty when not computed (``numbers["resolution"]["reason"]`` says why)."""
        return dict(self.numbers.get("resolution", {}).get("values", {}))

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
        from .report_io import decode_nonfinite
        return decode_nonfinite(json.loads(self.to_json()))

    def to_json(self, indent=2) -> str:
        """The configuration and all numbers as a JSON string (strict JSON: a non-finite
        number is written ``{"__float__": "inf"}``, see :func:`report_io.encode_nonfinite`)."""
        from .report_io import encode_nonfinite
        return json.dumps({"format": _report_format(), "format_version": _FORMAT_VERSION,
                           "config": encode_nonfinite(self.config),
                           "numbers": encode_nonfinite(self.numbers)}, indent=indent,
                          allow_nan=False, default=json_default)

    def summary(self) -> str:
        """Printable summary table, ending with the verdict and its reasons."""
        c, n = self.config, self.numbers
        lines = [f"symquad validate: {c['model']}"]
        if c.get("activation") in ("erf", "relu") or "erf" in c.get("model", "") \
                or "relu" in c.get("model", ""):
            # a named activation is printed with its convention (erf means erf(z/√2))
            lines.append(f"  model: {c.get('description') or c['model']}")
        if c["source"] == "simulation":
            lines.append(f"  N={c['N']}, replicas={c['replicas']}, t_max={c['t_max']:g}, "
                         f"start={c['start']}, method={c['method']}, seed={c['seed']}")
            if str(c.get("start_reason", "")).startswith("default: "):
                lines.append(f"  start: {c['start']} by default, since "
                             f"{c['start_reason'][len('default: '):]}")
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
                               ("overlap_rms", "overlap deviation (RMS in t)"),
                               ("readout_rms", "|a SGD-ODE| (RMS in t)")):
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
        fb = n.get("finite_n_bias")
        if fb and fb.get("applies") and fb["times"]:
            pairs = "; ".join(f"t={tt:.3g}: {m:.3g} ± {s:.2g} vs {c:.3g}" for tt, m, s, c in zip(
                fb["times"], fb["N_times_mean_deviation"], fb["N_times_se"], fb["predicted"]))
            lines.append(f"  finite-N bias, N·(mean SGD - ODE) vs the O(1/N) theory c: {pairs}")
            lines.append(f"  (the verdict compares SGD with ODE + c/N; against the ODE alone the "
                         f"largest deviation is {fb['max_z_against_ode'] or 0:.2f} s.e.)")
        elif fb:
            lines.append(f"  finite-N bias: no O(1/N) correction ({fb['reason']})")
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
        lines.append(f"  {verdict_headline(self.numbers['verdict'])}")
        lines.extend(f"    {r}" for r in self.reasons)
        res = n.get("resolution")
        if res and res["values"]:
            from .resolution import format_resolution
            lines.append(f"  RESOLUTION (smallest change the mean-deviation test detects, about "
                         f"50% power): {format_resolution(res)}")
        elif res:
            lines.append(f"  resolution: not computed ({res['reason']})")
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

    def save(self, folder="symquad_report", figures=True, format="png") -> dict:
        """Write the report folder atomically; return ``{name: path}`` of the files written.

        Files: ``report.json`` (configuration, numbers, verdict), ``summary.txt``,
        ``trajectories.npz`` (all arrays), ``invariant_study.npz`` when the drift
        study ran, and the figures (``figures=False`` skips them) as ``format``:
        ``"png"`` (300 dpi), ``"pdf"`` or ``"svg"`` (vector, for a paper).  Everything
        is written into a temporary folder beside `folder`, which then replaces
        `folder` whole (one rename; see "Report folders" in docs/user-guide.md): an interrupted save
        leaves the previous folder untouched, and no figure of an older run
        survives next to a new report.  `folder` is checked first: an existing
        file, a non-empty folder that is not a symquad report, or an unwritable
        location raise ValueError.
        """
        from ..plotting import FORMATS
        from .report_io import write_folder_atomically

        if not isinstance(format, str) or format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        names = {}

        def write(tmp):
            names.update(self._write_files(tmp, figures, format))

        dest = write_folder_atomically(folder, write, name="folder")
        return {key: os.path.join(dest, name) for key, name in names.items()}

    def _write_files(self, folder, figures, format="png") -> dict:
        from .._describe_report import describe_config
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
        arrays = {k: getattr(self, k) for k in _ARRAYS + _READOUT_ARRAYS
                  if getattr(self, k) is not None}
        np.savez_compressed(os.path.join(folder, names["trajectories"]), **arrays)
        if study_arrays:
            np.savez_compressed(os.path.join(folder, names["invariant_study"]), **study_arrays)
        if figures:
            for name, fig in self.figures().items():
                names[name] = f"{name}.{format}"
                save_figure(fig, os.path.join(folder, names[name]))
            if self.invariant_study is not None:
                names["invariant_drift"] = f"invariant_drift.{format}"
                plot_invariant_drift(self.invariant_study,
                                     os.path.join(folder, names["invariant_drift"]),
                                     model_title=describe_config(self.config))
        return names

    @classmethod
    def load(cls, folder) -> "ValidationReport":
        """Read a report folder written by :meth:`save` (arrays loaded without pickle)."""
        from .report_io import _as_path, join_arrays

        from .._safe_io import read_npz, read_regular

        path = _as_path(folder)
        try:
            head = json.loads(read_regular(os.path.join(path, "report.json"), "report.json",
                                           max_bytes=256 * 2**20).decode("utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{folder!r} is not a report folder (no report.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{folder!r}: report.json is not valid JSON ({exc})") from None
        if not isinstance(head, dict) or head.get("format") != _report_format():
            raise ValueError(f"{folder!r}: report.json is not a symquad ValidationReport")
        if head.get("format_version", 0) > _FORMAT_VERSION:
            raise ValueError(f"{folder!r}: report format version {head['format_version']} is "
                             f"newer than this symquad reads ({_FORMAT_VERSION})")
        arrays, _ = read_npz(os.path.join(path, "trajectories.npz"),
                             f"{folder!r}: trajectories.npz", keys=_ARRAYS + _READOUT_ARRAYS)
        missing = [k for k in _ARRAYS[:-1] if k not in arrays]
        if missing:
            raise ValueError(f"{folder!r}: trajectories.npz lacks {missing}")
        study = None
        if "invariant_study" in head:
            data, _ = read_npz(os.path.join(path, "invariant_study.npz"),
                               f"{folder!r}: invariant_study.npz")
            study = join_arrays(head["invariant_study"], data)
        from .report_io import decode_nonfinite
        try:
            config, numbers = decode_nonfinite(head["config"]), decode_nonfinite(head["numbers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{folder!r}: report.json is damaged ({type(exc).__name__}: "
                             f"{exc})") from None
        if not (isinstance(config, dict) and isinstance(numbers, dict)):
            raise ValueError(f"{folder!r}: report.json is damaged (config and numbers must be "
                             f"objects)")
        return cls(config=config, numbers=numbers, invariant_study=study,
                   **arrays)


def _activation_list(text):
    """Coefficients of an activation string as the rational strings of a saved model
    (a named activation, ``"erf"`` or ``"relu"``, stays its name)."""
    from ..spec import Model

    act = Model(1, 1, 1.0, activation=text).activation
    return act if isinstance(act, str) else [str(c) for c in act]


def _report_format():
    from .report_io import REPORT_FORMAT

    return REPORT_FORMAT


def _finite_or_none(values):
    return [float(v) if np.isfinite(v) else None for v in values]


# ---------------------------------------------------------------------------
# validate and compare
# ---------------------------------------------------------------------------
def _check_finite_n(finite_n):
    if finite_n not in (None, True, False) or isinstance(finite_n, (int, float)) and \
            not isinstance(finite_n, bool):
        raise ValueError(f"finite_n must be None, True or False, got {finite_n!r}")


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
    """The model in a report's configuration: its repr, a description, the classic fields
    and every field.

    ``model_spec`` holds every field as :func:`symquad.numeric.persist.model_to_dict`
    writes it (``ValidationReport.model`` reads it back); ``changed_fields``
    names the specification fields that differ from their defaults.
    """
    from .._describe import describe_model
    from ..numeric.persist import model_to_dict

    return {"model": repr(model), "description": describe_model(model), "p": model.p,
            "p_star": model.p_star, "lr": model.lr,
            "eta": model.eta, "noise": model.noise, "activation": model.activation_str,
            "lr_scaling": model.lr_scaling, "model_spec": model_to_dict(model),
            "changed_fields": list(model.changed_fields())}


def validate(model=None, N=2000, t_max=None, replicas=64, start=None, seed=0, *,
             T=None, Q0=None, rho0=None, method="reduced", n_times=201, band=(2.5, 97.5),
             escape_fraction=0.5, overlap=0.5, alpha=ALPHA, fss=True, fss_N=None,
             fss_t_max=None, fss_replicas=None, fss_start="informed", invariant=True,
             invariant_N=(250, 500, 1000, 2000), invariant_replicas=16, workers=1,
             progress=False, whole_run=True, resolution=True, finite_n=None):
    r"""Compare SGD with the ODE theory for `model`; return a :class:`ValidationReport`.

    The report carries a PASS/FAIL verdict (``report.passed``,
    ``report.reasons``; criteria in the module docstring).

    Parameters
    ----------
    model : symquad.Model, optional
        Default :data:`symquad.spec.DEFAULT_MODEL`.  Every field is honoured:
        SGD (:func:`symquad.simulate`) and the ODE (from each replica's
        realised ``Q(0), ρ(0)`` and, for a trained readout, ``a(0)``) are the
        variant's; see "Model specification" in the module docstring for what
        is skipped.
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
        escape analysis is for ``σ = c z²``), and for models with a changed
        specification field the escape analysis does not handle (the reason,
        naming the field, is ``config["start_reason"]``).  Not with `Q0`/`rho0`.
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
        ``p >= p*``, ``σ = c z²`` and no specification field the
        conservation of ``S`` is not proved for (skipped otherwise, with the
        reason, naming the field, in ``numbers["invariant_drift_skipped"]``).
        Reported, not part of the verdict.
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
        Progress on stderr (:mod:`symquad.progress`): a line per stage and the
        progress of the simulations and ODE solves, as tqdm bars on a terminal
        and plain lines (every 10 % or 10 s, with the time left) otherwise
        (main comparison only when the side studies run in workers).
    whole_run : bool
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`): SGD
        against the order-parameter SDE from the same starts, and the replica
        spread against the linear-noise prediction.
    resolution : bool
        Add ``report.resolution``: the smallest change of each parameter (lr, label
        noise, weight decay, batch size, a trained readout's rate, each activation
        coefficient) this run's mean-deviation test detects
        (:mod:`symquad.studies.resolution`).
    finite_n : bool or None
        Compare SGD with ``ODE + c/N``, the derived O(1/N) correction of the mean
        (:func:`symquad.fluctuations`), in the mean-deviation and band criteria.  None:
        when its one-time derivation is estimated at most ``FINITE_N_AUTO_SECONDS``
        (30 s); True: always (polynomial activations); False: never.

    Returns
    -------
    ValidationReport
    """
    from .._signals import terminate_cleanly
    from ..numeric.simulate import simulate
    from ..spec import DEFAULT_MODEL
    from ..stages import declare

    t_start = time.perf_counter()
    model = DEFAULT_MODEL if model is None else model
    declare(model, "validate")
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 2)
    n_times = _check_int(n_times, "n_times", 3, MAX_TIMES)
    _check_common(band, escape_fraction, alpha)
    _check_finite_n(finite_n)
    given = Q0 is not None or rho0 is not None
    if given and (Q0 is None or rho0 is None):
        raise ValueError("Q0 and rho0 must be given together")
    if start is None:
        from .applicability import refusal

        # a random start has a plateau: without the escape analysis the comparison
        # would be dominated by the O(1) escape-time jitter (module docstring)
        refused = None if given else refusal(model, "escape")
        if given:
            start, start_reason = "given", "Q0, rho0 given"
        elif refused:
            start, start_reason = "informed", f"default: {refused}"
        else:
            start = "random" if model.is_quadratic else "informed"
            start_reason = "default for this activation"
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
        from .applicability import require_analysis
        require_analysis(model, "informed_start")
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
        from .applicability import require_analysis
        require_analysis(model, "finite_size_scaling")
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
    if invariant:
        from .applicability import refusal
        skipped = refusal(model, "invariant_drift")
    if invariant and not skipped and not (model.p >= model.p_star and model.is_quadratic):
        skipped = ("the conservation of S is a result for sigma = c z^2" if not model.is_quadratic
                   else "S = rho (rho^T rho)^(-1/2) needs p >= p_star")
    elif invariant and not skipped:
        # docs/model.md §8.4 at finite N: drift of S = rho (rho^T rho)^(-1/2) vs N
        from .invariant_drift import invariant_drift_study
        jobs["invariant_drift"] = (invariant_drift_study, dict(
            model=model, Ns=list(invariant_N), t_max=t_max, replicas=invariant_replicas,
            seed=seed, method=method, T=T))
    from ..numeric.kernels import check_kernels
    check_kernels(model)        # the ODE's kernels exist for this pair: checked before SGD runs
    _plan_runs(model, method, [("main run", N, t_max, replicas, n_times)]
               + [(f"finite-size scaling at N={n}", n, fss_t, fss_replicas or replicas, 51)
                  for n in (fss_N if fss else ())]
               + [(f"drift study of S ({start} start) at N={n}", n, t_max,
                   invariant_replicas, 101)
                  for n in (list(invariant_N) if "invariant_drift" in jobs else ())
                  for start in ("random", "informed")])
    workers = _resolve_workers(workers, len(jobs))

    phases = {}
    with terminate_cleanly(), warnings.catch_warnings(), \
            _StudyRunner(jobs, workers, progress) as studies:
        # the plan above already gave the estimate of every run
        warnings.filterwarnings("ignore", r"simulate: .* estimated to take", RuntimeWarning)
        tick = time.perf_counter()
        kwargs = {"T": T}
        if start == "informed":
            kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
        elif given:
            kwargs["Q0"], kwargs["rho0"] = Q0, rho0
        t_eval = np.linspace(0.0, t_max, n_times)
        note(progress, f"validate: SGD, N = {N}, {replicas} replicas, t <= {t_max:g} ({method} "
                       f"simulator), then the ODE from each replica's start")
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
            escape_fraction=escape_fraction, escape=escape, progress=progress,
            sgd_readout=run.readout, N=N, finite_n=finite_n)
        phases["analysis"] = time.perf_counter() - tick - phases["ode"]
        results, study_times = studies.results()
    phases.update(study_times)
    if fss:
        numbers["finite_size_scaling"] = results["finite_size_scaling"]
    else:
        numbers["finite_size_scaling_skipped"] = "fss=False, symquad validate --no-fss"
    study = results.get("invariant_drift")
    if study is not None:
        from .invariant_drift import summarize_drift_study
        numbers["invariant_drift"] = summarize_drift_study(study)
    if skipped:
        numbers["invariant_drift_skipped"] = skipped
    numbers["verdict"] = _decide(numbers, replicas, alpha)
    if resolution:
        tick = time.perf_counter()
        _add_resolution(numbers, model, run.t, run.risk, ode, run.Q, run.rho, run.T,
                        run.readout, shared)
        phases["resolution"] = time.perf_counter() - tick
    if whole_run:
        from .whole_run import add_whole_run
        tick = time.perf_counter()
        numbers["verdict"] = add_whole_run(numbers, model, run.t, run.Q[ok], run.rho[ok],
                                           run.risk[ok], run.T, N, alpha, seed=seed,
                                           shared=shared)
        phases["whole_run"] = time.perf_counter() - tick
    else:
        from .whole_run import whole_run_not_run
        numbers["verdict"] = whole_run_not_run(
            numbers["verdict"], "whole_run=False, symquad validate --no-whole-run")
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
                            invariant_study=study, sgd_readout=run.readout, **ode)


#: validate warns when its SGD runs are estimated to take longer than this (seconds;
#: the default run's estimate is 7 s, its measured time about 20 s)
VALIDATE_WARN_SECONDS = 120.0


def _plan_runs(model, method, runs):
    """Check every SGD run of a validation before the first starts; warn when it is long.

    `runs` lists ``(label, N, t_max, replicas, n_times)``.  Each run's sizes are
    checked as :func:`symquad.simulate` would (the error names the run, e.g. an
    ``fss_N`` value far too large), and the estimated times (lower bounds,
    :func:`symquad.numeric.simulate.estimate_seconds`) are added up: above
    ``VALIDATE_WARN_SECONDS`` a RuntimeWarning gives the total and the longest runs,
    above ``MAX_ESTIMATED_SECONDS`` the validation is refused.
    """
    from ..numeric import simulate as S

    estimates = []
    for label, n, t_max, replicas, n_times in runs:
        try:
            estimates.append((S.plan_simulation(model, n, t_max, replicas, method, n_times),
                              label))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"validate: {label}: {exc}") from None
    total = sum(sec for sec, _ in estimates)
    longest = ", ".join(f"{label} {S._duration(sec)}" for sec, label in
                        sorted(estimates, reverse=True)[:3])
    if total > S.MAX_ESTIMATED_SECONDS:
        raise ValueError(f"validate: its SGD runs are estimated to take at least "
                         f"{S._duration(total)} ({longest}; limit "
                         f"{S._duration(S.MAX_ESTIMATED_SECONDS)}): reduce N, t_max, replicas "
                         f"or fss_N / invariant_N")
    if total > VALIDATE_WARN_SECONDS:
        warnings.warn(f"validate: the SGD runs are estimated to take at least "
                      f"{S._duration(total)} ({longest})", RuntimeWarning, stacklevel=3)
    return total


def _resolve_workers(workers, n_jobs):
    """Number of processes for `n_jobs` studies (see :func:`validate`, `workers`)."""
    import multiprocessing

    workers = _check_int(workers, "workers", 1)
    if n_jobs == 0 or multiprocessing.current_process().daemon:
        return 1
    return min(workers, n_jobs + 1)


_STUDY_LABELS = {"finite_size_scaling": "finite-size scaling",
                 "invariant_drift": "drift study of the invariant S"}


class _StudyRunner:
    """Run the side studies (name -> (function, kwargs)) serially or in worker processes.

    With ``workers > 1`` the studies are submitted to a process pool (spawned
    interpreters: no fork of a process that may hold compiled-code threads)
    when the context is entered, and collected by :meth:`results`; the caller
    does its own work in between.  With ``workers == 1`` they run inside
    :meth:`results`.  Leaving the context early (an error, Ctrl-C, or SIGTERM,
    which :func:`validate` turns into an exception) cancels what has not
    started and stops the worker processes at once (terminate, then kill),
    instead of waiting for studies that may run for minutes.
    """

    def __init__(self, jobs, workers, progress):
        self.jobs, self.workers, self.progress = jobs, workers, progress
        self.pool, self.futures = None, {}

    def __enter__(self):
        if self.workers > 1 and self.jobs:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            from ..entry import children_ignore_sigint, ignore_sigint

            # the workers ignore Ctrl-C: it reaches this process, which stops the pool
            with children_ignore_sigint():
                self.pool = ProcessPoolExecutor(
                    max_workers=min(self.workers - 1, len(self.jobs)),
                    mp_context=multiprocessing.get_context("spawn"), initializer=ignore_sigint)
                self.futures = {name: self.pool.submit(_timed_call, fn, kwargs)
                                for name, (fn, kwargs) in self.jobs.items()}
        return self

    def results(self):
        out, times = {}, {}
        for name, (fn, kwargs) in self.jobs.items():
            if self.pool is not None:
                note(self.progress, f"validate: waiting for the {_STUDY_LABELS.get(name, name)} "
                                    f"(worker process)")
                out[name], times[name] = self.futures[name].result()
            else:
                note(self.progress, f"validate: {_STUDY_LABELS.get(name, name)}")
                out[name], times[name] = _timed_call(fn, dict(kwargs, progress=self.progress))
        return out, times

    def __exit__(self, exc_type, exc, tb):
        if self.pool is None:
            return False
        if exc_type is None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            return False
        # the pool's own shutdown would wait for the running studies to finish
        procs = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
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

    # lazy: scipy
    from ..numeric.integrate import check_sphere

    Q0, rho0 = np.asarray(Q0), np.asarray(rho0)
    if Q0.ndim == 2 and rho0.ndim == 2:
        as_overlaps(model, Q0, rho0, T)
        check_sphere(model, Q0)
        return
    if Q0.ndim != 3 or rho0.ndim != 3 or Q0.shape[0] != rho0.shape[0]:
        raise ValueError(f"Q0 and rho0 must be (p, p) and (p, p*) or carry the same leading "
                         f"replicas axis; got shapes {Q0.shape} and {rho0.shape}")
    for r in range(Q0.shape[0]):
        as_overlaps(model, Q0[r], rho0[r], T, names=(f"Q0[{r}]", f"rho0[{r}]", "T"))
    check_sphere(model, Q0)


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


def _check_times(t):
    """Every recorded time: 1-d, >= 3 of them, finite, >= 0, strictly increasing.

    Each error names the first offending index, so a NaN or a repeated time
    deep inside a long record is reported, not only a bad first or last time.
    """
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"t must be a 1-d array of >= 3 times, got shape {t.shape}")
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        raise ValueError(f"t must be finite: t[{bad[0]}] = {float(t[bad[0]])!r} "
                         f"({bad.size} non-finite time(s))")
    if t[0] < 0:
        raise ValueError(f"t must be >= 0 (times steps/N), got t[0] = {float(t[0])!r}")
    step = np.diff(t)
    bad = np.flatnonzero(step <= 0)
    if bad.size:
        i = bad[0]
        raise ValueError(f"t must be strictly increasing: t[{i}] = {float(t[i])!r} is followed by "
                         f"t[{i + 1}] = {float(t[i + 1])!r} ({bad.size} such step(s))")
    # times so close that t - t[0] collapses would give the ODE solver repeated times
    if np.any(np.diff(t - t[0]) <= 0):
        raise ValueError("t must be strictly increasing after subtracting t[0] (the ODE "
                         "clock); some times differ by less than the float resolution")


def _as_trajectories(model, t, Q, rho, T):
    """Check user trajectories; return float arrays ``t (n,)``, ``Q (R,n,p,p)``,
    ``rho (R,n,p,p*)``, ``T (p*,p*)`` (errors name the parameter)."""
    from ..numeric.checks import as_overlaps, as_real_array

    p, k = model.p, model.p_star
    # non-finite entries are reported below with the replica and time they occur at
    out = [as_real_array(value, name, finite=False)
           for name, value in (("t", t), ("Q", Q), ("rho", rho))]
    t, Q, rho = out
    _check_times(t)
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


def _as_readout(model, readout, t, replicas):
    """Check a readout trajectory for `model`: ``(replicas, n, p)`` floats, or None.

    Required (and only accepted) when the model trains its readout; errors
    name ``readout`` and the shape expected.
    """
    from ..numeric.checks import as_real_array

    if not model.readout_trained:
        if readout is not None:
            raise ValueError("readout is accepted only for a model that trains its readout "
                             "(lr_readout > 0); a fixed readout is model.readout "
                             f"(lr_readout = {model.lr_readout:g} here)")
        return None
    if readout is None:
        raise ValueError(f"readout is required: the model trains its readout (lr_readout = "
                         f"{model.lr_readout:g}), so the data must give a(t) as an array of "
                         f"shape (replicas, n, p) or (n, p) with n = len(t), p = {model.p}")
    a = as_real_array(readout, "readout")
    n, p = len(t), model.p
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1:] != (n, p) or a.shape[0] != replicas:
        raise ValueError(f"readout must have shape (replicas, n, p) = ({replicas}, {n}, {p}) "
                         f"or (n, p) with one replica; got {np.shape(readout)}")
    bad = ~np.isfinite(a)
    if bad.any():
        r, i = np.argwhere(bad)[0][:2]
        raise ValueError(f"readout must be finite; replica {r} has a non-finite entry at "
                         f"t = {t[i]:.6g} (drop diverged runs before comparing)")
    return a.astype(float)


#: compare warns when its ODE solve is estimated to take longer than this (seconds)
COMPARE_WARN_SECONDS = 30.0


def _check_ode_horizon(model, t, Q, rho, T):
    """Estimate the ODE solve of :func:`compare` over the data's times before doing it.

    On the slow tail an explicit solver's step is set by stability, so the
    cost grows linearly with the horizon (about 29 s per 10⁶ time units for
    the default model); :func:`symquad.numeric.ode_batch.estimate_solve`
    predicts it from the Jacobian at the first and last recorded states.
    Warns above ``COMPARE_WARN_SECONDS``, refuses above
    ``symquad.numeric.simulate.MAX_ESTIMATED_SECONDS``.
    """
    from ..numeric import simulate as S
    # lazy: scipy
    from ..numeric.ode_batch import estimate_solve

    horizon = float(t[-1] - t[0])
    try:
        est = estimate_solve(model, [(Q[0, 0], rho[0, 0]), (Q[0, -1], rho[0, -1])], T,
                             horizon, Q.shape[0])
    except (ArithmeticError, TypeError, ValueError):    # e.g. data far outside the ODE's domain
        return
    if not all(math.isfinite(v) for v in est.values()):
        return
    text = (f"compare: integrating the ODE over t in [{t[0]:.4g}, {t[-1]:.4g}] takes about "
            f"{est['nfev']:.3g} right-hand-side evaluations (stiffness {est['rate']:.3g} per "
            f"unit time), at least {S._duration(est['seconds'])}")
    if est["seconds"] > S.MAX_ESTIMATED_SECONDS:
        raise ValueError(f"{text}; limit {S._duration(S.MAX_ESTIMATED_SECONDS)}: compare a "
                         f"shorter time window (cut the tail of t)")
    if est["seconds"] > COMPARE_WARN_SECONDS:
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def _check_whole_run(model, whole_run, N, a):
    """``(whole_run, N)`` of :func:`compare`, checked before any work.

    The SDE ensemble of the whole-run criteria starts from the data's overlaps
    and from ``model.readout``, so a trained readout's data must start there.
    """
    if whole_run not in (None, True, False):
        raise ValueError(f"whole_run must be None, True or False, got {whole_run!r}")
    if whole_run is None:
        whole_run = N is not None
    if not whole_run:
        return False, N
    if N is None:
        raise ValueError("whole_run=True needs N (the input dimension of the data)")
    N = _check_int(N, "N", 1)
    if a is not None:
        a0 = np.asarray([float(v) for v in model.readout])
        if not np.allclose(a[:, 0], a0, rtol=1e-9, atol=1e-12):
            raise ValueError(f"readout: the whole-run criteria start the SDE from "
                             f"model.readout = {a0.tolist()}, but the data's readout starts at "
                             f"{a[0, 0].tolist()} (first replica): give the model that "
                             f"readout, or whole_run=False")
    return True, N


def compare(model, t, Q, rho, T=None, readout=None, *, band=(2.5, 97.5), escape_fraction=0.5,
            escape=None, alpha=ALPHA, progress=False, N=None, whole_run=None,
            seed=0, resolution=True, finite_n=None) -> ValidationReport:
    r"""Compare trajectories you supply with the ODE theory of `model`: report and verdict.

    For each replica the ODE is integrated from that replica's own first
    state ``(Q[r, 0], ρ[r, 0])`` over the times ``t`` (it starts at ``t[0]``);
    the SGD risk is computed from the overlaps by Isserlis' theorem.  The
    numbers and the verdict are those of :func:`validate` (module docstring),
    without the finite-size scaling, which needs runs at several ``N``.

    Parameters
    ----------
    model : symquad.Model
        The model whose ODE is the theory (every field — ``lr``,
        ``lr_scaling``, ``noise``, the activations, readouts, ``lr_readout``,
        ``weight_decay``, ``batch_size``, ``constraint`` — must be that of the
        data).
    t : array (n,)
        Times ``steps/N`` (``>= 0``, strictly increasing, ``n >= 3``).
    Q : array (replicas, n, p, p) or (n, p, p)
        Student overlaps ``W Wᵀ/N`` (finite, symmetric).
    rho : array (replicas, n, p, p*) or (n, p, p*)
        Student–teacher overlaps ``W W*ᵀ/N`` (finite).
    T : array (p*, p*), optional
        Teacher overlaps (default ``I``).  ``[[Q, ρ], [ρᵀ, T]]`` must be
        positive semi-definite at the first time.  With
        ``constraint="sphere"`` the first ``Q`` of every replica must have
        unit diagonal (to 1e-6; the ODE starts from the rows normalised).
    readout : array (replicas, n, p) or (n, p), optional
        The student readouts ``a(t)``: required when `model` trains its
        readout (``lr_readout > 0``; the ODE starts from each replica's
        ``a(t[0])`` and the risk uses ``a(t)``), refused otherwise (the fixed
        readout is ``model.readout``).  Checked with the other arrays, before
        any integration.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold.
    escape : bool, optional
        Do the plateau/escape analysis; default (None): when it applies
        (σ = c z², ``T = I``, RMS entry of ``ρ(0)`` below 0.2, start above
        the escape threshold, and no specification field the analysis does
        not handle: :mod:`symquad.studies.applicability`; ``True`` cannot
        force it onto such a model, the reason is reported instead).
    alpha : float
        Family-wise level of the verdict's tests.
    progress : bool
        Progress of the ODE solve on stderr, as in :func:`validate`.
    N : int, optional
        The input dimension of the data: needed by the whole-run criteria.
    whole_run : bool, optional
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`; default:
        when `N` is given).
    seed : int
        Seed of the SDE ensemble of the whole-run criteria.
    resolution : bool
        Add ``report.resolution`` (as in :func:`validate`).
    finite_n : bool or None
        The O(1/N) correction of the mean, as in :func:`validate` (needs `N`).

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
    from ..stages import declare

    t_start = time.perf_counter()
    declare(model, "compare")
    _check_common(band, escape_fraction, alpha)
    _check_finite_n(finite_n)
    if escape not in (None, True, False):
        raise ValueError(f"escape must be None, True or False, got {escape!r}")
    t, Q, rho, T = _as_trajectories(model, t, Q, rho, T)
    _check_ode_horizon(model, t, Q, rho, T)
    R = Q.shape[0]
    a = _as_readout(model, readout, t, R)
    whole_run, N = _check_whole_run(model, whole_run, N, a)
    if model.constraint == "sphere":
        # lazy: scipy
        from ..numeric.integrate import check_sphere
        check_sphere(model, Q[:, 0], name="Q[:, 0]", tol=1e-6)
    risk = population_risk(model, Q, rho, T, a)
    numbers, ode, shared, t_ode = _analyse(
        model, t, Q, rho, risk, np.ones(R, bool), T, band=band,
        escape_fraction=escape_fraction, escape=escape, progress=progress, sgd_readout=a, N=N,
        finite_n=finite_n)
    numbers["finite_size_scaling_skipped"] = ("user data at one N: the finite-size scaling "
                                              "needs simulations at several N (validate)")
    numbers["verdict"] = _decide(numbers, R, alpha)
    if resolution:
        _add_resolution(numbers, model, t, risk, ode, Q, rho, T, a, shared)
    if whole_run:
        from .whole_run import add_whole_run
        numbers["verdict"] = add_whole_run(numbers, model, t, Q, rho, risk, T, N, alpha,
                                           seed=seed, shared=shared)
    else:
        from .whole_run import whole_run_not_run
        numbers["verdict"] = whole_run_not_run(
            numbers["verdict"], "whole_run=False" if N is not None else
            "the data's input dimension N is not given: compare(..., N=) or "
            "symquad validate --data FILE --N N")
    total = time.perf_counter() - t_start
    numbers["runtime_s"] = total
    numbers["runtime_phases_s"] = {"ode": t_ode, "analysis": total - t_ode}
    config = {**_model_config(model), "source": "user data", "N": N,
              "t_max": float(t[-1]), "replicas": R, "n_times": int(t.size),
              "T_is_identity": bool(np.array_equal(T, np.eye(model.p_star))),
              "replicas_share_ode": bool(shared), "alpha": alpha,
              "ode_start": "each replica's first state"}
    return ValidationReport(config=config, numbers=numbers, t=t, sgd_risk=risk, sgd_Q=Q,
                            sgd_rho=rho, T=T, sgd_readout=a, **ode)
