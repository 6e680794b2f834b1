r"""Whole-run criteria of the verdict: SGD against the order-parameter SDE, and the LNA spread.

The ODE criteria of :mod:`symquad.studies.validation` compare SGD with the
ODE started at each replica's realised overlaps.  After an escape from the
plateau that comparison is the wrong one: SGD and the ODE escape at times
that differ by O(1) and end at different points of the zero-risk manifold,
whatever ``N``.  The finite-``N`` theory makes a prediction for the *law* of the
whole run instead: the order-parameter SDE ``dX = f dt + √(D/N) dB``
(:mod:`symquad.numeric.sde`), run from the same starts.

**Criterion ``whole_run_law``.**  The SDE ensemble is simulated from the SGD
replicas' own initial overlaps (one SDE run per replica, independent noise).
At ``n_test`` recorded times (equally spaced over the run, the start excluded)
the two samples of each of five statistics are compared by the two-sample
Kolmogorov–Smirnov test: the risk and four statistics of the overlaps that are
invariant under rotations of the student units (and, for ``T = I``, of the
teacher): ``tr Q / p``, ``‖ρ‖²_F``, ``tr((ρᵀρ)²)`` and ``tr(Q²)/p``.  Multiple
testing: Holm's step-down correction over all ``5 · n_test`` p-values (a statistic that
the model fixes, such as ``tr Q / p = 1`` on the sphere, is left out; valid under
any dependence between them), family level ``alpha``.  Precision first: not tested
with fewer than 16 replicas (the KS test cannot reject at small levels below
that).

**Criterion ``lna_spread``** (replicas that share one start, no plateau, the
linear-noise prediction available): the replicas' variance ``s²`` of the risk at
``n_test`` times against ``σ² = ∇εᵀΣ∇ε/N`` (:func:`symquad.fluctuations`).  The
sampling law of ``s²`` is skewed at a few dozen replicas (for Gaussian data
``(R−1)s²/σ² ~ χ²_{R−1}``): a normal approximation with the standard error of
``s²`` puts 11 times too much weight in the tails at ``R = 32`` and level
0.01/13 (measured: 2 false FAILs in 15 runs from informed starts).  So ``s²/σ²`` is referred
to the moment-matched scaled chi-square ``χ²_ν/ν`` with
``ν = 2/v``, ``v = (κ − (R−3)/(R−1))/R`` the variance of ``s²/σ²`` for a
population kurtosis ``κ`` (exact ``χ²_{R−1}`` for Gaussian data, ``κ = 3``), ``κ`` the
sample kurtosis but at least 3 (the linear-noise law is Gaussian; a sample
kurtosis below it is noise and would make the test strict); two-sided
p-values, Bonferroni over the times at level ``alpha``; not tested when the
relative standard error ``√v`` exceeds 0.3 (``√(2/(R−1))`` for Gaussian data:
at least 24 replicas, where a 3× variance error is found 75 % of the time at
one time and level 0.01/20).  Both criteria are skipped, with the reason, when
their cost is out of proportion (:func:`sde_cost_reason`).

Both are in :func:`whole_run_checks`; :func:`decide_whole_run` adds them to the
verdict of :func:`symquad.studies.verdict.decide`.  Their calibration (false-FAIL
rate of the true model, power against wrong models) is measured by
``benchmarks/calibrate_verdict.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import time

import numpy as np

# the module, not simulate: looked up when called, so a replacement at the source
# (the tests' forbid / monkeypatch of symquad.numeric.simulate.simulate) takes effect
from ..numeric import simulate as _sim
from ..numeric.drift_derivatives import finite_n_drift
from ..numeric.fluctuations import fluctuations, mean_correction_seconds
from ..numeric.kernels import (SECOND_ORDER_STAGE, _derivatives, _untimed, check_kernels,
                               diffusion_seconds, diffusion_support, kernels)
from ..numeric.layout import state_layout
from ..numeric.sde import DEFAULT_DT, _sqrt_psd, sde_noise
from ..numeric.sde_noise import SampledNoise
from ..spectrum import has_spectrum
from ..stages import declare
from .verdict import _check

__all__ = ["invariant_statistics", "statistic_names", "whole_run_numbers", "whole_run_checks",
           "decide_whole_run", "whole_run_not_run", "N_TEST", "MIN_REPLICAS", "STATISTICS",
           "sde_cost_reason", "whole_run_sde_seconds", "MAX_WHOLE_RUN_SECONDS"]

#: Recorded times tested (equally spaced over the run).
N_TEST = 20
#: Fewest replicas for the law criterion.
MIN_REPLICAS = 16
#: Names of the statistics compared at each time.
STATISTICS = ("risk", "tr Q / p", "|rho|_F^2", "tr (rho^T rho)^2", "tr Q^2 / p")
#: A statistic whose pooled SGD and SDE values agree to this relative spread is fixed by
#: the model (``tr Q / p = 1`` on the sphere) and not tested.
_CONSTANT = 1e-9
#: LNA criterion: largest relative standard error of the replicas' variance.
_LNA_PRECISION = 0.3
#: LNA criterion: tested while the predicted spread of every state entry is at most this
#: fraction of the state's scale (the expansion parameter of the linearisation).
_LNA_VALIDITY = 0.05
#: ... and while the second-order term of the risk's variance is at most this fraction.
_LNA_SECOND_ORDER = 0.05


def invariant_statistics(risk, Q, rho):
    """The five statistics of :data:`STATISTICS`; shape ``(5,) + risk.shape``.

    With an input spectrum (``Q`` of one more axis than ``risk`` and a matrix: the block
    axis, docs/model.md §1a) the four overlap statistics are taken per block
    (:func:`statistic_names` names them): shape ``(1 + 4B,) + risk.shape``.
    """
    if np.ndim(Q) == np.ndim(risk) + 3:
        per = [invariant_statistics(risk, Q[..., c, :, :], rho[..., c, :, :])[1:]
               for c in range(np.shape(Q)[-3])]
        return np.concatenate([np.asarray(risk, float)[None]] + per)
    p = Q.shape[-1]
    rtr = np.swapaxes(rho, -1, -2) @ rho
    return np.stack([risk,
                     np.trace(Q, axis1=-2, axis2=-1) / p,
                     np.trace(rtr, axis1=-2, axis2=-1),
                     np.sum(rtr * rtr, axis=(-2, -1)),
                     np.sum(Q * Q, axis=(-2, -1)) / p])


def statistic_names(Q, risk) -> tuple:
    """The names of :func:`invariant_statistics`' rows: :data:`STATISTICS`, or with an input
    spectrum the risk and the four overlap statistics of each block (``"tr Q / p [block 2]"``)."""
    if np.ndim(Q) == np.ndim(risk) + 3:
        return (STATISTICS[0],) + tuple(f"{name} [block {c + 1}]"
                                        for c in range(np.shape(Q)[-3])
                                        for name in STATISTICS[1:])
    return STATISTICS


def _holm(pvalues, alpha):
    """Holm's step-down adjusted p-values (monotone) and the rejections at `alpha`."""
    p = np.asarray(pvalues, float)
    order = np.argsort(p)
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted, adjusted <= alpha


