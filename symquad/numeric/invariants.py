r"""Implicit bias of the quadratic network: the zero-risk manifold, the
conserved polar factor ``S = ρ (ρᵀρ)^{-1/2}`` and the closest solution.

Everything here is numpy/scipy only (the numeric runtime never imports SymPy);
the symbolic statements and proofs live in :mod:`symquad.symbolic.invariants`
and :mod:`symquad.symbolic.manifold`.

Summary of the mathematics (σ(z) = c z², T ≻ 0 fixed, see ``derivations/04_*.py``)
----------------------------------------------------------------------------------
*Zero-risk manifold.*  ``ε = ½ (tr M)² + ‖M‖_F²`` with ``M = c(WᵀW/p − W*ᵀW*/p*)/N``,
so ``ε = 0`` iff ``WᵀW/p = W*ᵀW*/p*``, i.e. ``W = √(p/p*) O W*`` with ``OᵀO = I_{p*}``
(needs ``p ≥ p*``; for ``p < p*`` the set is empty).  In overlap space
``(Q, ρ) ∈ Sym(p) × R^{p×p*}`` it is the zero set

.. math:: Z_T = \{Φ_T(Q, ρ) = 0\},\qquad
          Φ_T(Q, ρ) = (Q − ρT^{-1}ρᵀ,\; ρᵀρ − (p/p^*) T^2),

``dΦ_T`` is onto ``Sym(p) × Sym(p*)`` at every point of ``Z_T``, hence ``Z_T`` is a
smooth manifold of dimension ``dim ker dΦ_T = p p* − p*(p*+1)/2``.  It is the
``O(p)`` orbit ``(Q, ρ) ↦ (UQUᵀ, Uρ)`` of one point, with stabiliser ``O(p − p*)``
(``dim O(p) − dim O(p−p*)`` gives the same number), and the overlap map
``W ↦ (WWᵀ/N, WW*ᵀ/N)`` is a bijection from the weight-space zero-risk set (the
orbit ``W ↦ UW``) onto ``Z_T``.

*Conserved polar factor.*  Along the ODE, ``S`` is constant iff the start lies in

.. math:: \mathcal I_T = \{[Q, Π_ρ] = 0,\ \text{and } SᵀQS,\ ρᵀρ,\ T
          \text{ commute pairwise}\},\qquad Π_ρ = SSᵀ,

which is invariant (for ``T ∝ I`` this is exactly the set where ``dS/dt = 0``).
The typical start ``Q(0) = q0 I`` belongs to it.

*Closest solution.*  ``‖W − W_0‖²/N = tr Q_0 + (p/p*) tr T − 2√(p/p*) tr(Oᵀρ_0)``
for ``W = √(p/p*) O W*``; the minimiser is ``O = S(0)`` (orthogonal Procrustes),
with overlaps ``ρ_c = √(p/p*) S_0 T``, ``Q_c = (p/p*) S_0 T S_0ᵀ``.  When ``S`` is
conserved and the ODE reaches zero risk, it reaches exactly this point.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import NamedTuple

import numpy as np

from ..applicability import check as _check_analysis
from ..applicability import quadratic_coefficients, zero_risk_reason, zero_risk_scale
from ..spec import Model, check_model
from .checks import as_overlaps, as_real_array
from .kernels import kernels

__all__ = [
    "manifold_dimension", "invariant_S", "closest_solution", "ZeroRiskPoint",
    "zero_risk_point", "random_manifold_points", "weight_distance",
    "manifold_rank_deficiency", "polar_velocity", "dS_dt", "invariant_set_defect",
    "invariant_set_point", "random_stiefel", "is_zero_risk_point", "S_or_nan",
]


# ----------------------------------------------------------------------------
# input checking
# ----------------------------------------------------------------------------
def _check_width(value, name):
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (allowed range: [1, inf)), got {value}")
    return int(value)


def _as_matrix(value, name, shape=None, batch=False):
    arr = as_real_array(value, name)
    if arr.ndim < 2 or (not batch and arr.ndim != 2):
        want = "a 2-d array" if not batch else "an array with >= 2 dimensions"
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if shape is not None and arr.shape[-2:] != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape[-2:]}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (it contains NaN or inf)")
    return arr


def _teacher(T, p_star):
    if T is None:
        return np.eye(p_star)
    T = _as_matrix(T, "T", (p_star, p_star))
    if not np.allclose(T, T.T, atol=1e-12 * max(1.0, np.abs(T).max())):
        raise ValueError("T must be symmetric")
    lam = np.linalg.eigvalsh(T)
    if lam[0] <= 1e-12 * max(1.0, lam[-1]):
        raise ValueError(f"T must be positive definite; its smallest eigenvalue is {lam[0]:.3g}")
    return T


def _sym(X):
    return 0.5 * (X + np.swapaxes(X, -1, -2))


def _manifold_model(model, routine):
    """Check a model for the zero-risk manifold (its changes, quadratic σ, σ*)."""
    check_model(model, "model")
    _check_analysis(model, routine, "manifold")
    if not model.is_quadratic:
        raise ValueError(
            f"{routine}: the zero-risk manifold is derived for quadratic activations "
            f"c z^2 + c0; the model has activation {model.activation_str!r}"
            + ("" if model.is_default("teacher_activation")
               else f", teacher_activation {model.teacher_activation_str!r}"))
    reason = zero_risk_reason(model)
    if reason:
        raise ValueError(f"{routine}: {reason} (model {model!r})")
    return model


def _readout_factors(model, p=None, p_star=None):
    r"""``(|cD_a|^{-1/2}, |c*D_b|^{1/2}, sign)`` as diagonals: ``W = diag(l) O diag(r) W*``.

    The zero-risk weights of a sign-compatible quadratic model are
    ``R = |cD_a|^{-1/2} O |c*D_b|^{1/2}`` (``c RᵀD_aR = c* D_b``); for the classic
    model ``√(p/p*) O``.  Without a model, the classic factors of widths ``p, p*``.
    """
    if model is None:
        return np.full(p, math.sqrt(p)), np.full(p_star, 1 / math.sqrt(p_star)), 1.0
    c, _ = quadratic_coefficients(model.activation)
    cs, _ = quadratic_coefficients(model.teacher_activation)
    left = np.array([1 / math.sqrt(abs(float(c * a))) for a in model.readout])
    right = np.array([math.sqrt(abs(float(cs * b))) for b in model.teacher_readout])
    return left, right, float(np.sign(float(c * model.readout[0])))


# ----------------------------------------------------------------------------
# the manifold
# ----------------------------------------------------------------------------
def manifold_dimension(p=None, p_star=None, model: Model | None = None) -> int:
    r"""Dimension of the zero-risk manifold, ``p·p* − p*(p*+1)/2``.

    It is the dimension of the set of zero-risk overlaps ``(Q, ρ)`` at fixed
    teacher overlap ``T ≻ 0`` (equivalently of the zero-risk weights ``W``,
    the ``O(p)`` orbit ``W ↦ UW`` of one solution, which is the Stiefel manifold
    ``O(p)/O(p − p*)``).  The tests and ``symquad invariants`` also measure it
    as the kernel dimension of the differential ``dΦ_T`` of the zero-risk
    condition ``Φ_T(Q, ρ) = (Q − ρT⁻¹ρᵀ, ρᵀρ − (p/p*) T²)`` (docs/model.md §8.3).

    Parameters
    ----------
    p, p_star : int
        Student and teacher widths, ``p >= p_star >= 1`` (or pass a Model as `p`).
    model : Model, optional
        The model whose zero-risk set is meant.  Its changes are handled as
        derived in docs/model.md §8.3: ``σ* = c* z²``, uniform or non-uniform
        readouts whose ``c a_k`` and ``c* b_m`` share one sign (the zero-risk
        weights are ``W = |cD_a|^{-1/2} O |c*D_b|^{1/2} W*``, still a Stiefel orbit
        of the same dimension), weight decay and batch size (they do not enter
        the risk), and a trained readout, whose ``p`` weights are coordinates
        too: the dimension is ``p·p* − p*(p*+1)/2 + p``.  Mixed-sign readouts, a
        constant offset ``κ ≠ 0``, a non-quadratic σ* and the sphere are refused
        by name.

    Raises
    ------
    ValueError
        For ``p < p_star``: no zero-risk point exists (``WᵀW`` has rank at most
        ``p`` but must equal ``(p/p*) W*ᵀW*`` of rank ``p*``), so the set is empty.
    """
    if isinstance(p, Model):
        model, p, p_star = p, p.p, p.p_star
    if model is not None:
        _manifold_model(model, "manifold_dimension")
        if p is None and p_star is None:
            p, p_star = model.p, model.p_star
        if (p, p_star) != (model.p, model.p_star):
            raise ValueError(f"p, p_star = ({p}, {p_star}) differ from the model's "
                             f"({model.p}, {model.p_star})")
    p = _check_width(p, "p")
    p_star = _check_width(p_star, "p_star")
    if p < p_star:
        raise ValueError(
            f"p={p} < p_star={p_star}: the zero-risk set is empty (W^T W has rank <= p "
            f"< p_star = rank W*^T W*), so it has no dimension; need p >= p_star")
    extra = p if model is not None and model.readout_trained else 0
    return p * p_star - p_star * (p_star + 1) // 2 + extra


def random_stiefel(p, p_star, rng, size=None):
    """Haar-random ``p×p*`` matrices with orthonormal columns (QR of a Gaussian)."""
    shape = (() if size is None else tuple(np.atleast_1d(size))) + (p, p_star)
    G = rng.standard_normal(shape)
    q, r = np.linalg.qr(G)
    # fix the column signs so that the law is Haar (diag(r) > 0)
    return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


class ZeroRiskPoint(NamedTuple):
    """Overlaps ``(Q, rho)`` of a zero-risk solution (and its polar factor ``S``)."""
    Q: np.ndarray
    rho: np.ndarray
    S: np.ndarray

    def __repr__(self):
        return (f"ZeroRiskPoint(Q: {self.Q.shape}, rho: {self.rho.shape}, S: {self.S.shape}; "
                f"tr Q = {np.trace(self.Q, axis1=-2, axis2=-1)!s})")


def zero_risk_point(O, T=None, p=None, model: Model | None = None):
    r"""Overlaps of the zero-risk weights ``W = √(p/p*) O W*``.

    ``ρ = √(p/p*) O T`` and ``Q = (p/p*) O T Oᵀ``.  With `model`: the weights
    ``W = R W*``, ``R = |cD_a|^{-1/2} O |c*D_b|^{1/2}`` (``c RᵀD_aR = c* D_b``), so
    ``ρ = R T``, ``Q = R T Rᵀ`` (``R = s O``, ``s² = c*β/(cα)``, for uniform
    readouts); a trained readout is taken at ``a(0)``.  Changes:
    :func:`manifold_dimension`.

    Parameters
    ----------
    O : array (..., p, p*)
        Orthonormal columns (checked to 1e-10).
    T : array (p*, p*), optional
        Teacher overlap (identity by default).
    p : int, optional
        Student width used in ``p/p*`` (default ``O.shape[-2]``); not with `model`.
    model : Model, optional

    Returns
    -------
    ZeroRiskPoint
        ``S`` is the polar factor of ``ρ`` (``= O`` for uniform readouts).
    """
    O = _as_matrix(O, "O", batch=True)
    pp, k = O.shape[-2:]
    if model is not None:
        _manifold_model(model, "zero_risk_point")
        if (pp, k) != (model.p, model.p_star) or p not in (None, model.p):
            raise ValueError(f"O must have shape ({model.p}, {model.p_star}) for the model, got "
                             f"{O.shape[-2:]}")
    p = pp if p is None else _check_width(p, "p")
    T = _teacher(T, k)
    gram = np.swapaxes(O, -1, -2) @ O
    if np.max(np.abs(gram - np.eye(k))) > 1e-10:
        raise ValueError("O must have orthonormal columns (O^T O = I)")
    if model is None:
        scale = p / k
        rho = math.sqrt(scale) * O @ T
        Q = scale * O @ T @ np.swapaxes(O, -1, -2)
        return ZeroRiskPoint(_sym(Q), rho, O)
    left, right, _ = _readout_factors(model)
    R = left[:, None] * O * right[None, :]
    rho = R @ T
    Q = R @ T @ np.swapaxes(R, -1, -2)
    uniform = len(set(model.readout)) == 1 and len(set(model.teacher_readout)) == 1
    return ZeroRiskPoint(_sym(Q), rho, O if uniform else invariant_S(rho))


def random_manifold_points(p, p_star, n, rng, T=None, model: Model | None = None):
    """``n`` Haar-random points of the zero-risk manifold (stacked ``ZeroRiskPoint``).

    With `model`, of that model's manifold (:func:`zero_risk_point`).
    """
    O = random_stiefel(p, p_star, rng, size=n)
    return zero_risk_point(O, T, p) if model is None else zero_risk_point(O, T, model=model)


def is_zero_risk_point(Q, rho, T=None, p=None, tol=1e-9, model: Model | None = None):
    """Whether ``Φ_T(Q, ρ) = (Q − ρT⁻¹ρᵀ, ρᵀρ − (p/p*)T²)`` vanishes to ``tol`` (relative).

    With `model`: ``Φ_T = (Q − ρT⁻¹ρᵀ, c ρᵀD_aρ − c* T D_b T)`` (docs/model.md §8.3).
    """
    rho = _as_matrix(rho, "rho")
    pp, k = rho.shape
    p = pp if p is None else p
    T = _teacher(T, k)
    Q = _as_matrix(Q, "Q", (pp, pp))
    r1 = Q - rho @ np.linalg.solve(T, rho.T)
    if model is None:
        r2 = rho.T @ rho - (p / k) * T @ T
        scale = max(1.0, np.abs(T).max()) * p / k
    else:
        _manifold_model(model, "is_zero_risk_point")
        left, right, sign = _readout_factors(model)
        # c ρᵀD_aρ = c* T D_b T  ⟺  ρᵀ diag(1/left²) ρ = T diag(right²) T (common sign)
        r2 = rho.T @ (rho / left[:, None] ** 2) - (T * right ** 2) @ T
        scale = max(1.0, np.abs(T).max() ** 2 * np.max(right ** 2))
    return bool(max(np.abs(r1).max(), np.abs(r2).max()) <= tol * scale)


def invariant_S(rho):
    r"""The polar factor ``S = ρ (ρᵀρ)^{-1/2}`` of the teacher–student overlap.

    Computed from the SVD ``ρ = U Σ Vᵀ`` as ``S = U Vᵀ`` (the closest matrix with
    orthonormal columns to ``ρ``, which avoids forming ``(ρᵀρ)^{-1/2}``).

    Parameters
    ----------
    rho : array (..., p, p*)
        Overlaps, ``p >= p*``, of full column rank.

    Returns
    -------
    S : array (..., p, p*)
        ``SᵀS = I``.

    Raises
    ------
    ValueError
        If ``p < p*`` or if some ``ρ`` is numerically rank deficient (smallest
        singular value ``<= 1e-12 ×`` largest): then ``S`` is not defined.
    """
    rho = _as_matrix(rho, "rho", batch=True)
    p, k = rho.shape[-2:]
    if p < k:
        raise ValueError(
            f"rho has shape {rho.shape[-2:]}: S needs p >= p_star (full column rank), "
            f"got p={p} < p_star={k}")
    U, s, Vt = np.linalg.svd(rho, full_matrices=False)
    smin, smax = s[..., -1], s[..., 0]
    bad = ~(smin > 1e-12 * np.maximum(smax, np.finfo(float).tiny))
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(np.atleast_1d(bad))[0]) if rho.ndim > 2 else ()
        where = f"rho[{', '.join(map(str, idx))}]" if idx else "rho"
        raise ValueError(
            f"{where} is rank deficient (singular values {s[idx]}): "
            f"S = rho (rho^T rho)^(-1/2) needs rank p_star={k}")
    return U @ Vt


def closest_solution(m, Q0, rho0, T=None) -> ZeroRiskPoint:
    r"""Overlaps of the zero-risk solution closest to the start (orthogonal Procrustes).

    Model changes (docs/model.md §8.4): uniform readouts ``α``, ``β`` and
    ``σ* = c* z²`` replace ``√(p/p*)`` by ``s = √(c*β/(cα))`` (the zero-risk
    weights are ``s O W*``, and ``S`` is still conserved); the batch size does
    not change the result (zero-risk points stay fixed points).  Non-uniform or
    trained readouts and the sphere break the conservation of ``S``, and with
    weight decay the ODE does not reach zero risk: those are refused by name.

    Over the zero-risk weights ``W = √(p/p*) O W*`` (``OᵀO = I``),

    .. math:: \frac{\|W − W_0\|^2}{N} = \operatorname{tr} Q_0 + \frac{p}{p^*}\operatorname{tr} T
              − 2\sqrt{p/p^*}\,\operatorname{tr}(O^\top ρ_0),

    which is minimal at ``O = S_0 = ρ_0(ρ_0ᵀρ_0)^{-1/2}`` (unique when ``ρ_0`` has
    full column rank).  The closest solution has ``ρ_c = √(p/p*) S_0 T`` and
    ``Q_c = (p/p*) S_0 T S_0ᵀ``.  When ``S`` is conserved (start in the invariant
    set ``I_T`` of docs/model.md §8.4) and the ODE reaches zero risk, it
    reaches exactly this point.

    Parameters
    ----------
    m : Model
        Needs ``m.p >= m.p_star`` and ``σ = c z² (+ c0)`` (ValueError otherwise).
    Q0 : array (p, p)
        Initial student overlap (used to check that the start is realisable,
        ``[[Q0, ρ0], [ρ0ᵀ, T]] ⪰ 0``).
    rho0 : array (p, p*)
        Initial teacher–student overlap (full column rank).
    T : array (p*, p*), optional
        Teacher overlap, identity by default.

    Returns
    -------
    ZeroRiskPoint
        ``(Q, rho, S)`` of the closest zero-risk solution.
    """
    check_model(m, "m")
    _check_analysis(m, "closest_solution")
    if not m.is_quadratic:
        # for other activations the zero-risk set is not {W = sqrt(p/p*) O W*}
        raise ValueError(
            f"closest_solution needs a quadratic activation c*z**2 (+ c0): the zero-risk "
            f"manifold W = sqrt(p/p*) O W* is derived for it; m has activation "
            f"{m.activation_str!r}")
    p, k = m.p, m.p_star
    if p < k:
        raise ValueError(
            f"model has p={p} < p_star={k}: no zero-risk solution exists (need p >= p_star)")
    Q0, rho0, T = as_overlaps(m, Q0, rho0, _teacher(T, k))
    if not m.changed_fields():
        return zero_risk_point(invariant_S(rho0), T, p)
    return zero_risk_point(invariant_S(rho0), T, model=m)


def weight_distance(Q0, rho0, O, T=None, p=None, model: Model | None = None):
    r"""``‖W_0 − √(p/p*) O W*‖ / √N`` from overlaps only (any ``O`` with ``OᵀO = I``).

    ``d² = tr Q_0 + (p/p*) tr T − 2√(p/p*) tr(Oᵀρ_0)``; ``O`` may be stacked (..., p, p*).
    With `model` (uniform readouts): ``p/p*`` becomes ``s² = c*β/(cα)``.
    """
    rho0 = _as_matrix(rho0, "rho0")
    pp, k = rho0.shape
    p = pp if p is None else p
    T = _teacher(T, k)
    Q0 = _as_matrix(Q0, "Q0", (pp, pp))
    O = as_real_array(O, "O")
    if model is None:
        s2 = p / k
    else:
        _manifold_model(model, "weight_distance")
        if len(set(model.readout)) > 1 or len(set(model.teacher_readout)) > 1:
            raise ValueError("weight_distance does not support the model field(s) readout/"
                             "teacher_readout when non-uniform (the distance is then not a "
                             "function of tr(O^T rho0) alone)")
        s2 = float(zero_risk_scale(model))
    d2 = np.trace(Q0) + s2 * np.trace(T) \
        - 2 * math.sqrt(s2) * np.einsum("...ij,ij->...", O, rho0)
    return np.sqrt(np.maximum(d2, 0.0))


def manifold_rank_deficiency(p, p_star, T=None, seed=0, model: Model | None = None) -> dict:
    r"""Measure the manifold dimension at a random zero-risk point, three ways.

    * ``"constraint"``: ``dim ker dΦ_T`` where
      ``Φ_T(Q, ρ) = (Q − ρT⁻¹ρᵀ, ρᵀρ − (p/p*)T²)`` maps
      ``Sym(p) × R^{p×p*}`` (dimension ``p(p+1)/2 + p p*``) to
      ``Sym(p) × Sym(p*)``; also its rank (``"constraint_rank"``, expected full).
    * ``"orbit"``: rank of ``Ω ↦ (ΩQ − QΩ, Ωρ)``, ``Ω ∈ so(p)`` (tangent space
      of the ``O(p)`` orbit through the point).
    * ``"weights"``: ``dim ker`` of ``R ↦ RᵀR`` at ``R = √(p/p*) O``
      (weights ``W = R W*`` in the teacher span).

    With `model` (changes of :func:`manifold_dimension`): the second block of
    ``Φ_T`` is ``ρᵀDρ − T E T`` with ``D = |cD_a|``, ``E = |c*D_b|`` (the common
    sign divided out), the orbit is that of the group keeping ``RᵀDR``
    (``Ω → D^{-1/2}ΩD^{1/2}``), the weight map ``R ↦ RᵀDR``; a trained readout
    adds the ``p`` readout weights as coordinates of ``Φ_T`` and of the weight
    map (the orbit then spans the fixed-readout slice only, so ``"orbit"`` is
    that slice's dimension).

    Ranks use an SVD with relative threshold ``1e-9``; the smallest retained
    and largest discarded singular values are returned as ``"gap"`` (a clean
    rank has a gap of many orders of magnitude).
    """
    if model is not None:
        _manifold_model(model, "manifold_rank_deficiency")
        p, p_star = model.p, model.p_star
    p = _check_width(p, "p")
    p_star = _check_width(p_star, "p_star")
    if p < p_star:
        raise ValueError(f"p={p} < p_star={p_star}: the zero-risk set is empty")
    rng = np.random.default_rng(seed)
    T = _teacher(T, p_star)
    pt = random_manifold_points(p, p_star, None, rng, T, model=model)
    Q, rho = pt.Q, pt.rho
    k = p_star
    if model is None:
        d, e, trained = np.full(p, 1.0 / p), np.full(k, 1.0 / k), False
    else:
        left, right, _ = _readout_factors(model)
        d, e, trained = 1.0 / left ** 2, right ** 2, model.readout_trained
    Ip, Ik = np.eye(p), np.eye(k)
    iu_p, iu_k = np.triu_indices(p), np.triu_indices(k)
    # dΦ_T on δρ = E_ia, as tensors [output row, output col, i, a]
    B = np.linalg.solve(T, rho.T)                                   # T⁻¹ρᵀ (k×p)
    Drho = d[:, None] * rho                                         # Dρ
    X1 = -(np.einsum("ri,as->rsia", Ip, B) + np.einsum("ar,si->rsia", B, Ip))
    X2 = np.einsum("ab,ic->bcia", Ik, Drho) + np.einsum("ib,ac->bcia", Drho, Ik)
    n_q, n_a = iu_p[0].size, (p if trained else 0)
    J = np.zeros((n_q + iu_k[0].size, n_q + p * k + n_a))
    J[:n_q, :n_q] = np.eye(n_q)                                     # δQ enters as itself
    J[:n_q, n_q:n_q + p * k] = X1[iu_p].reshape(n_q, p * k)
    J[n_q:, n_q:n_q + p * k] = X2[iu_k].reshape(iu_k[0].size, p * k)
    if trained:
        # δd_i (the readout weight of unit i) moves ρᵀDρ by ρ_iᵀρ_i
        J[n_q:, n_q + p * k:] = np.einsum("ib,ic->bci", rho, rho)[iu_k]
    # orbit map Ω' = D^{-1/2} Ω D^{1/2} (Ω = E_ij − E_ji, i < j) ↦ (Ω'Q + QΩ'ᵀ, Ω'ρ)
    iu_s = np.triu_indices(p, 1)
    Om = np.zeros((iu_s[0].size, p, p))
    Om[np.arange(iu_s[0].size), iu_s[0], iu_s[1]] = 1.0
    Om[np.arange(iu_s[0].size), iu_s[1], iu_s[0]] = -1.0
    Om = Om / np.sqrt(d)[None, :, None] * np.sqrt(d)[None, None, :]
    dQo = Om @ Q + Q @ np.swapaxes(Om, -1, -2)
    orbit = np.concatenate([dQo[:, iu_p[0], iu_p[1]], (Om @ rho).reshape(len(Om), p * k)], 1)
    # weight map (R, d) ↦ RᵀDR at R = D^{-1/2} O E^{1/2} on δR = E_ia (and δd_i)
    R = np.linalg.solve(T.T, rho.T).T                               # ρ T⁻¹
    DR = d[:, None] * R
    Y = np.einsum("ab,ic->bcia", Ik, DR) + np.einsum("ib,ac->bcia", DR, Ik)
    wmat = Y[iu_k].reshape(iu_k[0].size, p * k)
    if trained:
        wmat = np.concatenate([wmat, np.einsum("ib,ic->bci", R, R)[iu_k]], axis=1)

    def rank(A):
        if A.size == 0:
            return 0, (np.inf, 0.0)
        s = np.linalg.svd(A, compute_uv=False)
        r = int(np.sum(s > 1e-9 * s[0]))
        return r, (s[r - 1] if r else np.inf, s[r] if r < len(s) else 0.0)

    r_c, gap_c = rank(J)
    r_o, gap_o = rank(orbit.T)
    r_w, gap_w = rank(wmat)
    return {
        "formula": manifold_dimension(p, p_star, model=model),
        "constraint": J.shape[1] - r_c,
        "constraint_rank": r_c,
        "constraint_codomain": J.shape[0],
        "orbit": r_o,
        "weights": wmat.shape[1] - r_w,
        "gap": {"constraint": gap_c, "orbit": gap_o, "weights": gap_w},
    }


# ----------------------------------------------------------------------------
# dS/dt and the invariant set
# ----------------------------------------------------------------------------
def polar_velocity(rho, drho):
    r"""``dS/dt`` of ``S = ρ(ρᵀρ)^{-1/2}`` for a given ``dρ/dt``.

    With ``ρ = SP`` (``P = (ρᵀρ)^{1/2}``), ``Ω = SᵀṠ`` is skew and

    .. math:: \dot S = (I − SS^\top)\dotρ\,P^{-1} + SΩ,\qquad
              ΩP + PΩ = S^\top\dotρ − \dotρ^\top S .

    The Sylvester equation is solved in the eigenbasis of ``P``
    (``Ω_ij = K_ij/(π_i + π_j)``).  Single matrices only.
    """
    rho = _as_matrix(rho, "rho")
    drho = _as_matrix(drho, "drho", rho.shape)
    S = invariant_S(rho)
    pi, V = np.linalg.eigh(rho.T @ rho)
    pi = np.sqrt(np.maximum(pi, 0.0))
    Pinv = (V / pi) @ V.T
    K = S.T @ drho - drho.T @ S
    Kt = V.T @ K @ V
    Om = V @ (Kt / (pi[:, None] + pi[None, :])) @ V.T
    return (drho - S @ (S.T @ drho)) @ Pinv + S @ Om


def dS_dt(m, Q, rho, T=None, a=None):
    """``dS/dt`` along the model's ODE (kernels of :func:`symquad.kernels`; any model).

    `a` is the current readout of a trained one (default ``a(0)``).
    """
    T = _teacher(T, m.p_star)
    Q = _as_matrix(Q, "Q", (m.p, m.p))
    rho = _as_matrix(rho, "rho", (m.p, m.p_star))
    drho = kernels(m).rhs(Q, rho, T, a)[1]
    return polar_velocity(rho, np.asarray(drho))


def invariant_set_defect(Q, rho, T=None) -> dict:
    r"""How far ``(Q, ρ, T)`` is from the invariant set ``I_T``.

    Returns the Frobenius norms of ``(I − Π)QΠ`` (``Π = SSᵀ``), ``[A, G]``,
    ``[A, T]``, ``[G, T]`` with ``A = SᵀQS`` and ``G = ρᵀρ``, each relative to
    the norms of its factors; all zero iff the point is in ``I_T``.
    """
    rho = _as_matrix(rho, "rho")
    p, k = rho.shape
    Q = _as_matrix(Q, "Q", (p, p))
    T = _teacher(T, k)
    S = invariant_S(rho)
    Pi = S @ S.T
    A = S.T @ Q @ S
    G = rho.T @ rho

    def rel(X, a, b):
        return float(np.linalg.norm(X) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))

    return {
        "offblock": rel((np.eye(p) - Pi) @ Q @ Pi, Q, Pi),
        "[A,G]": rel(A @ G - G @ A, A, G),
        "[A,T]": rel(A @ T - T @ A, A, T),
        "[G,T]": rel(G @ T - T @ G, G, T),
    }


def invariant_set_point(p, p_star, rng, T=None, scale=0.3, q_perp=None, q_par=0.5,
                        model: Model | None = None):
    r"""A random point of the invariant set ``I_T`` in general position.

    ``I_T`` is where ``S`` is conserved for the classic model and for the changes
    that keep the proof (weight decay, mini-batches, uniform readouts,
    ``σ* = c* z²``; docs/model.md §8.4); with `model`, the others are refused by
    name (``symquad invariants`` gives their exact counterexamples).

    ``S`` Haar-random; ``P = V diag(π) Vᵀ`` and ``A = SᵀQS = V diag(α) Vᵀ`` share
    the eigenbasis ``V`` (the eigenbasis of ``T``, which must then be used when
    ``T`` is not a multiple of the identity); ``Q`` restricted to the complement
    of ``span S`` is a random positive definite (anisotropic) matrix unless
    `q_perp` gives its eigenvalues.  ``α_i = π_i² + q_par`` keeps the Gram
    matrix positive definite (``Q − ρT⁻¹ρᵀ ⪰ 0`` for ``T = I``; for general
    ``T`` with eigenvalues ``θ_i``, ``α_i = π_i²/θ_i + q_par``).

    Returns ``(Q, rho, T)``.
    """
    if model is not None:
        check_model(model, "model")
        _check_analysis(model, "invariant_set_point", "conservation")
        if (p, p_star) != (model.p, model.p_star):
            raise ValueError(f"p, p_star = ({p}, {p_star}) differ from the model's "
                             f"({model.p}, {model.p_star})")
    T = _teacher(T, p_star)
    theta, V = np.linalg.eigh(T)
    if np.allclose(T, T[0, 0] * np.eye(p_star)):
        V = random_stiefel(p_star, p_star, rng)
    S = random_stiefel(p, p_star, rng)
    pi = scale * (0.5 + rng.random(p_star))
    alpha = pi**2 / theta + q_par
    P = (V * pi) @ V.T
    A = (V * alpha) @ V.T
    full = random_stiefel(p, p, rng)
    # complement of span S: project a random basis and orthonormalise
    Nperp = np.linalg.qr(full - S @ (S.T @ full))[0][:, : p - p_star] if p > p_star \
        else np.zeros((p, 0))
    if p > p_star:
        Nperp = np.linalg.qr(Nperp - S @ (S.T @ Nperp))[0]
        if q_perp is None:
            q_perp = 0.3 + rng.random(p - p_star)
        W = random_stiefel(p - p_star, p - p_star, rng)
        Qperp = (W * as_real_array(q_perp, "q_perp")) @ W.T
    else:
        Qperp = np.zeros((0, 0))
    Q = S @ A @ S.T + Nperp @ Qperp @ Nperp.T
    return _sym(Q), S @ P, T


# ----------------------------------------------------------------------------
# S along a time series
# ----------------------------------------------------------------------------
def S_or_nan(rho):
    """``invariant_S`` with NaN where ρ is rank deficient (for time series)."""
    U, s, Vt = np.linalg.svd(rho, full_matrices=False)
    S = U @ Vt
    bad = ~(s[..., -1] > 1e-12 * np.maximum(s[..., 0], np.finfo(float).tiny))
    S[bad] = np.nan
    return S
