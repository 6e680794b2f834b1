"""The mean-deviation criterion: its time window and the O(1/N) finite-N correction
of the ODE mean (``finite_n``).

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import numpy as np

from ..spectrum import has_spectrum
from .validation_common import _finite_float



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
    """``(c_ε(t), valid(t), reason)``: the O(1/N) correction of the mean risk from one start.

    ``E[ε_SGD(t) | start] = ε_ODE(t) + c_ε(t)/N + O(N⁻²)`` (:func:`symquad.fluctuations`,
    Σ(0) = 0: the ODE starts at the replica's realised overlaps).  Replicas with their own
    starts share ``c_ε`` up to ``O(N^-1/2)`` relative (their starts differ by that much), so
    one start serves them all.  ``valid`` is the expansion's own validity flag; where it is
    False the correction is not applied.  None and a reason where it is not available:
    ``finite_n=None`` (automatic) computes it when one right-hand side of the LNA with the
    correction is affordable (:func:`symquad.studies.whole_run.finite_n_cost`, every
    activation pair: the Jacobian, ``f₁`` and the curvature come from the drift kernels).
    """
    from .whole_run import finite_n_cost
    if N is None:
        return None, None, ("the data's input dimension N is not given (compare(..., N=) or "
                            "--N): tested against the N -> infinity ODE")
    if has_spectrum(model):
        return None, None, ("not derived for an input spectrum yet (docs/model.md §1a): "
                            "tested against the ODE")
    if finite_n is False:
        return None, None, "finite_n=False: tested against the ODE"
    if finite_n is None:
        costly = finite_n_cost(model)
        if costly:
            return None, None, (f"too costly here {costly}; finite_n=True computes it: tested "
                                "against the ODE")
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


# ---------------------------------------------------------------------------
# validate and compare
# ---------------------------------------------------------------------------
def _check_finite_n(finite_n):
    if finite_n not in (None, True, False) or isinstance(finite_n, (int, float)) and \
            not isinstance(finite_n, bool):
        raise ValueError(f"finite_n must be None, True or False, got {finite_n!r}")