def _test_indices(t, n_test):
    idx = np.unique(np.round(np.linspace(0, len(t) - 1, n_test + 1)).astype(int))[1:]
    return idx


def whole_run_numbers(model, t, sgd_Q, sgd_rho, sgd_risk, T, N, *, seed=0, n_test=N_TEST,
                      dt=None, form=None, lna=True, sde_model=None):
    """Numbers of the whole-run criteria (module docstring); JSON-serialisable.

    Parameters
    ----------
    model : Model
        The theory (its SDE and LNA).
    t, sgd_Q, sgd_rho, sgd_risk
        The SGD replicas (``(R, n, …)``), finite.
    T : array (p*, p*)
    N : int
        The input dimension of the data.
    seed : int
        Seed of the SDE noise.
    sde_model : Model, optional
        Run the SDE of this model instead (used to measure power).
    """
    from scipy.stats import ks_2samp

    R = sgd_Q.shape[0]
    out = {"replicas": int(R), "N": int(N), "n_test": int(n_test)}
    t = np.asarray(t, float)
    t0 = float(t[0])
    theory = sde_model or model
    if R < MIN_REPLICAS:       # neither criterion can be tested: do not run the SDE
        out.update(law={"pvalues": [], "tests": [], "times": []}, sde_diverged=0,
                   lna={"applies": False, "reason": f"needs >= {MIN_REPLICAS} replicas"})
        return out
    T = np.asarray(T, float)
    t_span = float(t[-1] - t0) if t[-1] > t0 else 1.0 / N
    lna_costly = _lna_cost_reason(theory, form)
    # the SDE with SGD's O(1/N) drift (docs/derivation.md §8.3a): without it the SDE's mean
    # is the ODE's plus the curvature term only, and at a risk floor the replicas resolve
    # the difference (the issue-22 variant: KS p = 4e-5 on tr Q²/p at N = 1000)
    # (only where the O(1/N) stage implements every field of the model: default-deny)
    finite_n = theory.constraint != "sphere" and _implements(theory, SECOND_ORDER_STAGE)
    too_costly = sde_cost_reason(theory, form, replicas=R, t_span=t_span,
                                 start=(sgd_Q[:, 0], sgd_rho[:, 0]), T=T, dt=dt,
                                 finite_n=finite_n)
    if too_costly:
        # the SDE (one D per replica and step) is too costly; the LNA (one trajectory)
        # may not be
        out.update(skipped=too_costly, law={"pvalues": [], "tests": [], "times": []},
                   sde_diverged=0)
        if lna_costly or not lna:
            out["lna"] = {"applies": False, "reason": lna_costly or "not requested"}
        else:
            out["lna"] = _lna_or_reason(theory, t, sgd_Q, sgd_rho, sgd_risk, T, N,
                                        _test_indices(t, n_test), form)
        return out
    run = _sim.simulate(theory, N=N, t_max=t_span, replicas=R, seed=seed, method="sde",
                        Q0=sgd_Q[:, 0], rho0=sgd_rho[:, 0], T=T, t_eval=t - t0,
                        on_divergence="stop", dt=dt, form=form, finite_n=finite_n)
    out["sde_finite_n"] = finite_n
    ok = run.status == "ok"
    out["sde_diverged"] = int(np.sum(~ok))
    out["sde_steps"] = int(getattr(run, "sde_steps", 0))
    idx = _test_indices(t, n_test)
    a = invariant_statistics(sgd_risk, sgd_Q, sgd_rho)
    b = invariant_statistics(run.risk, run.Q, run.rho)
    names = statistic_names(sgd_Q, sgd_risk)
    pvals, where = [], []
    for s in range(len(names)):
        for i in idx:
            x, y = a[s][:, i], b[s][ok, i]
            x, y = x[np.isfinite(x)], y[np.isfinite(y)]
            if len(x) < 2 or len(y) < 2:
                continue
            pooled = np.concatenate([x, y])
            if np.ptp(pooled) <= _CONSTANT * max(1.0, np.max(np.abs(pooled))):
                # fixed by the model in both (tr Q = p on the sphere): KS would test rounding
                continue
            pvals.append(float(ks_2samp(x, y).pvalue))
            where.append((names[s], float(t[i])))
    out["law"] = {"pvalues": pvals, "tests": [list(w) for w in where],
                  "statistics": len(names),
                  "sde_risk_mean": [float(v) for v in np.nanmean(run.risk, 0)[idx]],
                  "sgd_risk_mean": [float(v) for v in np.nanmean(sgd_risk, 0)[idx]],
                  "times": [float(v) for v in t[idx]]}
    out["sde_noise"] = getattr(run, "sde_noise", "gaussian")
    if not lna:
        out["lna"] = {"applies": False, "reason": "not requested"}
    elif lna_costly:
        out["lna"] = {"applies": False, "reason": lna_costly}
    else:
        out["lna"] = _lna_or_reason(theory, t, sgd_Q, sgd_rho, sgd_risk, T, N, idx, form)
    return out


