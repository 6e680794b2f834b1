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
The standard errors ``se(t)`` are the ones the criterion applies at each time: the
replicas' spread of ``ε_SGD − ε_ODE`` and, where the O(1/N) expansion holds (``N``
given), the larger of that and the predicted spread, with the ``O(N⁻²)`` remainder of
``ODE + c/N`` (:func:`symquad.studies.validation._with_predicted_law`).  The replicas'
s.e. alone would state a resolution the test does not have: at a skewed risk floor a
sample that misses the right tail has a low s.e. at some time, and the maximum over
times picks exactly that time.  So the resolution is in the model's units for this
run's ``N``, replicas and times.  (At a skewed floor the predicted law's critical value
differs from Student's by side and the resolution uses Student's: on the side of the
longer tail the law's is larger — 3.97 against 3.63 s.d. at level 10⁻³, skewness 2.3,
32 replicas — so a change that raises the risk there is detected at up to that factor
above the stated resolution, one that lowers it below.)  Other criteria (band, whole-run
law) may detect smaller changes; this is the resolution of the one with a closed-form power.

A parameter the risk does not depend on (the weight decay on the sphere, where the
projection cancels it) has ``dε/dθ = 0``; its derived sensitivity is rounding, and
``c / max|dε/dθ|/se`` would state an enormous, meaningless change (4.8e9 for that weight
decay).  It is reported as *not detectable* (``None``, with the reason in
``numbers["resolution"]["not_detectable"]``) when ``Θ · max_t |dε/dθ(t)|``, the risk's
change for a change of the parameter by its own scale ``Θ``
(:func:`symquad.numeric.sensitivity.parameter_scale`), is below :data:`ZERO_SENSITIVITY`
times the largest risk of the trajectory.
"""

from __future__ import annotations

import math

import numpy as np

from ..numeric.sensitivity import (_value, parameter_scale, risk_sensitivity,
                                   sensitivity_parameters)
from ..spectrum import has_spectrum
from .whole_run import finite_n_cost

__all__ = ["resolution_numbers", "format_resolution", "MAX_STARTS", "ZERO_SENSITIVITY"]

#: Starts whose sensitivities are averaged for a random start (replicas with their own ODE).
MAX_STARTS = 4
#: ``Θ · max|dε/dθ|`` below this fraction of the largest risk: a sensitivity that is zero to
#: rounding (module docstring).  The stencil's rounding is ~1e-12 of the drift and the
#: sensitivity integration's atol 1e-11; measured (p = 3, p* = 2, lr = 0.3, informed start,
#: t <= 10): 4e-13 and 7e-13 for the weight decay on the sphere, >= 2.5e-2 for every
#: parameter that enters the drift (classic, sphere, weight decay, batch size, z**2 + z/2).
ZERO_SENSITIVITY = 1e-8
#: The reason stored for such a parameter.
ZERO_REASON = ("the risk does not depend on it here: its derived sensitivity is zero to "
               "rounding")


def _why_not(model) -> str:
    if has_spectrum(model):
        return ("the forward sensitivities are not derived for an input spectrum yet "
                "(docs/model.md §1a)")
    # the Jacobian comes from the drift kernels (every pair); no diffusion matrix is needed
    costly = finite_n_cost(model, diffusion=False)
    return f"the sensitivities are too costly here {costly}" if costly else ""


def resolution_numbers(model, t, d_risk, Q0, rho0, T, a0, window, critical, *, shared,
                       se=None):
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
    se : ndarray (n,), optional
        The standard errors the mean-deviation test applies at each time (the larger of
        the replicas' and the predicted law's, with the O(N⁻²) remainder of ODE + c/N;
        :func:`symquad.studies.validation._with_predicted_law`).  None: the replicas' s.e.
        of `d_risk`.
    """
    out = {"criterion": "mean_deviation", "values": {}, "relative": {}, "not_detectable": {},
           "reason": ""}
    R = d_risk.shape[0]
    reason = _why_not(model)
    if not reason and (critical is None or not np.any(window) or R < 2):
        reason = "the mean-deviation test was not tested"
    if reason:
        out["reason"] = reason
        return out
    last = int(np.nonzero(window)[0][-1])
    times = t[: last + 1] - t[0]
    # the s.e. the criterion applies (not the replicas' alone: at a skewed floor a sample
    # that misses the right tail has a low s.e., which would state a resolution the test
    # does not have)
    se = d_risk[:, : last + 1].std(0, ddof=1) / math.sqrt(R) if se is None else \
        np.asarray(se, float)[: last + 1]
    starts = [0] if shared else list(range(min(R, MAX_STARTS)))
    names = sensitivity_parameters(model)
    deriv = {n: np.zeros(last + 1) for n in names}
    risk_scale = 0.0
    try:
        for r in starts:
            s = risk_sensitivity(model, Q0[r], rho0[r], T, times,
                                 a0=None if a0 is None else a0[r])
            risk_scale = max(risk_scale, float(np.max(np.abs(s.risk))))
            for n in names:
                deriv[n] += s.risk_derivative[n] / len(starts)
    except (ValueError, ArithmeticError) as exc:
        out["reason"] = f"no sensitivities: {exc}"
        return out
    w = window[: last + 1] & (se > 0)
    for n in names:
        value, why = _detectable_change(deriv[n], se, w, critical,
                                        parameter_scale(model, n), risk_scale)
        out["values"][n] = value
        if why:
            out["not_detectable"][n] = why
        theta = _value(model, n)
        out["relative"][n] = value / abs(theta) if value is not None and theta != 0 else None
    out.update(critical=float(critical), starts=len(starts),
               description="smallest change of each parameter that the mean-deviation test "
                           "detects at about 50% power (forward sensitivities of the ODE's risk "
                           "against the replicas' standard errors)")
    return out


def _detectable_change(deriv, se, window, critical, scale, risk_scale):
    r"""``(δθ*, "")`` or ``(None, why)`` for one parameter (module docstring).

    ``δθ* = c / max_{t ∈ window} |dε/dθ(t)| / se(t)``; None when the sensitivity is zero
    to rounding (``Θ · max_t |dε/dθ| <= ZERO_SENSITIVITY · max_t ε``, over every time up
    to the window's end) or zero on the window.
    """
    if scale * float(np.max(np.abs(deriv))) <= ZERO_SENSITIVITY * risk_scale:
        return None, ZERO_REASON
    power = float(np.max(np.abs(deriv[window]) / se[window])) if window.any() else 0.0
    if not power > 0:
        return None, "its derived sensitivity is zero at the test's times"
    return float(critical / power), ""


def format_resolution(res) -> str:
    """One line: ``lr 0.0041 (1.4%), noise 0.012, weight_decay not detectable, …``."""
    parts = []
    for n, v in res["values"].items():
        if v is None:
            parts.append(f"{n} not detectable")
            continue
        rel = res["relative"].get(n)
        parts.append(f"{n} {v:.2g}" + (f" ({100 * rel:.2g}%)" if rel is not None else ""))
    return ", ".join(parts)
