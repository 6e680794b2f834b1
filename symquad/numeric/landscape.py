r"""Numeric landscape and escape: weight-space Hessians, the plateau, escape times.

This module is part of the numeric runtime and never imports SymPy.  The risk
and the ODE right-hand sides come from the generated kernels
(:func:`symquad.numeric.kernels.kernels`); nothing here re-types them.

Conventions (docs/model.md §1–§3): student weights ``W`` (p×N), teacher ``W*`` (p*×N) with
``T = W* W*ᵀ/N = I`` (teacher rows orthonormal·√N), ``Q = W Wᵀ/N``,
``ρ = W W*ᵀ/N``, time ``t = steps/N``.  The gradient flow of the population
risk in these units is ``dW/dt = −η N ∇_W ε``, so a weight-space Hessian
eigenvalue ``h`` corresponds to the ODE rate ``−η N h``.

Contents
--------
* :func:`weight_risk`, :func:`weight_hessian`: the population risk of the
  actual N-dimensional weights and its Hessian (Richardson-extrapolated central
  differences, exact up to rounding because the risk is a quartic polynomial).
* :func:`critical_weights`: randomly oriented weights at ``W = 0``, at the
  plateau critical point of the risk and at a (global) minimum.
* :func:`plateau`: the plateau fixed point of the full ODE (η² term and noise
  included), its Jacobian and the growth rate of ρ.
* :func:`escape_time`: the escape-time law from the linearisation at the
  plateau and the statistics of the random ``ρ(0)``.
* :func:`escape_times`: first-passage times of measured risk curves;
  :func:`random_start` (exact law of the initial overlaps) and
  :func:`ode_escape_times` (batched ODE escapes from given starts).
* :func:`noisy_floor`: where the ODE goes from a zero-risk point when Δ > 0.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy import integrate as _spint
from scipy import optimize as _opt

from ..applicability import check as _check_analysis
from ..applicability import zero_risk_reason, zero_risk_scale
from ..spec import Model, check_model
from .errors import DivergenceError, describe_state
from .kernels import kernels
from .checks import (as_real_array, check_float_activation, check_int as _check_int,
                     check_positive, check_real, check_seed)
from .sde import DEFAULT_DT, sde_noise
from .simulate import _check_sde_time
from .integrate import integrate
# modules, not their functions: looked up when called, so a replacement at the source
# (the tests' forbid / monkeypatch of the work a refusal must come before) takes effect
from . import ode_batch
from . import simulate as _sim
from .. import _safe_io

__all__ = [
    "POINTS", "PlateauFixedPoint", "EscapePrediction",
    "overlaps", "weight_risk", "weight_hessian", "sign_counts",
    "critical_weights", "gradient_flow_plateau_q", "minimum_overlaps", "minimum_risk",
    "plateau", "rho_diffusion", "plateau_rho_diffusion", "escape_threshold", "escape_times",
    "escape_time", "escape_prediction", "sde_escape_prediction", "ESCAPE_METHODS",
    "noisy_floor", "random_start", "ode_escape_times",
]

#: Names of the critical points handled by the landscape functions.
POINTS = ("origin", "plateau", "minimum")


# --------------------------------------------------------------------------- checks
def _check_model(m) -> Model:
    check_model(m, "m")
    check_float_activation(m.activation, "m.activation")
    return m


def _check_quadratic(m: Model, what: str) -> None:
    if not m.is_quadratic:
        raise ValueError(
            f"{what} is derived for the quadratic activation σ(z) = c z² (+ c0); "
            f"the model has activation {m.activation_str!r}"
            + ("" if m.is_default("teacher_activation") else
               f" and teacher_activation {m.teacher_activation_str!r}"))


def _check_quadratic_student(m: Model, what: str) -> None:
    """The student's σ = c z² + c0 (the teacher's σ* may be any polynomial)."""
    if not (len(m.activation) == 3 and m.activation[1] == 0):
        raise ValueError(
            f"{what} is derived for the quadratic student activation σ(z) = c z² (+ c0); "
            f"the model has activation {m.activation_str!r}")


def _check_point(point: str) -> str:
    if point not in POINTS:
        raise ValueError(f"point must be one of {POINTS}, got {point!r}")
    return point






def _identity_teacher(m: Model) -> np.ndarray:
    return np.eye(m.p_star)


# --------------------------------------------------------------------------- weight space
def overlaps(W, Wstar):
    """Order parameters of weights: ``Q = WWᵀ/N``, ``ρ = WW*ᵀ/N``, ``T = W*W*ᵀ/N``.

    Parameters
    ----------
    W : array (..., p, N)
    Wstar : array (p*, N)
    """
    W = as_real_array(W, "W", copy=False)
    Wstar = as_real_array(Wstar, "Wstar", copy=False)
    N = W.shape[-1]
    if Wstar.shape[-1] != N:
        raise ValueError(f"W and Wstar must have the same input dimension N, got "
                         f"{N} and {Wstar.shape[-1]}")
    Q = W @ np.swapaxes(W, -1, -2) / N
    rho = W @ Wstar.T / N
    T = Wstar @ Wstar.T / N
    return Q, rho, T


def weight_risk(m: Model, W, Wstar):
    """Population risk ``ε(W) = ½E[(ŷ − y_clean)²]`` of actual weights (batched over W).

    The risk is the kernel's ``risk(Q, ρ, T)`` at the weights' overlaps.
    """
    _check_model(m)
    Q, rho, T = overlaps(W, Wstar)
    return kernels(m).risk(Q, rho, T)


def weight_objective(m: Model, W, Wstar):
    r"""The objective ``L(W) = ε(W) + (λ/2N)‖W‖²_F`` that the model's gradient flow descends.

    With weight decay ``λ`` (docs/model.md §2) the O(η) part of the dynamics is
    ``dW/dt = −ηN ∇_W L``; ``L = ε`` when ``λ = 0``.  ``‖W‖²/N = tr Q``.
    """
    _check_model(m)
    Q, rho, T = overlaps(W, Wstar)
    return kernels(m).risk(Q, rho, T) + 0.5 * m.weight_decay * np.trace(Q, axis1=-2, axis2=-1)


#: Largest p·N for :func:`weight_hessian` (about 8 minutes of work at the limit).
MAX_WEIGHT_HESSIAN_DIM = 2000


def weight_hessian(m: Model, W, Wstar, step: float = 0.05, chunk: int = 20000):
    r"""Hessian ``∂²L/∂W_{ka}∂W_{lb}`` of the objective (:func:`weight_objective`) in the ``p·N`` weights.

    ``L`` is the population risk ``ε`` plus the weight-decay term
    ``(λ/2N)‖W‖²`` (just ``ε`` without weight decay).

    Central mixed differences

    .. math:: D_{ij}(h) = [ε(x + h(e_i+e_j)) − ε(x + h(e_i−e_j))
              − ε(x − h(e_i−e_j)) + ε(x − h(e_i+e_j))] / (4h²)

    equal ``H_ij + h² c_ij`` exactly for a quartic polynomial (the 6th
    derivatives vanish), so the Richardson combination ``(4D(h) − D(2h))/3`` is
    exact up to rounding.  ``L`` is a quartic polynomial of ``W`` for σ(z)=z².

    Parameters
    ----------
    m : Model
        Quadratic activations (the exactness argument above needs them); the
        changes of :data:`symquad.applicability.RULES` ``["hessian"]`` are
        handled (uniform readouts, ``σ* = c* z²``, weight decay, batch size),
        the others refused by name.
    W : array (p, N)
    Wstar : array (p*, N)
    step : float
        ``h`` (the weights are O(1) per entry at the critical points).
    chunk : int
        Risk evaluations per kernel call (memory bound; lowered so that the
        perturbed copies of the weights stay within 1 GiB).

    ``p·N`` is limited to ``MAX_WEIGHT_HESSIAN_DIM`` (2000): the work grows
    like ``(p·N)³`` (4 s at ``p·N = 400`` on the development machine) and ``H``
    itself like ``(p·N)²``; it is checked before anything is allocated.

    Returns
    -------
    H : array (p·N, p·N), symmetric, rows ordered as ``W.ravel()``.
    """
    _check_model(m)
    _check_analysis(m, "weight_hessian", "hessian")
    _check_quadratic(m, "weight_hessian (exact Richardson differences)")
    W = as_real_array(W, "W")
    Wstar = as_real_array(Wstar, "Wstar")
    if W.shape[0] != m.p:
        raise ValueError(f"W must have p = {m.p} rows, got shape {W.shape}")
    step = check_positive("step", step)
    chunk = _check_int(chunk, "chunk", 1, 10**6)
    n = W.size
    if n > MAX_WEIGHT_HESSIAN_DIM:
        raise ValueError(
            f"weight_hessian: W has p*N = {n} weights; the {n}x{n} Hessian takes work "
            f"growing like (p*N)^3 (4 s at p*N = 400, about {4.0 * (n / 400) ** 3:.3g} s "
            f"here) and {8 * n * n / 2**30:.3g} GiB; allowed p*N <= {MAX_WEIGHT_HESSIAN_DIM} "
            f"(the exact spectrum at any N: sq.hessian_spectrum)")
    if W.ndim != 2 or Wstar.ndim != 2 or Wstar.shape[1] != W.shape[1]:
        raise ValueError(f"W and Wstar must be (p, N) and (p_star, N), got {W.shape} and "
                         f"{Wstar.shape}")
    if chunk * n * 8 > 2**30:
        chunk = max(1, 2**30 // (8 * n))      # the perturbed copies of x0 stay within 1 GiB
    x0 = W.ravel()
    iu, ju = np.triu_indices(n)
    risk = kernels(m).risk
    _, _, T = overlaps(W, Wstar)

    def mixed(h):
        out = np.empty(iu.size)
        for start in range(0, iu.size, chunk):
            i = iu[start:start + chunk]
            j = ju[start:start + chunk]
            rows = np.arange(i.size)
            vals = []
            for si, sj in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
                X = np.repeat(x0[None, :], i.size, axis=0)
                X[rows, i] += si * h
                X[rows, j] += sj * h
                Wb = X.reshape(i.size, *W.shape)
                Q, rho, _ = overlaps(Wb, Wstar)
                vals.append(risk(Q, rho, T)
                            + 0.5 * m.weight_decay * np.trace(Q, axis1=-2, axis2=-1))
            out[start:start + i.size] = (vals[0] - vals[1] - vals[2] + vals[3]) / (4 * h * h)
        return out

    upper = (4 * mixed(step) - mixed(2 * step)) / 3
    H = np.zeros((n, n))
    H[iu, ju] = upper
    H[ju, iu] = upper
    return H


def sign_counts(eigenvalues, rtol: float = 1e-7):
    """``(negative, zero, positive)`` counts; ``|λ| <= rtol·max|λ|`` counts as zero."""
    ev = as_real_array(eigenvalues, "eigenvalues")
    scale = np.max(np.abs(ev)) if ev.size else 0.0
    tol = rtol * scale
    return int(np.sum(ev < -tol)), int(np.sum(np.abs(ev) <= tol)), int(np.sum(ev > tol))


# --------------------------------------------------------------------------- critical points
def _risk_scalar(m, Q, rho):
    return float(kernels(m).risk(Q, rho, _identity_teacher(m)))


def _objective_scalar(m, Q, rho):
    """``L = ε + (λ/2) tr Q`` at ``T = I`` (the risk without weight decay)."""
    return _risk_scalar(m, Q, rho) + 0.5 * m.weight_decay * float(np.trace(Q))


def _stationary(f, lo=1e-2, hi=1e3, h=1e-3):
    """Positive stationary point of a function that is quadratic in its argument.

    The central difference ``(f(x+h) − f(x−h))/(2h)`` is the exact derivative of a
    quadratic, so the root is found to rounding precision (unlike a minimiser).
    """
    def df(x):
        return (f(x + h) - f(x - h)) / (2 * h)
    if df(lo) * df(hi) > 0:
        raise RuntimeError("no stationary point of the risk found in (1e-2, 1e3)")
    return float(_opt.brentq(df, lo, hi, xtol=1e-15, rtol=1e-15))


def gradient_flow_plateau_q(m: Model) -> float:
    r"""Norm ``q`` of the plateau critical point of the objective (gradient flow, η→0).

    With ``ρ = 0`` the gradient is ``∝ (a I + 2Q/p) W``, so at a full-rank
    critical point ``Q = q I`` and ``q`` is the stationary point of
    ``q ↦ L(qI, 0, I)``, ``L = ε + (λ/2) tr Q`` (the risk without weight decay;
    found numerically from the kernel's risk; the symbolic layer gives
    ``p/(p+2)`` for σ(z)=z²).  On the sphere the norm is fixed: ``q = 1``.
    """
    _check_model(m)
    _check_analysis(m, "the plateau", "plateau")
    _check_quadratic_student(m, "the plateau")
    if m.constraint == "sphere":
        return 1.0
    eye = np.eye(m.p)
    zero = np.zeros((m.p, m.p_star))
    try:
        return _stationary(lambda q: _objective_scalar(m, q * eye, zero))
    except RuntimeError:
        raise ValueError(
            f"the plateau: the objective along Q = q I, rho = 0 has no stationary point "
            f"q in (0.01, 1000) for {m!r} (with nothing to fit at rho = 0 the norm decays: "
            f"no plateau)") from None


def minimum_overlaps(m: Model):
    r"""Overlaps ``(Q, ρ)`` of a global minimum of the risk (T = I), axis-aligned.

    * ``p >= p*``: ``ρ = s S`` with ``S = [I_{p*}; 0]``, ``Q = ρρᵀ`` and
      ``s² = c*β/(cα)`` for uniform readouts ``α``, ``β`` (``p/p*`` for the
      classic model), so ``c α WᵀW = c* β W*ᵀW*`` and the risk vanishes
      (docs/model.md §8.3);
    * ``p < p*``: the best rank-``p`` fit, ``Q = c I_p``, ``ρ = √c [I_p, 0]``
      with ``c`` minimising ``ε(cI, √c[I,0], I)`` (numerically, from the kernel).

    The weight decay and the batch size do not enter the risk; with a trained
    readout this is the minimum over ``W`` at the readout ``a(0)``.
    """
    _check_model(m)
    _check_analysis(m, "the minimum", "minimum")
    _check_quadratic(m, "the minimum")
    p, k = m.p, m.p_star
    if p >= k:
        reason = zero_risk_reason(m)
        if reason:
            raise ValueError(f"the minimum: {reason} (model {m!r})")
        S = np.eye(p, k)
        rho = math.sqrt(float(zero_risk_scale(m))) * S
        return rho @ rho.T, rho
    R = np.eye(p, k)
    c = _stationary(lambda c: _risk_scalar(m, c * np.eye(p), math.sqrt(c) * R))
    return c * np.eye(p), math.sqrt(c) * R


def minimum_risk(m: Model) -> float:
    """Risk at :func:`minimum_overlaps` (0 for ``p >= p*``).

    On the sphere (classic readouts, ``p >= p*``) the minimum is 0 too: the
    zero-risk points with ``Q_kk = 1`` are ``ρ = √(p/p*) O`` with ``O`` an
    equal-norm Parseval frame (orthonormal columns, row norms ``p*/p``), which
    exist for every ``p >= p*`` (Benedetto & Fickus, Adv. Comput. Math. 18, 2003).
    """
    _check_model(m)
    if m.constraint == "sphere":
        _check_analysis(m.replace(constraint="none"), "minimum_risk", "minimum")
        reason = zero_risk_reason(m) if m.is_quadratic else "the activations are not quadratic"
        if m.p < m.p_star or reason or zero_risk_scale(m) != Fraction(m.p, m.p_star):
            raise ValueError(
                "minimum_risk does not support the model field(s) constraint=sphere here: the "
                "minimum on the sphere is derived only for p >= p_star with zero-risk weights "
                f"of norm 1 (scale s^2 = p/p*); model {m!r}")
        return 0.0
    Q, rho = minimum_overlaps(m)
    return _risk_scalar(m, Q, rho)


def _objective_minimum_overlaps(m: Model):
    """Critical point of ``L = ε + (λ/2) tr Q`` on the axis-aligned ray (the minimum if λ = 0).

    With weight decay the minimum of the risk is no longer critical: the
    critical point on the ray ``ρ = √s [I; 0]`` (``p >= p*``) or ``√s [I_p, 0]``
    shrinks.  It is a critical point of ``L`` by symmetric criticality (the ray
    is the fixed set of the rotations that keep it).
    """
    if m.weight_decay == 0:
        return minimum_overlaps(m)
    minimum_overlaps(m)            # same checks
    p, k = m.p, m.p_star
    R = np.eye(p, k)
    c = _stationary(lambda c: _objective_scalar(m, c * R @ R.T, math.sqrt(c) * R))
    return c * R @ R.T, math.sqrt(c) * R


def critical_weights(m: Model, point: str, N: int, seed=0):
    r"""Randomly oriented weights ``(W, W*)`` at a critical point of the objective.

    The objective is the risk, plus ``(λ/2N)‖W‖²`` with weight decay
    (:func:`weight_objective`).  ``W* = √N O_{1:p*}`` for a random orthonormal
    frame ``O`` of ``R^N`` (so ``T = I``).  The points:

    * ``"origin"``: ``W = 0``;
    * ``"plateau"``: ``W = √(N q) R O_{p*+1:p*+p}`` with ``q = argmin L(qI, 0, I)``
      (the gradient-flow plateau, ``p/(p+2)`` for σ = z²) and a random
      ``R ∈ O(p)`` (rows orthogonal to the teacher; needs ``N >= p + p*``);
    * ``"minimum"``: ``W = √N X O_{1:p*}`` with ``X = U ρ_min V``, ``ρ_min`` the
      overlap of a global minimum (``s`` times the first ``p*`` unit vectors for
      ``p >= p*``, the best rank-``p`` fit otherwise; with weight decay the
      critical point of ``L`` on the same ray) and ``U ∈ O(p)``, ``V ∈ O(p*)``
      random.

    Returns ``(W, W*)`` of shapes ``(p, N)``, ``(p*, N)``; with
    :func:`weight_hessian` this gives the numeric Hessian that
    :func:`symquad.hessian_spectrum` predicts exactly.  Model changes: those of
    :data:`symquad.applicability.RULES` ``["hessian"]``.
    """
    _check_model(m)
    _check_analysis(m, "critical_weights", "hessian")
    _check_point(point)
    N = _check_int(N, "N", 1)
    p, k = m.p, m.p_star
    need = p + k if point == "plateau" else k
    if N < need:
        raise ValueError(f"N must be >= {need} for point={point!r} "
                         f"(p={p}, p_star={k}), got {N}")
    rng = np.random.default_rng(check_seed(seed))
    O, _ = np.linalg.qr(rng.standard_normal((N, N)))
    O = O.T
    Wstar = math.sqrt(N) * O[:k]
    if point == "origin":
        return np.zeros((p, N)), Wstar
    U, _ = np.linalg.qr(rng.standard_normal((p, p)))
    if point == "plateau":
        q = gradient_flow_plateau_q(m)
        return math.sqrt(N * q) * U @ O[k:k + p], Wstar
    V, _ = np.linalg.qr(rng.standard_normal((k, k)))
    _, rho = _objective_minimum_overlaps(m)
    X = U @ rho @ V
    return math.sqrt(N) * X @ O[:k], Wstar


# --------------------------------------------------------------------------- ODE plateau
def _vech_basis(p, diagonal=True):
    """Symmetric basis matrices ``B_c`` (``E_ii`` and ``E_ij + E_ji``) and their (i, j).

    Without `diagonal` only the off-diagonal ``E_ij + E_ji`` (the tangent space of
    the sphere constraint ``Q_ii = 1``).
    """
    idx = [(i, j) for i, j in zip(*np.triu_indices(p)) if diagonal or i != j]
    basis = []
    for i, j in idx:
        B = np.zeros((p, p))
        B[i, j] = B[j, i] = 1.0
        basis.append(B)
    return np.array(basis).reshape(len(idx), p, p), idx


def _jacobian(m: Model, Q, rho, T, step=1e-4):
    r"""Jacobian of ``(Q, ρ) ↦ (dQ, dρ)`` in the coordinates ``(Q_ij (i<=j), ρ_im)``.

    On the sphere the coordinates are ``(Q_ij (i<j), ρ_im)``: ``Q_ii = 1`` is fixed.
    Richardson-extrapolated central differences: the right-hand side is a cubic
    polynomial for σ(z)=z² (a rational function on the sphere, where the
    differences are accurate to ``O(h⁴)``), so ``(4D(h) − D(2h))/3`` is exact up
    to rounding.
    """
    k = kernels(m)
    p, ps = m.p, m.p_star
    basis, idx = _vech_basis(p, diagonal=m.constraint != "sphere")
    nq = len(idx)
    dirs_Q = np.concatenate([basis, np.zeros((p * ps, p, p))])
    dirs_r = np.concatenate([np.zeros((nq, p, ps)),
                             np.eye(p * ps).reshape(p * ps, p, ps)])
    rows = np.array(idx, dtype=int).reshape(nq, 2)

    def flat(dQ, dr, *_):
        return np.concatenate([dQ[..., rows[:, 0], rows[:, 1]],
                               dr.reshape(dr.shape[:-2] + (p * ps,))], axis=-1)

    def diff(h):
        plus = flat(*k.rhs(Q + h * dirs_Q, rho + h * dirs_r, T))
        minus = flat(*k.rhs(Q - h * dirs_Q, rho - h * dirs_r, T))
        return ((plus - minus) / (2 * h)).T

    return (4 * diff(step) - diff(2 * step)) / 3, nq


@dataclass(frozen=True)
class PlateauFixedPoint:
    r"""The plateau fixed point ``ρ = 0, Q = q I`` of the full ODE (T = I).

    Attributes
    ----------
    model : Model
    q : float
        Norm at the fixed point of the full ODE (η² term, noise, weight decay and
        the batch size included; ``1`` on the sphere).
    Q, rho, T : arrays
        ``q I_p``, ``0`` and ``I_{p*}``.
    risk : float
        Population risk there.
    rate : float
        Growth rate ``κ`` of ρ: the largest eigenvalue of the ρ block of the
        Jacobian (ρ grows like ``e^{κ t}``); ``κ <= 0`` means no escape.  The ρ
        block is ``κ I`` when the teacher readout is uniform; a non-uniform one
        gives each teacher direction its own rate (``rho_rates``).
    jacobian_eigenvalues : array
        All eigenvalues of the Jacobian of the ODE in ``(Q_ij (i<=j), ρ)``
        (``i < j`` on the sphere).
    q_gradient_flow, risk_gradient_flow, rate_gradient_flow : float
        The same for the critical point of the objective ``L = ε + (λ/2) tr Q``
        (gradient flow, η → 0: ``q = argmin L(qI, 0, I)``; rate = O(η) part of
        the ρ growth).  On the sphere ``q_gradient_flow = 1``.
    rho_rates : array
        The distinct eigenvalues of the ρ block (growth rates of ρ's directions).
    """

    model: Model
    q: float
    Q: np.ndarray = field(repr=False)
    rho: np.ndarray = field(repr=False)
    T: np.ndarray = field(repr=False)
    risk: float
    rate: float
    jacobian_eigenvalues: np.ndarray = field(repr=False)
    q_gradient_flow: float
    risk_gradient_flow: float
    rate_gradient_flow: float
    rho_rates: np.ndarray = field(default=None, repr=False)


def _q_equation(m: Model):
    """``g(q) = dQ_11(qI, 0, I)/q``: zero at an isotropic fixed point with q > 0."""
    k = kernels(m)
    eye, zero, T = np.eye(m.p), np.zeros((m.p, m.p_star)), _identity_teacher(m)

    def g(q):
        q = np.atleast_1d(np.asarray(q, dtype=float))
        dQ, _ = k.rhs(q[:, None, None] * eye, np.broadcast_to(zero, q.shape + zero.shape), T)
        return dQ[:, 0, 0] / q
    return g


def _rho_block(m: Model, q: float):
    """The ρ block of the Jacobian at ``Q = qI, ρ = 0`` (``T = I``)."""
    J, nq = _jacobian(m, q * np.eye(m.p), np.zeros((m.p, m.p_star)), _identity_teacher(m))
    return J[nq:, nq:]


def _rho_rate(m: Model, q: float) -> float:
    """Largest eigenvalue of the linear map ``ρ ↦ dρ(qI, ρ, I)`` (ρ block of the Jacobian)."""
    return float(np.max(np.linalg.eigvals(_rho_block(m, q)).real))


def _distinct(values, rtol=1e-9):
    values = np.sort(np.asarray(values, dtype=float))
    out = []
    for v in values:
        if not out or abs(v - out[-1]) > rtol * max(1.0, abs(v)):
            out.append(v)
    return np.array(out)


#: Largest ODE dimension ``n = p(p+1)/2 + p·p*`` whose full Jacobian plateau()
#: builds and diagonalises (n³ work, n² memory).  Measured on a shared 2-core
#: machine (p* = 2): p = 40 (n = 900) 2.9 s, p = 60 (n = 1950) 19 s; n = 6000
#: (p ≈ 105) extrapolates to ~10 min.
MAX_JACOBIAN_DIM = 6000


def _check_jacobian_size(m: Model) -> None:
    n = m.p * (m.p + 1) // 2 + m.p * m.p_star
    if n > MAX_JACOBIAN_DIM:
        raise ValueError(
            f"plateau: the ODE has n = p(p+1)/2 + p*p_star = {n} variables for p={m.p}, "
            f"p_star={m.p_star}; its Jacobian (n^3 work) is limited to n <= {MAX_JACOBIAN_DIM} "
            f"(p up to about {int((2 * MAX_JACOBIAN_DIM) ** 0.5) - m.p_star})")
    if n > 2000:
        warnings.warn(f"plateau: Jacobian of dimension n = {n}: about "
                      f"{20 * (n / 1950) ** 3:.0f} s (n = 1950 took 19 s on 2 cores)",
                      RuntimeWarning, stacklevel=3)


def _no_plateau(m: Model, what: str) -> ValueError:
    return ValueError(
        f"plateau: no isotropic fixed point with rho = 0 for eta = {m.eta} (lr={m.lr}, "
        f"lr_scaling={m.lr_scaling!r}, noise={m.noise}, weight_decay={m.weight_decay}, "
        f"batch_size={m.batch_size}): {what}")


def _plateau_norm(m: Model, g, q_gf: float) -> float:
    r"""The plateau root of ``g(q) = dQ_11(qI, 0, I)/q``.

    ``g`` is quadratic in ``q`` with a positive ``q²`` coefficient (the η² term);
    the plateau is its smaller positive root, where ``g`` falls through zero (the
    isotropic direction is stable there; the larger root is the divergence
    threshold).  Found by bracketing from the gradient-flow value ``q_gf``: above
    it when ``g(q_gf) > 0`` (the classic model, where the η² term makes ``g`` positive
    there), below it when weight decay makes ``g(q_gf) < 0``.
    """
    vals = g(np.array([q_gf]))
    if not np.isfinite(vals).all():
        raise ValueError("plateau: the kernel returned non-finite values")
    if vals[0] == 0:
        return q_gf
    direction = 1.0 if vals[0] > 0 else -1.0
    grid = q_gf * np.geomspace(1.0, 1e6 if direction > 0 else 1e-9, 2000)
    vals = g(grid)
    if not np.isfinite(vals).all():
        raise ValueError("plateau: the kernel returned non-finite values")
    flips = np.nonzero(np.sign(vals) != np.sign(vals[0]))[0]
    if flips.size == 0:
        if direction > 0:
            raise _no_plateau(m, "the η² term makes Q grow without bound; reduce lr")
        raise _no_plateau(m, "dQ < 0 for every q > 0, the weights decay to W = 0 "
                             "(weight decay too strong)")
    i = int(flips[0])
    lo, hi = sorted((grid[i - 1], grid[i]))
    return float(_opt.brentq(lambda x: float(g(x)[0]), lo, hi, xtol=1e-15, rtol=1e-14))


def _gradient_flow_jacobian(m: Model, Q, rho, T):
    r"""The O(η) part of the Jacobian: ``4 J(η/2) − J(η)``.

    Every term of the drift is ``η·(…)`` or ``(η²/b)·(…)`` (weight decay and the
    sphere's projection are linear in the drift), so ``J(η) = η J₁ + η² J₂``
    exactly and the combination removes ``J₂``.
    """
    J, nq = _jacobian(m, Q, rho, T)
    J_half, _ = _jacobian(m.replace(lr=m.lr / 2), Q, rho, T)
    return 4 * J_half - J, nq


def plateau(m: Model) -> PlateauFixedPoint:
    r"""Plateau fixed point of the full ODE, its Jacobian and the growth rate of ρ.

    With ``ρ = 0`` and ``T = I`` the ODE keeps ``Q = q I`` (the symmetric ansatz;
    the symbolic layer verifies it), and ``dQ = q g(q) I`` with ``g`` quadratic
    in ``q`` once the η² term is included.  The plateau is the smaller positive
    root of ``g`` (the larger one, ``q = O(p/η)``, is the divergence threshold);
    it is found by bracketing from the gradient-flow value
    ``q_gf = argmin_q L(qI, 0, I)`` (:func:`_plateau_norm`).

    The Jacobian at ``ρ = 0`` is block triangular (``dρ`` is linear in ρ and
    ``dQ`` depends on ρ only through ``ρρᵀ``), so the ρ block's eigenvalues are
    growth rates of ρ; with a uniform teacher readout they are all equal to
    ``rate``.

    Model changes (docs/model.md §8.1): weight decay, mini-batches, a uniform
    student readout ``α``, any teacher readout and any teacher activation σ*
    keep the isotropic plateau: with ``σ = c z² + c0`` the mean of
    ``σ'(λ_k) = 2cλ_k`` vanishes, so ``dρ = 0`` at ``ρ = 0`` whatever σ*, and the
    reflections ``λ_k → −λ_k`` keep ``Q = qI`` (the kernels carry the change; weight decay adds
    ``−2ηλq`` to ``dQ`` and ``−ηλρ`` to ``dρ``, the batch divides the η² term by
    ``b``).  On the sphere ``Q = I, ρ = 0`` is the fixed point and the rate is the
    ρ block of the projected drift, ``κ(1) − ½ dQ_kk(I, 0)``.  A non-uniform
    student readout (diagonal plateau), a trained readout and a non-quadratic σ*
    are refused by name (:data:`symquad.applicability.RULES`).

    Raises
    ------
    ValueError
        If no plateau exists (η too large: Q grows without bound; weight decay
        too strong: the weights decay to 0), the activation is not quadratic or
        the model has a change the plateau is not derived for.
    """
    _check_model(m)
    _check_analysis(m, "plateau")
    _check_quadratic_student(m, "plateau")
    _check_jacobian_size(m)
    q_gf = gradient_flow_plateau_q(m)
    q = q_gf if m.constraint == "sphere" else _plateau_norm(m, _q_equation(m), q_gf)
    eye, zero, T = np.eye(m.p), np.zeros((m.p, m.p_star)), _identity_teacher(m)
    J, nq = _jacobian(m, q * eye, zero, T)
    rho_eigs = np.linalg.eigvals(J[nq:, nq:]).real
    if m.constraint == "sphere":
        J_gf, _ = _gradient_flow_jacobian(m, eye, zero, T)
        rate_gf = float(np.max(np.linalg.eigvals(J_gf[nq:, nq:]).real))
    else:
        rate_gf = _rho_rate(m, q_gf)
    return PlateauFixedPoint(
        model=m, q=float(q), Q=q * eye, rho=zero, T=T,
        risk=_risk_scalar(m, q * eye, zero),
        rate=float(np.max(rho_eigs)),
        jacobian_eigenvalues=np.sort_complex(np.linalg.eigvals(J)),
        q_gradient_flow=q_gf,
        risk_gradient_flow=_risk_scalar(m, q_gf * eye, zero),
        rate_gradient_flow=rate_gf,
        rho_rates=_distinct(rho_eigs),
    )


# --------------------------------------------------------------------------- SGD noise in ρ
def rho_diffusion(m: Model, q):
    r"""Diffusion constant ``D`` of ρ under SGD at ``ρ = 0``, ``Q = q I``, ``T = I``.

    One SGD step changes ``ρ_kl`` by ``−(η/N) a_k (ŷ − y) σ'(λ_k) ν_l`` (averaged
    over the ``b`` samples of a mini-batch), so per unit time (N steps) the
    entries of ρ pick up independent variance ``D/N`` with
    ``D = η² α² E[(ŷ − y)² σ'(λ_k)² ν_l²] / b`` (weight decay is deterministic and
    adds nothing).  At ``ρ = 0`` the fields λ (iid ``N(0, q)``) and ν (iid
    ``N(0, 1)``) are independent.  For ``σ = c z² + c0``, ``σ* = c* z² + c0*`` and
    uniform readouts ``α``, ``β``, write ``ŷ − y = U − V + κ − √Δ ξ`` with
    ``U = αc Σλ_j²``, ``V = βc* Σν_m²`` and ``κ = c0 pα − c0* p*β``; Gaussian moments
    give

    .. math::
        E[(ŷ−y)² σ'(λ_k)² ν_l²] = 4c² \{ E(U²λ_k²) − 2E(Uλ_k²)E(Vν_l²)
        + q E(V²ν_l²) + 2κ[E(Uλ_k²) − q E(Vν_l²)] + q(κ² + Δ) \},

    ``E(Uλ_k²) = αc q²(p+2)``, ``E(U²λ_k²) = α²c² q³(p+2)(p+4)``,
    ``E(Vν_l²) = βc*(p*+2)``, ``E(V²ν_l²) = β²c*²(p*+2)(p*+4)`` (classic: α = 1/p,
    β = 1/p*, c* = c, κ = 0).  The symbolic layer derives the expectation from
    the model's network with the Wick engine and the tests compare; a Monte
    Carlo test of one SGD step checks it too.  The sphere, non-uniform and
    trained readouts are refused (issue 16 generalises the diffusion).
    """
    _check_model(m)
    _check_analysis(m, "rho_diffusion")
    _check_quadratic(m, "rho_diffusion")
    q = np.asarray(q, dtype=float)
    c, cs = float(m.activation[2]), float(m.teacher_activation[2])
    alpha, beta = float(m.readout[0]), float(m.teacher_readout[0])
    kappa = float(m.activation[0]) * m.p * alpha - float(m.teacher_activation[0]) * m.p_star * beta
    p, k, eta = m.p, m.p_star, m.eta
    e_ul = alpha * c * q ** 2 * (p + 2)
    e_uul = (alpha * c) ** 2 * q ** 3 * (p + 2) * (p + 4)
    e_vn = beta * cs * (k + 2)
    e_vvn = (beta * cs) ** 2 * (k + 2) * (k + 4)
    moment = 4 * c ** 2 * (e_uul - 2 * e_ul * e_vn + q * e_vvn
                           + 2 * kappa * (e_ul - q * e_vn) + q * (kappa ** 2 + m.noise))
    return eta ** 2 * alpha ** 2 * moment / m.batch_size


def plateau_rho_diffusion(m: Model, q):
    r"""The SGD noise of ρ at ``ρ = 0``, ``Q = q I``, ``T = I`` from the diffusion matrix.

    ``D_{ρ_km ρ_km}`` of :meth:`symquad.numeric.kernels.Kernels.diffusion` (the
    covariance of the per-sample increments, derived symbolically for every
    field of the model), averaged over the entries of ρ (they are equal by
    isotropy); for the classic model it equals the hand formula
    :func:`rho_diffusion` (``tests/test_diffusion.py``).  Vectorised over `q`.

    For ``σ = c z² + c0`` it is a polynomial of degree at most 3 in ``q`` (the
    fields enter through ``E[(ŷ − y)² σ'(λ_k)² ν_l²]``, at most six powers of
    ``λ``), so ``D`` is evaluated at five nodes spanning the requested ``q`` and
    the cubic through them is used (the fifth node checks the degree, to 1e-9
    relative; otherwise every ``q`` is evaluated).  The escape law asks for
    thousands of ``q`` along its plateau trajectory: at ``p = 16`` the direct
    evaluation of those ``200 × 200`` matrices took 25 s, the nodes take
    milliseconds.  On the sphere ``q = 1``.
    """
    q = np.atleast_1d(np.asarray(q, dtype=float))
    lo, hi = float(np.min(q)), float(np.max(q))
    if m.constraint == "sphere" or hi - lo <= 1e-12 * max(1.0, hi):
        return np.full(q.shape, _rho_diffusion_at(m, np.array([hi]))[0])
    nodes = lo + (hi - lo) * 0.5 * (1 - np.cos(np.pi * (np.arange(5) + 0.5) / 5))
    values = _rho_diffusion_at(m, nodes)
    coeffs = np.polyfit(nodes, values, 3)
    if np.max(np.abs(np.polyval(coeffs, nodes) - values)) <= 1e-9 * np.max(np.abs(values)):
        return np.polyval(coeffs, q)
    return _rho_diffusion_at(m, q.ravel()).reshape(q.shape)


def _rho_diffusion_at(m: Model, q):
    """Mean diagonal ``ρ`` block of ``D`` at ``Q = q I``, ``ρ = 0``, ``T = I`` for 1-d `q`."""
    k = kernels(m)
    D = k.diffusion(q[:, None, None] * np.eye(m.p), np.zeros(q.shape + (m.p, m.p_star)),
                    _identity_teacher(m))
    block = k.layout.slices()["rho"]
    return np.mean(np.diagonal(D[..., block, block], axis1=-2, axis2=-1), axis=-1)


# --------------------------------------------------------------------------- escape times
def escape_threshold(m: Model, fraction: float = 0.5, fp: PlateauFixedPoint | None = None):
    """Risk level ``ε_pl − fraction·(ε_pl − ε_min)`` whose first crossing defines escape.

    ``ε_pl`` is the risk at the plateau fixed point of the full ODE
    (:func:`plateau`, or `fp` if given) and ``ε_min`` the risk at a global
    minimum (0 for ``p >= p*``); ``fraction`` in ``(0, 1)``.
    """
    _check_model(m)
    fraction = check_real("fraction", fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    fp = plateau(m) if fp is None else fp
    return fp.risk - fraction * (fp.risk - minimum_risk(m))


def escape_times(t, risk, threshold):
    """First time each risk curve falls below ``threshold`` (linear interpolation).

    Parameters
    ----------
    t : array (n,)
    risk : array (..., n)
    threshold : float

    Returns
    -------
    array (...,) of times; NaN where the curve never crosses.

    The arguments are checked here; the search and the interpolation are
    :func:`.ode_batch.first_crossings` (which the batched escape solve applies block
    by block, :func:`_escape_crossings`).
    """
    t = as_real_array(t, "t")
    risk = as_real_array(risk, "risk", finite=False)     # NaN: a diverged curve
    threshold = check_real("threshold", threshold)
    if t.ndim != 1 or risk.shape[-1:] != t.shape:
        raise ValueError(f"t must be 1-d and risk end in len(t) = {t.size} times; got shapes "
                         f"{t.shape} and {risk.shape}")
    return ode_batch.first_crossings(t, risk, threshold)


def _escape_crossings(m: Model, Q0, rho0, t_max, n_eval, threshold, keep=(), rtol=1e-9,
                      atol=1e-13):
    """First crossings of `threshold` by ODE trajectories from ``T = I`` (DOP853).

    :func:`.ode_batch.batch_first_crossings` on ``n_eval`` equally spaced times:
    the risk curves are searched as the solver passes them, never held whole
    (the starts in `keep` excepted); diverged starts (``max|Q| >= 1e6`` or
    non-finite) are marked, not raised.
    """
    return ode_batch.batch_first_crossings(m, Q0, rho0, _identity_teacher(m), t_max, threshold,
                                           np.linspace(0.0, t_max, n_eval), keep=keep,
                                           method="DOP853", rtol=rtol, atol=atol, max_norm=1e6)


#: Bytes of dense output that fix the size of a chunk of starts solved together:
#: bigger batches of starts are split into chunks of this size (fixed, so the numbers
#: never depend on the machine).  The solver's step size is set by the whole chunk,
#: so the chunks are those the escape solve had when it held every start's dense
#: output (:func:`_batch_bytes_per_start`), which keeps its results bit for bit.
ESCAPE_BATCH_BYTES = 2 * 2**30


def _batch_bytes_per_start(m: Model, n_eval: int) -> int:
    """Bytes of one start in the dense escape solve: ~4 copies of its n_eval states.

    Only the chunk size depends on this now (:data:`ESCAPE_BATCH_BYTES`); the memory
    the solve needs is :func:`_escape_bytes`.
    """
    return 4 * 8 * n_eval * (m.p * m.p + m.p * m.p_star + 1)


def _escape_bytes(m: Model, size: int, n_eval: int) -> int:
    """Bytes :func:`_escape_crossings` holds for a chunk of `size` starts (an upper estimate).

    About 48 copies of each start's state (DOP853's 13 stages and 16 extended stages
    of its dense output, its 7 interpolation coefficients, the right-hand side's
    temporaries), the blocks of records with the risk's extended-precision
    temporaries (16 × :data:`~.ode_batch.CROSSING_BLOCK_BYTES`), and start 0's
    whole trajectory (3 copies of its ``n_eval`` states).
    """
    width = m.p * m.p + m.p * m.p_star
    return 8 * (48 * size * width + 3 * n_eval * (width + 1)) \
        + 16 * ode_batch.CROSSING_BLOCK_BYTES


def _chunked_crossings(m: Model, Q0, rho0, t_max, n_eval, threshold, keep_first=True):
    """``(slice, crossings)`` of the batched escape solve, chunk by chunk of starts.

    With `keep_first` the first chunk keeps start 0's whole trajectory
    (``crossings.kept``; the escape law's growth ``G(t)`` and ``q(t)``).  The
    memory is checked before anything is allocated: a chunk that needs more than
    the free memory is refused with the number of bytes it needs.
    """
    B = Q0.shape[0]
    size = max(1, min(B, ESCAPE_BATCH_BYTES // _batch_bytes_per_start(m, n_eval)))
    need = _escape_bytes(m, size, n_eval)
    free = _safe_io.available_memory()
    if free is not None and need > 0.8 * free:
        raise ValueError(
            f"the batched escape ODE needs {need / 2**30:.3g} GiB for {size} of the "
            f"{B} starts at n_eval={n_eval}, p={m.p}, p_star={m.p_star}, more than the "
            f"{free / 2**30:.3g} GiB free: reduce n_samples or n_eval")
    for start in range(0, B, size):
        part = slice(start, min(B, start + size))
        yield part, _escape_crossings(m, Q0[part], rho0[part], t_max, n_eval, threshold,
                                      keep=(0,) if keep_first and start == 0 else ())


def _raise_if_diverged(sol, what):
    if sol.n_diverged:
        first = int(np.nanargmin(sol.t_diverged))
        state = {"t": sol.last_finite["t"][first], "Q": sol.last_finite["Q"][first],
                 "rho": sol.last_finite["rho"][first]}
        raise DivergenceError(
            f"{what} diverged near t = {sol.t_diverged[first]:.4g} ({sol.n_diverged} of "
            f"{sol.size} starts; last finite state {describe_state(state)}); reduce lr",
            float(sol.t_diverged[first]), state)


@dataclass(frozen=True)
class EscapePrediction:
    r"""Escape-time prediction ``t_esc = t_c(Z) + log(δ/s)/κ`` for random starts.

    Attributes
    ----------
    model : Model
    N : int
    median : float
        Predicted median escape time.
    samples : array
        Predicted escape time of each sampled direction ``Z`` of ``ρ(0)``.
    rate : float
        ``κ``, growth rate of ρ at the plateau (from :func:`plateau`).
    log_prefactor : float
        ``c`` in ``t_esc = (log N)/(2κ) + c/κ`` (median), i.e. ``κ·t_esc − ½ log N``.
    sigma2 : float
        ``N·s²``: effective variance of ρ's entries (``q0`` plus the SGD-noise
        seed ``J`` when ``sgd_noise``).
    seed_noise : float
        ``J`` (0 without SGD noise).
    threshold : float
        Risk level that defines escape.
    sgd_noise : bool
        Whether the prediction is for SGD (True) or for the ODE integrated from
        the realised random start (False).

    ``float(prediction)`` is the median, so the object can stand in for a
    number; ``prediction.quartiles`` and ``prediction.quantile(q)`` give the
    spread of the escape time over random starts.
    """

    model: Model
    N: int
    median: float
    samples: np.ndarray = field(repr=False)
    rate: float
    log_prefactor: float
    sigma2: float
    seed_noise: float
    threshold: float
    sgd_noise: bool = True
    method: str = "plateau"

    def quantile(self, qs):
        """Quantiles of the predicted escape time (samples that never escaped are ignored)."""
        return np.nanquantile(self.samples, qs)

    @property
    def quartiles(self) -> tuple:
        """``(25 %, 50 %, 75 %)`` quantiles of the predicted escape time."""
        return tuple(float(v) for v in self.quantile([0.25, 0.5, 0.75]))

    @property
    def n_samples(self) -> int:
        """Number of sampled directions of ``ρ(0)``."""
        return int(self.samples.size)

    def __float__(self) -> float:
        return float(self.median)

    def __repr__(self) -> str:
        lo, _, hi = self.quartiles
        who = ("SDE" if self.method == "sde" else "SGD") if self.sgd_noise else "ODE"
        return (f"EscapePrediction({who}, N={self.N}: median t_esc {self.median:.4g}, "
                f"quartiles [{lo:.4g}, {hi:.4g}], kappa {self.rate:.4g}, "
                f"escaped {np.mean(np.isfinite(self.samples)):.0%}, "
                f"c {self.log_prefactor:.4g}, {self.n_samples} samples; {self.model!r})")


#: Most sampled directions escape_prediction accepts: one batched ODE of up to
#: n_samples·(p² + p·p*) variables is solved at once (:func:`_chunked_crossings`).
MAX_ESCAPE_SAMPLES = 100_000


def _check_escape_model(m: Model, sgd_noise) -> None:
    """The model changes the linearised escape law covers (before any work)."""
    _check_model(m)
    if not isinstance(sgd_noise, (bool, np.bool_)):
        raise TypeError(f"sgd_noise must be True or False, got {sgd_noise!r}")
    # the SGD-noise seed comes from the derived diffusion matrix (plateau_rho_diffusion),
    # which covers every field the escape law does (the sphere included)
    _check_analysis(m, "escape_time")
    _check_quadratic(m, "escape_time")


def escape_prediction(m: Model, N: int, q0: float = 1.0, sgd_noise: bool = True,
                      n_samples: int = 256, seed: int = 0, fraction: float = 0.5,
                      delta: float = 1e-4, n_eval: int = 6000, Z=None) -> EscapePrediction:
    """Implementation of :func:`escape_time` (same arguments and result)."""
    _check_escape_model(m, sgd_noise)
    # the random start w_k ~ N(0, q0 I_N) has a full-rank Gram matrix only for N >= p + p*
    # (the sizes the CLI accepts); below that the law's s = sqrt(q0/N) is O(1) and the
    # prediction is meaningless (N = 1 gave a negative time)
    N = _check_int(N, "N", m.p + m.p_star)
    q0 = check_positive("q0", q0)
    if m.constraint == "sphere" and q0 != 1.0:
        raise ValueError(f"q0 must be 1 for constraint='sphere' (every row has |w_k|^2 = N), "
                         f"got {q0}")
    n_samples = _check_int(n_samples, "n_samples", 1, MAX_ESCAPE_SAMPLES)
    check_seed(seed)
    fraction = check_real("fraction", fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    delta = check_positive("delta", delta)
    n_eval = _check_int(n_eval, "n_eval", 100, 10 ** 6)
    fp = plateau(m)
    kappa = fp.rate
    if kappa <= 0:
        raise ValueError(
            f"escape_time: the plateau is stable (rate {kappa:.4g} <= 0) for lr={m.lr}, "
            f"noise={m.noise}: rho does not grow, there is no escape")
    thr = escape_threshold(m, fraction, fp)
    if Z is None:
        Z = np.random.default_rng(seed).standard_normal((n_samples, m.p, m.p_star))
    else:
        Z = as_real_array(Z, "Z")
        if Z.ndim != 3 or Z.shape[0] == 0 or Z.shape[1:] != (m.p, m.p_star):
            raise ValueError(f"Z must have shape (n, {m.p}, {m.p_star}), got {Z.shape}")
        n_samples = Z.shape[0]
    p = m.p
    Q0 = np.broadcast_to(q0 * np.eye(p), (n_samples, p, p)).copy()
    # horizon: relaxation (a few 1/η) + linear growth from δ + nonlinear escape
    t_max = 20.0 / m.eta + (math.log(1.0 / delta) + 15.0) / kappa
    t_c = np.empty(n_samples)
    for part, crossings in _chunked_crossings(m, Q0, delta * Z, t_max, n_eval, thr):
        _raise_if_diverged(crossings, "escape ODE")
        t_c[part] = crossings.times
        if part.start == 0:
            t, Q, rho = crossings.kept.t, crossings.kept.Q, crossings.kept.rho
    if np.isnan(t_c).any():
        warnings.warn(f"{int(np.isnan(t_c).sum())} of {n_samples} sampled starts did not "
                      f"escape by t = {t_max:.3g}", RuntimeWarning, stacklevel=2)
    # linear-regime growth G(t) (isotropic, same for every Z) from sample 0
    norms = np.linalg.norm(rho[0].reshape(len(t), -1), axis=-1)
    G = np.log(norms / norms[0])
    # linear regime: until ρ has grown 100-fold (the integrand is then ~1e-4 of its start)
    lin = np.cumprod(norms < 100 * norms[0]).astype(bool)
    if sgd_noise:
        q_t = np.trace(Q[0], axis1=-2, axis2=-1) / p
        J = float(_spint.trapezoid(plateau_rho_diffusion(m, q_t[lin]) * np.exp(-2 * G[lin]),
                                   t[lin]))
    else:
        J = 0.0
    sigma2 = q0 + J
    s = math.sqrt(sigma2 / N)
    if s * s > 0.05 * q0:
        warnings.warn(
            f"escape_time: N={N} is small: the start's teacher overlap s = {s:.3g} is not small, "
            f"so the asymptotic law (linear in rho, corrections O(s^2) = {s * s:.2g}) is "
            f"inaccurate; it is meant for N >> {math.ceil(20 * sigma2 / q0)}",
            RuntimeWarning, stacklevel=2)
    samples = t_c + math.log(delta / s) / kappa
    med = float(np.nanmedian(samples))
    return EscapePrediction(model=m, N=N, median=med, samples=samples, rate=kappa,
                            log_prefactor=kappa * med - 0.5 * math.log(N),
                            sigma2=sigma2, seed_noise=J, threshold=thr, sgd_noise=sgd_noise)


def random_start(m: Model, N: int, n: int, seed=0, q0: float = 1.0):
    r"""Exact law of the initial overlaps for ``w_k ~ N(0, q0 I_N)`` and ``T = I``.

    With the teacher rows ``√N e_l`` (any orthonormal frame gives the same law),
    ``ρ_kl = w_kl/√N`` and ``Q = (G₁G₁ᵀ + S)/N·q0`` where ``G₁`` holds the first
    ``p*`` coordinates and ``S ~ Wishart(N − p*, I_p)`` the rest.  On the sphere
    (``constraint="sphere"``) every row is then renormalised to ``|w_k|² = N``,
    as the simulators do: ``Q ← D^{-1/2} Q D^{-1/2}``, ``ρ ← D^{-1/2} ρ`` with
    ``D = diag(Q)`` (``q0`` cancels).  The other model fields do not enter the
    law of the weights.

    Returns ``(Q0, rho0)`` of shapes ``(n, p, p)``, ``(n, p, p*)``.
    """
    from scipy.stats import wishart
    _check_model(m)
    N = _check_int(N, "N", m.p_star + m.p)
    n = _check_int(n, "n", 1)
    q0 = check_positive("q0", q0)
    rng = np.random.default_rng(seed)
    p, k = m.p, m.p_star
    G1 = rng.standard_normal((n, p, k))
    if N - k >= p:
        S = wishart(df=N - k, scale=np.eye(p)).rvs(size=n, random_state=rng).reshape(n, p, p)
    else:
        G2 = rng.standard_normal((n, p, N - k))
        S = G2 @ np.swapaxes(G2, -1, -2)
    Q0 = q0 * (G1 @ np.swapaxes(G1, -1, -2) + S) / N
    rho0 = math.sqrt(q0 / N) * G1
    if m.constraint == "sphere":
        scale = 1.0 / np.sqrt(np.diagonal(Q0, axis1=-2, axis2=-1))
        Q0 = scale[..., :, None] * Q0 * scale[..., None, :]
        idx = np.arange(p)
        Q0[..., idx, idx] = 1.0          # exactly, not to rounding
        rho0 = scale[..., :, None] * rho0
    return Q0, rho0


def ode_escape_times(m: Model, Q0, rho0, t_max: float, fraction: float = 0.5,
                     n_eval: int = 4000):
    """Escape times of ODE trajectories (batched) from given starts; NaN if none by t_max."""
    _check_model(m)
    Q0 = as_real_array(Q0, "Q0")
    rho0 = as_real_array(rho0, "rho0")
    if Q0.ndim != 3 or Q0.shape[1:] != (m.p, m.p) or rho0.shape != (Q0.shape[0], m.p, m.p_star):
        raise ValueError(f"Q0 and rho0 must have shapes (n, {m.p}, {m.p}) and "
                         f"(n, {m.p}, {m.p_star}), got {Q0.shape} and {rho0.shape}")
    t_max = check_positive("t_max", t_max)
    n_eval = _check_int(n_eval, "n_eval", 2, 10 ** 6)
    thr = escape_threshold(m, fraction)
    # starts beyond the divergence threshold (the larger root of the plateau
    # equation) diverge: they are marked by the batched solve and reported NaN
    out = np.empty(Q0.shape[0])
    diverged = 0
    for part, crossings in _chunked_crossings(m, Q0, rho0, t_max, n_eval, thr,
                                              keep_first=False):
        out[part] = crossings.times
        if crossings.n_diverged:
            out[part][crossings.diverged] = np.nan
            diverged += crossings.n_diverged
    if diverged:
        warnings.warn(f"{diverged} of {Q0.shape[0]} ODE trajectories diverged (reported as "
                      f"NaN)", RuntimeWarning, stacklevel=2)
    return out


def escape_time(m: Model, N: int, q0: float = 1.0, sgd_noise: bool = True,
                n_samples: int = 256, seed: int = 0, fraction: float = 0.5,
                delta: float = 1e-4, n_eval: int = 6000, Z=None, *, method: str = "plateau",
                t_max: float | None = None, threshold: float | None = None,
                dt: float | None = None, form: str | None = None,
                noise: str | None = None) -> EscapePrediction:
    r"""Predicted escape time from a random start: median, quantiles and samples.

    Two laws (`method`):

    * ``"plateau"`` (default; ``σ = c z²``, classic model): from the
      linearisation at the plateau and the statistics of ρ(0), below;
    * ``"sde"`` (any model): first-passage times of `n_samples` runs of the
      order-parameter SDE (``simulate(method="sde")``) from the exact law of the
      random start ``w_k ~ N(0, I_N)``, ``T = I`` — the O(1) random part of the
      escape included, at a cost independent of ``N``.  Needs ``t_max`` (and
      ``threshold`` when the model has no closed-form plateau, i.e. a
      non-quadratic activation); runs that have not escaped by ``t_max`` are
      censored (``samples = inf``), so the quantiles stay unbiased while more
      than that fraction escaped.

    Model of the escape (T = I, start ``w_k ~ N(0, q0 I)``):

    1. ``ρ(0) = s Z`` with ``Z`` a standard Gaussian p×p* matrix and
       ``s² = q0/N`` (exact for T = I).  With SGD, the fluctuations of ρ during
       the plateau add independent isotropic noise of rate ``D(q(t))/N``
       (the SGD-noise covariance of ρ at ρ = 0, computed from the kernels);
       in the linear regime ``ρ(t) = e^{G(t)} ρ̃`` with
       ``ρ̃ = ρ(0) + ∫ e^{−G} dB``, so ``s² = (q0 + J)/N``,
       ``J = ∫_0^∞ D(q(u)) e^{−2G(u)} du`` and ``G(t) = ∫_0^t κ(u) du``.
    2. ρ's dynamics is linear while ρ is small, and ``Q`` relaxes to the
       plateau independently of ρ (to O(ρ²)).  Hence the first-passage time of a
       start ``(q0 I, δZ)`` obeys ``t_c(δZ) = t_c(sZ) + log(s/δ)/κ`` up to
       O(δ², s²), where ``κ`` is the plateau rate (:func:`plateau`).  One batched
       ODE integration from ``(q0 I, δZ)`` with small ``δ`` gives ``t_c`` for
       all sampled ``Z``, including the relaxation of ``Q`` and the nonlinear
       escape.

    So ``t_esc = log(N)/(2κ) + [log(δ/√(q0+J)) + κ t_c(δZ)]/κ``: the rate ``κ``
    multiplies ``log N``; ``p`` enters the bracket (the prefactor) through the
    law of ``Z`` (p·p* entries), the relaxation and the nonlinear escape.

    Model changes (docs/model.md §8.2): those that keep the isotropic plateau
    (weight decay, mini-batches, uniform readouts, ``σ* = c* z² + c0*``, the
    sphere with ``q0 = 1``) are covered, because the law is built from the
    plateau's rate and a batched ODE solve of the model's own kernels, and the
    SGD-noise seed ``J`` from the derived diffusion matrix
    (:func:`plateau_rho_diffusion`; on the sphere the renormalisation adds
    nothing to the noise of ρ at ρ = 0 at first order, and the derived ``D``
    includes it).  Non-uniform readouts (ρ's
    directions grow at different rates), a trained readout (no plateau fixed
    point) and non-quadratic activations are refused by name.

    Parameters
    ----------
    m : Model (quadratic activation)
    N : int, input dimension (>= p + p*)
        The law is asymptotic in ``N``; it warns when ``N`` is too small for it
        (``s² = (q0 + J)/N`` not small).  Smaller ``N`` is refused (N = 1
        returned a negative time).
    q0 : float, initial weight variance (> 0; 1 on the sphere)
    sgd_noise : bool
        True: prediction for SGD (noise seeding included); False: for the ODE
        integrated from the realised random start.
    n_samples : int, sampled directions Z (in [1, MAX_ESCAPE_SAMPLES])
    seed : int, seed of the Z sample
    fraction : float in (0, 1)
        Escape threshold: the risk ``ε_pl − fraction·(ε_pl − ε_min)`` between the
        plateau and the minimum.
    delta : float, the small start scale ``δ`` (must be << s)
    n_eval : int, time grid for the first-passage detection
    Z : array (n, p, p*), optional
        Directions to use instead of a fresh Gaussian sample, e.g.
        ``ρ(0)·√(N/q0)`` of realised starts for a paired comparison.
    method : {"plateau", "sde"}
        See above.  The plateau law's SGD-noise seed ``J`` uses the diffusion
        matrix of the model (:func:`plateau_rho_diffusion`).
    t_max : float, optional
        ``method="sde"``: the horizon (default for quadratic models: four times
        the plateau law's upper quartile).
    threshold : float, optional
        ``method="sde"``: the risk level whose first crossing is the escape
        (default :func:`escape_threshold` with `fraction`, quadratic models).
    dt, form, noise
        ``method="sde"``: the SDE's largest step, kernels and noise (see
        :func:`symquad.simulate`; the noise defaults by cost, sampled wherever the
        diffusion matrix is costly).

    Returns
    -------
    EscapePrediction
        ``float(result)`` is the median escape time; ``result.quartiles``,
        ``result.quantile(q)`` and ``result.samples`` give its spread over
        random starts; ``result.rate`` is ``κ`` and ``result.log_prefactor``
        is ``c``.
    """
    if method not in ESCAPE_METHODS:
        raise ValueError(f"method must be one of {ESCAPE_METHODS}, got {method!r}")
    if method == "plateau":
        _check_escape_model(m, sgd_noise)     # the linearised law's fields, before any work
    else:
        _check_model(m)                       # the SDE law holds for every model
    _check_int(N, "N", m.p + m.p_star)
    if method == "sde":
        return sde_escape_prediction(m, N, q0=q0, sgd_noise=sgd_noise, n_samples=n_samples,
                                     seed=seed, fraction=fraction, n_eval=n_eval, Z=Z,
                                     t_max=t_max, threshold=threshold, dt=dt, form=form,
                                     noise=noise)
    if (t_max is not None or threshold is not None or dt is not None or form is not None
            or noise is not None):
        raise ValueError("t_max, threshold, dt, form and noise apply to method='sde' only")
    return escape_prediction(m, N, q0=q0, sgd_noise=sgd_noise, n_samples=n_samples, seed=seed,
                             fraction=fraction, delta=delta, n_eval=n_eval, Z=Z)


#: Laws of :func:`escape_time`.
ESCAPE_METHODS = ("plateau", "sde")


def sde_escape_prediction(m: Model, N: int, q0: float = 1.0, sgd_noise: bool = True,
                          n_samples: int = 256, seed: int = 0, fraction: float = 0.5,
                          n_eval: int = 6000, Z=None, t_max=None, threshold=None, dt=None,
                          form=None, noise=None) -> EscapePrediction:
    """Implementation of ``escape_time(method="sde")`` (same arguments and result)."""
    N = _check_int(N, "N", m.p + m.p_star)
    if not isinstance(sgd_noise, (bool, np.bool_)) or not sgd_noise:
        raise ValueError("method='sde' is the law of SGD (sgd_noise=True); the ODE from a "
                         "realised start is method='plateau' with sgd_noise=False")
    if check_positive("q0", q0) != 1.0:
        raise ValueError("method='sde' starts from the simulators' random start w_k ~ N(0, I_N)"
                         f" (q0 = 1), got q0={q0}")
    if Z is not None:
        raise ValueError("Z (directions of rho(0)) applies to method='plateau' only")
    n_samples = _check_int(n_samples, "n_samples", 1, MAX_ESCAPE_SAMPLES)
    check_seed(seed)
    n_eval = _check_int(n_eval, "n_eval", 100, 10 ** 6)
    if dt is not None:
        dt = check_positive("dt", dt)
    form, noise = sde_noise(m, form, noise)          # refusals before any work
    if t_max is not None:
        # the run-time check before any work (simulate repeats it once t_max is known)
        _check_sde_time(n_samples, check_positive("t_max", t_max),
                        DEFAULT_DT if dt is None else dt)
    fp = None
    if threshold is None or t_max is None:
        if not m.is_quadratic:
            raise ValueError("escape_time(method='sde') for a non-quadratic activation needs "
                             "threshold= and t_max= (there is no closed-form plateau)")
        fp = plateau(m)
    thr = escape_threshold(m, fraction, fp) if threshold is None else \
        check_real("threshold", threshold)
    if t_max is None:
        law = escape_prediction(m, N, n_samples=64, seed=seed, fraction=fraction)
        t_max = 4.0 * law.quartiles[2]
    t_max = check_positive("t_max", t_max)
    run = _sim.simulate(m, N=N, t_max=t_max, replicas=n_samples, seed=seed, method="sde",
                        t_eval=np.linspace(0.0, t_max, n_eval), on_divergence="stop", dt=dt,
                        form=form, noise=noise)
    samples = escape_times(run.t, run.risk, thr)
    samples[np.isnan(samples) & ~run.diverged] = np.inf          # censored at t_max
    if run.n_diverged:
        warnings.warn(f"{run.n_diverged} of {n_samples} SDE runs diverged (reported as NaN)",
                      RuntimeWarning, stacklevel=3)
    if np.mean(np.isinf(samples)) > 0.25:
        warnings.warn(f"{int(np.isinf(samples).sum())} of {n_samples} SDE runs did not escape by "
                      f"t_max = {t_max:.4g}; raise t_max for the upper quantiles",
                      RuntimeWarning, stacklevel=3)
    med = float(np.nanmedian(samples))
    kappa = fp.rate if fp is not None else float("nan")
    return EscapePrediction(model=m, N=N, median=med, samples=samples, rate=kappa,
                            log_prefactor=kappa * med - 0.5 * math.log(N),
                            sigma2=float("nan"), seed_noise=float("nan"), threshold=thr,
                            sgd_noise=True, method="sde")


# --------------------------------------------------------------------------- noisy solutions
def noisy_floor(m: Model, t_max: float = 400.0, n_eval: int = 401):
    r"""Where the ODE goes from a zero-risk point when the labels are noisy (``p >= p*``).

    At a solution ``Q = ρρᵀ``, ``ρᵀρ = (p/p*) I`` the η² term of ``dQ`` reduces to
    ``(4η²Δ/p²) Q`` (the risk and the other η² terms vanish there; in general
    ``(4c²α²η²Δ/b) Q``), so with ``Δ > 0`` the solution is no longer a fixed point.
    Uniform readouts, ``σ* = c* z²`` and mini-batches are covered (the start is
    the axis-aligned zero-risk point of :func:`minimum_overlaps`); weight
    decay, a trained readout and the sphere are refused by name.  This integrates the ODE
    (:func:`symquad.integrate`) from the axis-aligned solution and returns the
    :class:`~symquad.numeric.integrate.ODESolution`; its final risk is the noise
    floor (``O(ηΔ)``).
    """
    _check_model(m)
    _check_analysis(m, "noisy_floor")
    _check_quadratic(m, "noisy_floor")
    t_max = check_positive("t_max", t_max)
    n_eval = _check_int(n_eval, "n_eval", 2, 10 ** 6)
    if m.p < m.p_star:
        raise ValueError(f"zero-risk points need p >= p_star, got p={m.p}, p_star={m.p_star}")
    Q, rho = minimum_overlaps(m)
    return integrate(m, Q, rho, _identity_teacher(m), t_max,
                     t_eval=np.linspace(0.0, t_max, n_eval), rtol=1e-10, atol=1e-13,
                     warn_symmetric=False)  # the axis-aligned minimum is symmetric on purpose