def _lna_or_reason(model, t, sgd_Q, sgd_rho, sgd_risk, T, N, idx, form):
    """The LNA criterion's numbers, or why it does not apply (replicas from different starts)."""
    shared = bool(np.allclose(sgd_Q[:, 0], sgd_Q[:1, 0], atol=1e-14)
                  and np.allclose(sgd_rho[:, 0], sgd_rho[:1, 0], atol=1e-14))
    if not shared:
        return {"applies": False, "reason": "the replicas start from different overlaps (a "
                "random start: the linear-noise expansion breaks down at the escape)"}
    return _lna_numbers(model, t, sgd_Q, sgd_rho, sgd_risk, T, N, idx, form)


#: Largest state of the whole-run SDE with the matrix kernels (σ = c z²), and of the
#: LNA and the O(1/N) mean in the verdict (the risk's Hessian by polarisation costs
#: ``dim²`` risk evaluations per recorded time; p = 16, p* = 2 has 168 entries).
MAX_SDE_STATE = 600
MAX_LNA_STATE = 200
#: Largest estimated seconds of one trajectory of the LNA with the O(1/N) mean (or of the
#: forward sensitivities) for the verdict's criteria (:func:`finite_n_seconds`) ...
LNA_VERDICT_SECONDS = 300.0
#: ... counted as this many right-hand sides (the drift's stencils) and diffusion matrices
#: (one per step of the ODE's pass, interpolated between): measured 160–650 and 19–77 for
#: (4, 2) ReLU at t ≤ 10, (4, 2) z² and the issue-22 variant (6, 2) at t ≤ 100.
LNA_RHS_PER_TRAJECTORY = 600
LNA_D_PER_TRAJECTORY = 80
#: Largest estimated seconds of the verdict's whole-run SDE (a lower bound, see
#: :func:`whole_run_sde_seconds`); above it the law criterion is skipped with the estimate.
MAX_WHOLE_RUN_SECONDS = 600.0


