r"""What a validation run can resolve: the smallest parameter change its mean-deviation test detects.

The mean-deviation criterion (:mod:`symquad.studies.verdict`) rejects when, at some
time ``t`` of its window, ``|mean_r(ε_SGD − ε_ODE)(t)| / se(t)`` exceeds the critical
value ``c`` (Student t, Bonferroni over the window's times, level α).  If the data came
from a model whose parameter ``θ`` differs by ``δθ`` from the theory's, the mean
deviation is, to first order, ``δθ · dε(t)/dθ`` (the forward sensitivity of the risk
along the theory's ODE, :func:`symquad.numeric.sensitivity.risk_sensitivity`, averaged
over the starts), so the test reaches its critical value where

.. math::  δθ^* = \frac{c}{\max_{t \in \text{window}} |dε(t)/dθ| / se(t)} ,

which is the *resolution* reported: a change of ``δθ*`` is detected about half the
time, ``2δθ*`` almost always (the largest ``z`` is then about ``2c``), ``δθ*/2`` rarely.
The standard errors ``se(t)`` are the run's own (the replicas' spread of
``ε_SGD − ε_ODE``), so the resolution is in the model's units for this run's ``N``,
replicas and times.  Other criteria (band, whole-run law) may detect smaller changes;
this is the resolution of the one with a closed-form power.
"""

from __future__ import annotations

import math

import numpy as np

from ..spectrum import has_spectrum
from .whole_run import finite_n_cost

__all__ = ["resolution_numbers", "format_resolution", "MAX_STARTS"]

#: Starts whose sensitivities are averaged for a random start (replicas with their own ODE).
MAX_STARTS = 4


def _why_not(model) -> str:
    if has_spectrum(model):
        return ("the forward sensitivities are not derived for an input spectrum yet "
                "(docs/model.md §1a)")
    # the Jacobian comes from the drift kernels (every pair); no diffusion matrix is needed
    costly = finite_n_cost(model, diffusion=False)
    return f"the sensitivities are too costly here {costly}" if costly else ""


def resolution_numbers(model, t, d_risk, Q0, rho0, T, a0, window, critical, *, shared):
    """``numbers["resolution"]`` (JSON-serialisable; module docstring).

    Parameters
    ----------
    model : Model
    t : ndarray (n,)
    d_risk : ndarray (R, n)
        ``ε_SGD − ε_ODE`` of the replicas used.
    Q0, rho0 : ndarray (R, p, p), (R, p, p*)
        The replicas' starts (the ODE's); ``a0`` (R, p) or None.
    window : ndarray (n,) of bool
        Times of the mean-deviation test.
    critical : float or None
        Its critical value; None when it was not tested.
    shared : bool
        All replicas share one start (one sensitivity integration).
    """
    from ..numeric.sensitivity import _value, risk_sensitivity, sensitivity_parameters
    out = {"criterion": "mean_deviation", "values": {}, "relative": {}, "reason": ""}
    R = d_risk.shape[0]
    reason = _why_not(model)
    if not reason and (critical is None or not np.any(window) or R < 2):
        reason = "the mean-deviation test was not tested"
    if reason:
        out["reason"] = reason
        return out
    last = int(np.nonzero(window)[0][-1])
    times = t[: last + 1] - t[0]
    se = d_risk[:, : last + 1].std(0, ddof=1) / math.sqrt(R)
    starts = [0] if shared else list(range(min(R, MAX_STARTS)))
    names = sensitivity_parameters(model)
    deriv = {n: np.zeros(last + 1) for n in names}
    try:
        for r in starts:
            s = risk_sensitivity(model, Q0[r], rho0[r], T, times,
                                 a0=None if a0 is None else a0[r])
            for n in names:
                deriv[n] += s.risk_derivative[n] / len(starts)
    except (ValueError, ArithmeticError) as exc:
        out["reason"] = f"no sensitivities: {exc}"
        return out
    w = window[: last + 1] & (se > 0)
    for n in names:
        power = np.max(np.abs(deriv[n][w]) / se[w]) if w.any() else 0.0
        value = float(critical / power) if power > 0 else None
        out["values"][n] = value
        theta = _value(model, n)
        out["relative"][n] = value / abs(theta) if value is not None and theta != 0 else None
    out.update(critical=float(critical), starts=len(starts),
               description="smallest change of each parameter that the mean-deviation test "
                           "detects at about 50% power (forward sensitivities of the ODE's risk "
                           "against the replicas' standard errors)")
    return out


def format_resolution(res) -> str:
    """One line: ``lr 0.0041 (1.4%), noise 0.012, …`` (``-`` for an undetectable change)."""
    parts = []
    for n, v in res["values"].items():
        if v is None:
            parts.append(f"{n} -")
            continue
        rel = res["relative"].get(n)
        parts.append(f"{n} {v:.2g}" + (f" ({100 * rel:.2g}%)" if rel is not None else ""))
    return ", ".join(parts)
