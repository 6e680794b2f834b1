"""The escape criterion of :func:`symquad.studies.validation.validate`: when it applies
(a start near the plateau), the plateau and the seeding shift of the ODE's escape time.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import math

import numpy as np

from .applicability import refusal



#: Escape analysis applies to starts whose RMS entry of ρ(0) is below this.
_SMALL_RHO = 0.2


def _escape_unsupported(model):
    """Why the plateau/escape analysis does not apply to `model` (names the field), or None.

    The analysis rests on :func:`symquad.plateau` and the escape law, which
    were derived for the classic model: a changed specification field they do
    not handle is named (:mod:`symquad.studies.applicability`), and so is a
    refusal of :func:`symquad.plateau` itself.
    """

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