def whole_run_sde_seconds(model, form, replicas, t_span, start, T, dt=None,
                          finite_n=False) -> float:
    """A lower bound on the seconds of the whole-run SDE, from one measured step's parts.

    The SDE makes at least ``ceil(t_span/dt)`` steps, each three drift calls over the
    replicas and one noise (:mod:`symquad.numeric.sde`), and with `finite_n` one O(1/N)
    drift (:func:`~symquad.numeric.drift_derivatives.finite_n_drift`); each is timed once
    on the replicas' starts (a first call of each, which may generate or load the kernels
    and ``D``'s module, is not counted).  Measured, so it holds for every activation,
    width and noise.
    """
    form, noise = sde_noise(model, form)
    k = kernels(model, form)
    Q0, rho0 = (np.asarray(x, float) for x in start)
    a = (np.tile([float(c) for c in model.readout], (replicas, 1)) if model.readout_trained
         else None)
    k.rhs(Q0, rho0, T, a, t=0.0)
    t_begin = time.perf_counter()
    f = k.layout.pack(*k.rhs(Q0, rho0, T, a, t=0.0))
    t_rhs = time.perf_counter() - t_begin

    def noise_call():
        if noise == "gaussian":
            _sqrt_psd(k.diffusion(Q0, rho0, T, a, t=0.0))
        else:
            SampledNoise(model, 1000, replicas, np.random.default_rng(0))(
                np.arange(replicas), Q0, rho0, T, a, f, 0.1, k.params_at(0.0))
    noise_call()            # the first D may derive or load its module: not a step's cost
    t_begin = time.perf_counter()
    noise_call()
    t_noise = time.perf_counter() - t_begin
    t_finite = 0.0
    if finite_n:
        der = _derivatives(_untimed(model, "simulate(method='sde')"), form)
        x = k.layout.pack(Q0, rho0, a)
        finite_n_drift(der, k, x, T, f, 0.0, 1000)
        t_begin = time.perf_counter()
        finite_n_drift(der, k, x, T, f, 0.0, 1000)
        t_finite = time.perf_counter() - t_begin
    steps = math.ceil(t_span / (DEFAULT_DT if dt is None else dt))
    return steps * (3.0 * t_rhs + t_noise + t_finite)


