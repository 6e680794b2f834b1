"""The mean-deviation criterion: its time window and the O(1/N) finite-N correction
of the ODE mean (``finite_n``).

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import math

import numpy as np

from ..numeric.errors import DivergenceError
from ..numeric.fluctuations import fluctuations
from ..numeric.quadratic_law import quadratic_law
from ..spectrum import has_spectrum
from .validation_common import _finite_float
from .whole_run import finite_n_cost



#: Mean-deviation window: until the median ODE ‖ρ‖² has grown by this factor.
_RHO_GROWTH = 2.0


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


def _finite_n_correction(model, t, Q0, rho0, T, a0, N, finite_n=None):
    """``(c_ε(t), valid(t), reason)`` (:func:`_finite_n_fluctuations` without the
    fluctuations)."""
    return _finite_n_fluctuations(model, t, Q0, rho0, T, a0, N, finite_n)[:3]


def _finite_n_fluctuations(model, t, Q0, rho0, T, a0, N, finite_n=None):
    """``(c_ε(t), valid(t), reason, fl)``: the O(1/N) correction of the mean risk from one
    start, and the :class:`~symquad.numeric.fluctuations.Fluctuations` it came from (None
    where it is not available).

    ``E[ε_SGD(t) | start] = ε_ODE(t) + c_ε(t)/N + O(N⁻²)`` (:func:`symquad.fluctuations`,
    Σ(0) = 0: the ODE starts at the replica's realised overlaps).  Replicas with their own
    starts share ``c_ε`` up to ``O(N^-1/2)`` relative (their starts differ by that much), so
    one start serves them all.  ``valid`` is the expansion's own validity flag; where it is
    False the correction is not applied.  None and a reason where it is not available:
    ``finite_n=None`` (automatic) computes it when one right-hand side of the LNA with the
    correction is affordable (:func:`symquad.studies.whole_run.finite_n_cost`, every
    activation pair: the Jacobian, ``f₁`` and the curvature come from the drift kernels).
    """
    if N is None:
        return None, None, ("the data's input dimension N is not given (compare(..., N=) or "
                            "--N): tested against the N -> infinity ODE"), None
    if has_spectrum(model):
        return None, None, ("not derived for an input spectrum yet (docs/model.md §1a): "
                            "tested against the ODE"), None
    if finite_n is False:
        return None, None, "finite_n=False: tested against the ODE", None
    if finite_n is None:
        costly = finite_n_cost(model)
        if costly:
            return None, None, (f"too costly here {costly}; finite_n=True computes it: tested "
                                "against the ODE"), None
    try:
        fl = fluctuations(model, Q0, rho0, T, N, t - t[0], a0=a0, second_order=True)
    except (ValueError, ArithmeticError, NotImplementedError, DivergenceError) as exc:
        return None, None, f"not available ({exc}): tested against the ODE", None
    if fl.risk_mean_correction is None:
        return None, None, (f"not computed ({fl.second_order_note}): tested against the "
                            "ODE"), None
    c = np.asarray(fl.risk_mean_correction, float)
    valid = np.asarray(fl.expansion_valid, bool) & np.isfinite(c)
    return np.where(valid, c, 0.0), valid, "", fl


def _predicted_law_test(fl, use, N, R, mean_dev, remainder):
    r"""``(p(t), se(t))`` of the replica mean under the predicted second-order law.

    Each replica's ``Y = N(ε − ε_ODE) − c_ε`` is, to the order of ``c_ε``, the generalised
    χ² variable ``√N gᵀζ + ½(ζᵀHζ − tr HΣ)``, ``ζ ~ N(0, Σ)`` (``g``, ``H`` the risk's
    gradient and Hessian, ``Σ`` the LNA covariance, from `fl`;
    :mod:`symquad.numeric.quadratic_law`).  The O(N⁻²) remainder ``|c_ε|/N^{3/2}`` enters
    as an independent Gaussian of that standard deviation added to the mean (as it enters
    the Student test's s.e.).  ``p`` is the two-sided saddlepoint p-value of the observed
    mean ``N·mean_dev`` for ``R`` independent replicas, ``se = √(κ₂/R)/N`` the predicted
    standard error of the mean deviation (remainder included); NaN where `use` is False.

    Parameters
    ----------
    fl : Fluctuations
        From :func:`_finite_n_fluctuations` (times ``0 … len(use) − 1``).
    use : ndarray (n,) of bool
        Times where the law is applied (the window, where the expansion holds).
    N, R : int
    mean_dev, remainder : ndarray (n,)
        ``mean_r(ε_SGD − ε_ODE) − c_ε/N`` and ``|c_ε|/N^{3/2}``.
    """
    n = len(use)
    p, se = np.full(n, np.nan), np.full(n, np.nan)
    idx = np.nonzero(use)[0]
    if not idx.size:
        return p, se
    H = fl.risk_hessian_at(idx)
    root_n = math.sqrt(N)
    for j, i in enumerate(idx):
        law = quadratic_law(root_n * fl.risk_gradient[i], H[j], fl.covariance[i],
                            v=R * (N * remainder[i]) ** 2)
        se[i] = math.sqrt(law.cumulant(2) / R) / N
        p[i] = law.mean_p_value(N * mean_dev[i], R)
    return p, se


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


# ---------------------------------------------------------------------------
# validate and compare
# ---------------------------------------------------------------------------
def _check_finite_n(finite_n):
    if finite_n not in (None, True, False) or isinstance(finite_n, (int, float)) and \
            not isinstance(finite_n, bool):
        raise ValueError(f"finite_n must be None, True or False, got {finite_n!r}")
