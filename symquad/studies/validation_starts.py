"""Starts of a validation run and the ODE from them: the informed start, per-replica
ODE solutions, and the overlap deviation between two trajectories.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from ..numeric.simulate import population_risk
from ..spectrum import ISOTROPIC, has_spectrum


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

    With an input spectrum (docs/model.md §1a) the start is split over the blocks like
    the default (isotropic) teacher ``T^b = f_b I``: ``Q^b = f_b I``, ``ρ^b = f_b α P``
    (shapes ``(B, p, p)``, ``(B, p, p*)``), so that ``Σ_b Q^b = I`` and
    ``Σ_b ρ^b = α P`` are the isotropic start and every block's Gram matrix
    ``f_b [[I, αP], [αPᵀ, I]]`` is positive definite; ``P`` is the isotropic model's.
    """
    if isinstance(overlap, bool) or not isinstance(overlap, Real) or not 0 < overlap < 1:
        raise ValueError(f"overlap must be in (0, 1), got {overlap!r}")
    if has_spectrum(model):
        f = np.array([float(fb) for fb, _ in model.spectrum])[:, None, None]
        Q, rho = informed_start(model.replace(spectrum=ISOTROPIC), overlap)
        return f * Q, f * rho
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
        if has_spectrum(model):
            # the Euclidean norms Σ_c Q^c_kk; every block's rows scaled alike
            scale = 1.0 / np.sqrt(np.diagonal(Q0.sum(-3), axis1=-2, axis2=-1))[:, None]
        else:
            scale = 1.0 / np.sqrt(np.diagonal(Q0, axis1=-2, axis2=-1))
        Q0 = Q0 * scale[..., :, None] * scale[..., None, :]
        rho0 = rho0 * scale[..., :, None]
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


def _overlap_deviation(Qa, rhoa, Qb, rhob, aa=None, ab=None, blocks=False):
    """``(‖Q_a − Q_b‖²_F + ‖ρ_a − ρ_b‖²_F + ‖a_a − a_b‖²)^{1/2}`` (readouts when trained).

    ``blocks=True``: ``Q``, ``ρ`` carry a block axis before the matrix axes (an input
    spectrum, docs/model.md §1a) and the squares are summed over the blocks too,
    ``Σ_c (‖Q^c_a − Q^c_b‖²_F + ‖ρ^c_a − ρ^c_b‖²_F)``.
    """
    axes = (-3, -2, -1) if blocks else (-2, -1)
    sq = np.sum((Qa - Qb) ** 2, axis=axes) + np.sum((rhoa - rhob) ** 2, axis=axes)
    if aa is not None:
        sq = sq + np.sum((aa - ab) ** 2, axis=-1)
    return np.sqrt(sq)


def _rms_over(mask, values):
    """Per-replica root mean square of `values` over the masked times (NaN if none)."""
    cnt = mask.sum(-1)
    s = np.where(mask, values ** 2, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, np.sqrt(s / np.maximum(cnt, 1)), np.nan)