def _implements(model, stage) -> bool:
    """Whether `stage` implements every field `model` changes (its refusal, as a bool)."""
    try:
        declare(model, stage)
    except ValueError:
        return False
    return True


def sde_cost_reason(model, form=None, *, replicas=None, t_span=None, start=None, T=None,
                    dt=None, finite_n=False) -> str:
    """Why the whole-run SDE is not run for `model` (empty when it is affordable).

    Every model whose drift kernels exist is run: the noise is chosen by cost
    (:func:`symquad.numeric.sde_noise.default_noise`: sampled where ``D`` is costly, so no
    activation or width is excluded for want of ``D``).  The reason is the kernels'
    own refusal (a pair without a drift, a width beyond the kernels' cost limits), or —
    when `replicas`, `t_span`, `start` (the replicas' ``(Q0, ρ0)``) and `T` are given —
    the run's measured cost bound (:func:`whole_run_sde_seconds`) above
    :data:`MAX_WHOLE_RUN_SECONDS`, with the number.
    """
    try:
        form, noise = sde_noise(model, form)
        check_kernels(model, form)
    except ValueError as exc:
        return f"the SDE's kernels refuse this model: {exc}"
    if replicas is None or t_span is None or start is None or T is None:
        return ""
    seconds = whole_run_sde_seconds(model, form, replicas, t_span, start, T, dt, finite_n)
    if seconds > MAX_WHOLE_RUN_SECONDS:
        return (f"the whole-run SDE ({replicas} replicas, t in [0, {t_span:.4g}], "
                f"{noise} noise) is estimated at >= {seconds:.3g} s (limit "
                f"{MAX_WHOLE_RUN_SECONDS:g} s, symquad.studies.whole_run."
                f"MAX_WHOLE_RUN_SECONDS)")
    return ""


def _lna_cost_reason(model, form=None) -> str:
    """Why the LNA spread criterion is not computed for `model` (empty when it is).

    The LNA integrates ``Σ`` along the ODE with ``D`` at the ODE solver's steps and the
    drift's stencils at every right-hand side: skipped where ``D`` is not derived, and
    where one trajectory is too costly for the verdict (:func:`finite_n_cost`, the rule
    of the O(1/N) mean too).
    """
    if has_spectrum(model):
        return ("validate's linear-noise criterion is not built for an input spectrum yet "
                "(the block LNA itself is: sq.fluctuations, docs/derivation.md §8.8)")
    reason = diffusion_support(model)
    if reason is not None:
        return f"the diffusion matrix of the linear-noise prediction is not derived: {reason}"
    costly = finite_n_cost(model, _lna_form(model, form))
    return f"the linear-noise prediction is too costly here {costly}" if costly else ""


def _lna_form(model, form=None):
    """The LNA's kernel form: `form`, else the matrix kernels for a quadratic model (else
    the default of :func:`~symquad.numeric.fluctuations.fluctuations`)."""
    return form or ("matrix" if model.is_quadratic else None)


def finite_n_seconds(model, form=None, diffusion=True) -> float:
    """Estimated seconds of one trajectory of the verdict's finite-N theory (cost law).

    :data:`LNA_RHS_PER_TRAJECTORY` right-hand sides of the drift's stencils
    (:func:`~symquad.numeric.fluctuations.mean_correction_seconds`: ``dim`` directions,
    the Jacobian and the curvature) and, with `diffusion`, :data:`LNA_D_PER_TRAJECTORY`
    diffusion matrices (:func:`~symquad.numeric.kernels.diffusion_seconds`).
    """
    est = LNA_RHS_PER_TRAJECTORY * mean_correction_seconds(model, form)
    if diffusion:
        est += LNA_D_PER_TRAJECTORY * diffusion_seconds(model, form)
    return est


def finite_n_cost(model, form=None, diffusion=True) -> str:
    """``"(…)"`` when the verdict's finite-N theory is too costly for `model`, else ``""``.

    One rule for the linear-noise spread, the O(1/N) correction of the mean and (with
    ``diffusion=False``: no ``D``) the resolution: the state at most
    :data:`MAX_LNA_STATE` entries and one trajectory (:func:`finite_n_seconds`) estimated
    at most :data:`LNA_VERDICT_SECONDS`.  The Jacobian, ``f₁`` and the curvature come
    from the drift kernels (symquad.numeric.drift_derivatives) for every activation pair.
    """
    dim = state_layout(model).dim
    if dim > MAX_LNA_STATE:
        return f"({dim} state entries, limit {MAX_LNA_STATE})"
    est = finite_n_seconds(model, form, diffusion)
    if est > LNA_VERDICT_SECONDS:
        return (f"(one trajectory estimated at {est:.3g} s"
                + (" with its diffusion matrices" if diffusion else "")
                + f", limit {LNA_VERDICT_SECONDS:g} s)")
    return ""


def _lna_numbers(model, t, sgd_Q, sgd_rho, sgd_risk, T, N, idx, form):
    # reached only where _lna_cost_reason (the same finite_n_cost) is empty
    try:
        # the spread criteria need Σ only (the O(1/N) mean, second_order=True, is not
        # used here: skipping it keeps this criterion's cost that of the LNA)
        fl = fluctuations(model, sgd_Q[0, 0], sgd_rho[0, 0], T, N, t - t[0],
                          form=_lna_form(model, form),
                          second_order=False)
    except (ValueError, ArithmeticError) as exc:        # too large for the entry route, ...
        return {"applies": False, "reason": f"no linear-noise prediction: {exc}"}
    # the expansion's own validity: the predicted spread of the state small against the
    # state (beyond it — e.g. along a flat manifold of minima, where Σ grows linearly —
    # the linearisation has broken down and is not tested)
    X = fl.layout.pack(fl.Q, fl.rho, fl.readout)
    small = np.max(fl.state_std, axis=1) <= _LNA_VALIDITY * np.maximum(
        1.0, np.max(np.abs(X), axis=1))
    # ... and the risk's spread first order in ζ: near a curved manifold of minima the
    # quadratic term takes over and the straight-line displacements of the linearisation
    # leave the manifold (measured: the replicas' variance falls to 0.4 of the prediction)
    # (at the tested times only: the risk's Hessian costs O(dim + pairs) risk evaluations
    # per time)
    g, H, S = fl.risk_gradient[idx], fl.risk_hessian_at(idx), fl.covariance[idx]
    first = np.einsum("ti,tij,tj->t", g, S, g) / N
    HS = H @ S
    second = 0.5 * np.einsum("tij,tji->t", HS, HS) / N**2
    with np.errstate(divide="ignore", invalid="ignore"):
        linear = second <= _LNA_SECOND_ORDER * (first + second)
    keep = small[idx] & linear
    idx, pred = idx[keep], (first + second)[keep]
    if len(idx) < 3:
        return {"applies": False, "reason": f"the linear-noise expansion is valid (state "
                f"spread <= {_LNA_VALIDITY:.0%} of the state, second-order part of the risk's "
                f"variance <= {_LNA_SECOND_ORDER:.0%}) at fewer than 3 tested times"}
    x = sgd_risk[:, idx]
    R = x.shape[0]
    c = x - x.mean(0)
    s2 = (c**2).sum(0) / (R - 1)
    m4 = (c**4).mean(0)
    se = np.sqrt(np.maximum(m4 - s2**2 * (R - 3) / (R - 1), 0) / R)
    # under the hypothesis the variance is `pred`: the law of s²/pred is a scaled
    # chi-square matched to its variance v (from the sample kurtosis, at least Gaussian)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurtosis = np.maximum(m4 / s2**2, 3.0)
        v = np.maximum(kurtosis - (R - 3) / (R - 1), 0) / R
        rel = np.sqrt(v)
        z = (s2 - pred) / (pred * rel)
        pvalues = _variance_pvalues(s2 / pred, 2.0 / v)
    return {"applies": True, "reason": "", "times": [float(v) for v in t[idx]],
            "sgd_variance": [float(v) for v in s2], "predicted_variance": [float(v) for v in pred],
            "z": [float(v) for v in z], "relative_se": [float(v) for v in rel],
            "pvalues": [float(v) for v in pvalues]}


def _variance_pvalues(ratio, dof):
    """Two-sided p-values of variance ratios ``s²/σ²`` under ``χ²_ν/ν`` (``ν = dof``)."""
    from scipy.stats import chi2
    x = np.asarray(ratio, float) * dof
    lower = chi2.cdf(x, dof)
    upper = chi2.sf(x, dof)
    return np.minimum(1.0, 2.0 * np.minimum(lower, upper))


def whole_run_checks(numbers, alpha):
    """The criteria ``whole_run_law`` and ``lna_spread`` from :func:`whole_run_numbers`'s output."""
    checks = []
    law = numbers["law"]
    R = numbers["replicas"]
    if numbers.get("skipped"):      # too costly: listed with the reason
        checks.append(_check("whole_run_law", "not tested",
                             f"whole-run law vs the SDE: skipped ({numbers['skipped']})"))
    elif R < MIN_REPLICAS or not law["pvalues"]:
        checks.append(_check("whole_run_law", "not tested",
                             f"whole-run law vs the SDE: needs >= {MIN_REPLICAS} replicas"))
    elif numbers["sde_diverged"] > 0.1 * R:
        checks.append(_check("whole_run_law", "fail",
                             f"whole-run law vs the SDE: the SDE diverged in "
                             f"{numbers['sde_diverged']} of {R} runs", value=1.0))
    else:
        adjusted, reject = _holm(law["pvalues"], alpha)
        n_stat = law.get("statistics", len(STATISTICS))
        k = int(np.argmin(adjusted))
        stat, when = law["tests"][k]
        ok = not reject.any()
        checks.append(_check(
            "whole_run_law", "pass" if ok else "fail",
            f"whole-run law vs the SDE (same starts, {R} runs each): smallest Holm-adjusted "
            f"KS p-value {adjusted[k]:.3g} ({stat} at t = {when:.4g}) "
            f"{'>' if ok else '<='} alpha={alpha:g} over {len(adjusted)} tests "
            f"({n_stat} statistics x {len(law['times'])} times"
            + (", those the model fixes left out)" if len(adjusted) < n_stat
               * len(law["times"]) else ")"),
            value=float(adjusted[k])))
    lna = numbers["lna"]
    if not lna.get("applies"):
        checks.append(_check("lna_spread", "not tested",
                             "replica spread vs the linear-noise prediction: not applicable ("
                             + (lna.get("reason") or "no linear-noise prediction") + ")"))
    else:
        rel = np.asarray(lna["relative_se"])
        z = np.abs(np.asarray(lna["z"]))
        pvalues = np.asarray(lna["pvalues"])
        level = alpha / len(pvalues)
        if not np.all(np.isfinite(rel)) or np.max(rel) > _LNA_PRECISION:
            checks.append(_check("lna_spread", "not tested",
                                 f"replica spread vs the linear-noise prediction: the replicas' "
                                 f"variance is resolved to {np.nanmax(rel):.0%} only (> "
                                 f"{_LNA_PRECISION:.0%}; more replicas)"))
        else:
            ratio = np.asarray(lna["sgd_variance"]) / np.asarray(lna["predicted_variance"])
            ok = bool(np.min(pvalues) > level)
            checks.append(_check(
                "lna_spread", "pass" if ok else "fail",
                f"replica spread vs the linear-noise prediction: smallest p-value of the "
                f"variance ratio {np.min(pvalues):.3g} {'>' if ok else '<='} alpha/n = "
                f"{level:.3g} (scaled chi-square, Bonferroni over {len(pvalues)} times, "
                f"alpha={alpha:g}; variance ratio {np.min(ratio):.3g}-{np.max(ratio):.3g}, "
                f"largest |z| {np.max(z):.2f})",
                value=float(np.min(pvalues)), threshold=level))
    return checks


def decide_whole_run(verdict, numbers, alpha):
    """The verdict of :func:`symquad.studies.verdict.decide` with the whole-run criteria added.

    The whole-run criteria join the others: any FAIL fails the verdict.  When
    the law criterion was tested and passed, it stands in for the ODE
    criteria that compare single trajectories over a window containing an
    escape: a ``mean_deviation`` whose window is the whole run of a start with
    a plateau (``escape`` analysis not applicable, e.g. ``T ≠ I`` or a
    non-quadratic activation, from a random start) is reported but does not
    decide (it compares SGD with the ODE after SGD escaped and the ODE did
    not); PASS then needs the band criterion or the law criterion.
    """
    checks = list(verdict["checks"]) + whole_run_checks(numbers["whole_run"], alpha)
    status = {c["name"]: c["status"] for c in checks}
    law_ok = status.get("whole_run_law") == "pass"
    demoted = []
    if law_ok and numbers["whole_run"].get("random_start_without_escape_analysis"):
        for c in checks:
            if c["name"] in ("mean_deviation", "band") and c["status"] == "fail":
                c["status"] = "not tested"
                c["text"] += (" [not deciding: a whole-run comparison of single trajectories "
                              "from a start with a plateau; the law criterion decides]")
                demoted.append(c["name"])
        status = {c["name"]: c["status"] for c in checks}
    if "fail" in status.values():
        outcome = "FAIL"
    elif (status.get("mean_deviation") == "pass" and status.get("band") == "pass") or \
            (law_ok and status.get("mean_deviation") != "fail" and status.get("band") != "fail"):
        outcome = "PASS"
    else:
        outcome = "INCONCLUSIVE"
    return {**verdict, "verdict": outcome, "passed": outcome == "PASS", "checks": checks,
            "demoted": demoted}


def whole_run_not_run(verdict, reason):
    """The verdict with both whole-run criteria listed as not tested, for `reason`."""
    checks = list(verdict["checks"]) + [
        _check("whole_run_law", "not tested", f"whole-run law vs the SDE: not run ({reason})"),
        _check("lna_spread", "not tested",
               f"replica spread vs the linear-noise prediction: not run ({reason})")]
    return {**verdict, "checks": checks}


def add_whole_run(numbers, model, t, Q, rho, risk, T, N, alpha, *, seed=0, shared=False,
                  dt=None, form=None):
    """Compute the whole-run numbers into ``numbers["whole_run"]`` and return the new verdict.

    ``numbers`` are a report's numbers with ``numbers["verdict"]`` from
    :func:`symquad.studies.verdict.decide`; ``Q, rho, risk`` the finite replicas.
    """
    wr = whole_run_numbers(model, t, Q, rho, risk, T, N, seed=seed, dt=dt, form=form)
    wr["random_start_without_escape_analysis"] = bool(
        not shared and not numbers["escape"].get("defined"))
    numbers["whole_run"] = wr
    return decide_whole_run(numbers["verdict"], numbers, alpha)
