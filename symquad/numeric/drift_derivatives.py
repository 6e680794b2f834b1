r"""The drift's derivatives and its ``1/N`` term from the generated kernels (any width, any pair).

The LNA, the O(1/N) mean and the forward sensitivities need, besides the drift ``f``
and the diffusion matrix ``D``, the Jacobian ``J = ∂f/∂X``, the curvature term
``½ ∂²f : Σ`` and ``f₁``, the ``1/N`` term of one step's mean increment
(docs/derivation.md §8.3a).  The entry route derives them symbolically
(:mod:`symquad.symbolic.second_order`), at a cost that grows fast with the width
and only for polynomial activations.  This module builds all of them from the
*moment kinds* of the generated kernels (``G, Gt, B, R`` of
:mod:`symquad.symbolic.moments`, :meth:`~symquad.numeric.kernels.Kernels.moments`),
which exist for every pair the kernels support (polynomials at any width, erf,
ReLU, mixed pairs), by exact Gaussian identities and exact (or stated) stencils.

**Stencils.**  Along a direction ``v`` the drift ``F(x + t v)`` is, for polynomial
activations, a polynomial in ``t`` of known degree ``d`` (:func:`drift_degree`): the
derivatives at ``t = 0`` of its interpolant through ``2m + 1 ≥ d + 1`` equispaced
points ``t = jh`` (``j = −m … m``) *are* its derivatives, up to rounding
(:func:`stencil_weights`, exact rational weights).  For erf and ReLU the points are
``{0, ±h/2, ±h}`` with a small ``h``: the interpolant's derivatives are then the
Richardson extrapolation of the central differences of steps ``h`` and ``h/2``
(truncation ``O(h⁴)``; :data:`SMOOTH_STEP`).

**Jacobian and curvature.**  With ``Σ = Σ_r μ_r v_r v_rᵀ`` (eigenvectors, orthonormal)

.. math::  ∂^2 f : Σ = \sum_r μ_r \, \partial_t^2 f(x + t v_r)|_{t=0}, \qquad
           J = [\,\partial_t f(x + t v_r)|_{t=0}\,]_r \, V^T ,

so one stencil along the ``dim`` eigen-directions gives both, without forming the
``dim³`` Hessian.  On the sphere the drift is the projection of the unconstrained
drift ``F`` (polynomial), ``f_I = F_I − ½ X_I Σ_k n_{Ik} F_kk/Q_kk`` (``n_{Ik}`` the
multiplicity of unit ``k`` in the entry ``I``: 1 for ``Q_kl`` (``k ≠ l``) and ``ρ_km``,
2 for ``Q_kk``); its derivatives follow from ``F``'s by the quotient rule
(:func:`_sphere_along`).

**f₁** (:meth:`DriftDerivatives.f1_sources`), source by source, with
``g_k = a_k σ'(λ_k) e`` and ``M_k = E[z σ'(λ_k) e]`` (``z = (λ, ν)``, the rows of
``[G, Gt]``):

* ``|x|²/N``: ``(η²/b) a_k a_l E[𝓛(σ'_k σ'_l e²)]`` with ``𝓛 = Σ_ij Ω_ij ∂_i∂_j``.  By the
  heat equation of the Gaussian, ``d/ds E_{sΩ}[F] = ½ E_{sΩ}[𝓛F]`` (``𝓛`` at ``Ω``), so
  ``E[𝓛F] = 2 d/ds B_kl(sQ, sρ, sT)|_{s=1}``: the derivative of the ``η²`` moment ``B``
  when the fields' covariance is scaled (the label noise and the readouts are not).
  For polynomials ``B(s)`` is a polynomial of degree :func:`moment_degree` in ``s``;
* the batch cross terms: ``η²(1 − 1/b) a_k a_l E[∇g̃_k]ᵀ Ω E[∇g̃_l]`` (``g̃_k = σ'_k e``),
  and by Stein ``Ω E[∇g̃_k] = E[z g̃_k] = M_k``, so the term is ``M_k Ω⁺ M_lᵀ`` (``Ω⁺``
  the pseudo-inverse: ``M_k`` lies in the range of ``Ω``, so this is exact for a
  singular ``Ω`` too — a teacher overlap ``T`` of low rank, collinear units);
* weight decay: ``η²λ² Q_kl + η²λ (a_k G_kl + a_l G_lk)``;
* the sphere: ``Q'_kl = Q̃'_kl (Q_kk Q_ll / Q̃'_kk Q̃'_ll)^{1/2}`` to second order in
  ``1/N``, with ``E[F_I F_J] = F_I F_J + D^u_IJ`` per step (``D^u`` the unconstrained
  diffusion matrix): the projection of the unconstrained ``f₁`` plus

  .. math::  q_{kl} = −\tfrac12\Big(\frac{E[F_{kl}F_{kk}]}{Q_{kk}} + \frac{E[F_{kl}F_{ll}]}{Q_{ll}}\Big)
             + Q_{kl}\Big(\tfrac38 \frac{E[F_{kk}^2]}{Q_{kk}^2} + \tfrac38 \frac{E[F_{ll}^2]}{Q_{ll}^2}
             + \tfrac14 \frac{E[F_{kk}F_{ll}]}{Q_{kk}Q_{ll}}\Big),
     \qquad q_{ρ_{km}} = −\tfrac12 \frac{E[F^ρ_{km}F_{kk}]}{Q_{kk}} + \tfrac38 ρ_{km}\frac{E[F_{kk}^2]}{Q_{kk}^2}.

The risk's gradient and Hessian come from the same stencils (the risk is a
polynomial of degree :func:`risk_degree` for polynomial activations); the Hessian of
a scalar by polarisation, ``H_JK = ½(∂²_{e_J+e_K} − ∂²_{e_J} − ∂²_{e_K})``.

Equal to the entry route to 1e-12 relative where that exists (tests/test_second_order_route.py).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import math

import numpy as np

from .._generated.assembly import PARAMS, drift_none

__all__ = ["DriftDerivatives", "BlockDriftDerivatives", "omega_map", "stencil_weights", "drift_degree", "moment_degree",
           "risk_degree", "SMOOTH_STEP", "POLY_STEP", "PINV_RCOND", "MAX_FULL_HESSIAN",
           "directions_per_rhs", "schedule_time_derivative", "step_phase", "step_shift",
           "finite_n_drift"]

#: Relative step ``h`` of the smooth (erf, ReLU) stencil ``{0, ±h/2, ±h}``: truncation
#: ``h⁴ f⁽⁶⁾/1440 ≈ 4·10⁻¹³ f⁽⁶⁾`` for the second derivative, rounding ``≈ 21 ε/h² ≈ 2·10⁻¹⁰``
#: relative (first derivative: ``h⁴ f⁽⁵⁾/480``, rounding ``≈ 2ε/h``); stated accuracy 1e-8
#: relative to the largest entry.
SMOOTH_STEP = 5e-3
#: Relative step ``h`` of the polynomial stencil ``{jh}``: the interpolant is exact, and
#: a large step keeps the rounding error ``ε Σ|w_j| |F|/h²`` small.
POLY_STEP = 0.1
#: Relative cutoff of the pseudo-inverse ``Ω⁺`` of the cross term (eigenvalues below
#: ``PINV_RCOND · max eigenvalue`` are dropped; they carry ``M`` only through rounding).
PINV_RCOND = 1e-12
#: Largest ``dim³`` of a full drift Hessian (:meth:`DriftDerivatives.hessian`); the
#: curvature term never forms it.
MAX_FULL_HESSIAN = 2 * 10 ** 7

_SMOOTH_NODES = (Fraction(-1), Fraction(-1, 2), Fraction(0), Fraction(1, 2), Fraction(1))


@lru_cache(maxsize=32)
def stencil_weights(nodes: tuple) -> tuple:
    r"""Weights ``(w1, w2)`` of ``g'(0)`` and ``g''(0)`` from ``g(t_j)`` (unit step).

    The derivatives at 0 of the polynomial that interpolates ``g`` at the nodes
    ``t_j`` (distinct rationals): the solution of ``Σ_j w_j t_j^k = k! δ_{k,d}``,
    ``k = 0 … n − 1``, in exact rational arithmetic.  Exact for polynomials of
    degree ``< n`` (``g''`` also of degree ``n`` for symmetric nodes, by parity).
    """
    t = [Fraction(x) for x in nodes]
    n = len(t)
    if len(set(t)) != n or n < 3:
        raise ValueError(f"stencil nodes must be >= 3 distinct numbers, got {nodes}")
    out = []
    for d, factorial in ((1, 1), (2, 2)):
        # Gauss–Jordan on the transposed Vandermonde system A w = e_d (exact rationals)
        A = [[tj ** k for tj in t] + [Fraction(factorial if k == d else 0)] for k in range(n)]
        for col in range(n):
            piv = next(r for r in range(col, n) if A[r][col] != 0)
            A[col], A[piv] = A[piv], A[col]
            inv = 1 / A[col][col]
            A[col] = [x * inv for x in A[col]]
            for r in range(n):
                if r != col and A[r][col] != 0:
                    f = A[r][col]
                    A[r] = [x - f * y for x, y in zip(A[r], A[col])]
        out.append(np.array([float(A[r][n]) for r in range(n)]))
    return tuple(out)


def _error_degree(model) -> int:
    """Degree of the error signal ``e`` in the fields (the larger activation degree)."""
    return max(model.degree, model.teacher_degree)


def moment_degree(model):
    """Degree in ``s`` of ``B(sΩ)`` (``None`` for erf/ReLU): ``deg σ − 1 + deg e``.

    ``B = E[σ'σ' e²]`` is the expectation of a polynomial of degree
    ``2(deg σ − 1) + 2 deg e`` in the fields; a monomial of degree ``2j`` has mean
    ``∝ s^j`` under ``N(0, sΩ)`` (odd ones vanish), the label noise is not scaled.
    """
    if not model.is_polynomial:
        return None
    return max(model.degree - 1 + _error_degree(model), 1)


def drift_degree(model):
    """Degree of the unconstrained drift along any state direction (``None`` for erf/ReLU).

    In the overlaps: ``B`` has degree :func:`moment_degree`, ``G`` and ``R``
    ``⌊(deg σ + deg e)/2⌋``, weight decay 1.  A trained readout is state too: ``a_k a_l B``
    has degree 4 in ``a`` (two from the assembly, two from ``e²``), ``a_k G`` two.
    """
    if not model.is_polynomial:
        return None
    e = _error_degree(model)
    trained = 1 if model.readout_trained else 0
    return max(model.degree - 1 + e + 4 * trained, (model.degree + e) // 2 + 2 * trained,
               (model.degree + e) // 2 + trained, 1)


def risk_degree(model):
    """Degree of the risk ``½E[(ŷ − y*)²]`` along any state direction (``None`` for erf/ReLU)."""
    if not model.is_polynomial:
        return None
    return max(max(model.degree, model.teacher_degree) + (2 if model.readout_trained else 0), 1)


def _nodes(degree):
    """Stencil nodes (unit step): ``−m … m`` with ``2m ≥ degree``, or the smooth ones."""
    if degree is None:
        return _SMOOTH_NODES
    m = max(1, -(-degree // 2))
    return tuple(Fraction(j) for j in range(-m, m + 1))


def directions_per_rhs(model, dim: int) -> int:
    """Drift evaluations of one right-hand side of the O(1/N) mean (cost law).

    ``dim`` eigen-directions times the stencil's non-zero nodes, one centre, and the
    ``B(sΩ)`` stencil: ``dim (n_t − 1) + 1 + (n_s − 1)``.
    """
    n_t = len(_nodes(drift_degree(model)))
    n_s = len(_nodes(moment_degree(model)))
    return dim * (n_t - 1) + 1 + (n_s - 1)


class DriftDerivatives:
    """Derivatives of the drift and of the risk, and ``f₁``, from moment kernels.

    Parameters
    ----------
    kern : Kernels
        Kernels of the model with moment kinds (:meth:`Kernels.moments`: the matrix
        or tensor form).
    """

    def __init__(self, kern):
        self.k = kern
        self.model = kern.model
        self.lay = kern.layout
        self.sphere = self.model.constraint == "sphere"
        self.trained = self.model.readout_trained
        self.i_eta = PARAMS.index("eta")
        self.i_wd = PARAMS.index("weight_decay")
        self.i_b = PARAMS.index("batch_size")
        self.drift_nodes = _nodes(drift_degree(self.model))
        self.moment_nodes = _nodes(moment_degree(self.model))
        self.risk_nodes = _nodes(risk_degree(self.model))
        self.poly = self.model.is_polynomial
        self._drift_none = drift_none
        p = self.model.p
        # n_{Ik}: multiplicity of unit k in entry I (sphere projection)
        n = np.zeros((self.lay.dim, p))
        self.diag = np.zeros(p, dtype=int)
        for I, (block, i, j) in enumerate(self.lay.entries):
            if block == "Q":
                n[I, i] += 1
                n[I, j] += 1
                if i == j:
                    self.diag[i] = I
            elif block == "rho":
                n[I, i] += 1
        self.mult = n

    # ---- evaluation ----------------------------------------------------------------------
    def _blocks(self, X, T):
        """``(Q, ρ, T, a)`` of states ``X`` (..., dim), ``T`` broadcast to their batch."""
        Q, rho, a = self.lay.unpack(X)
        T = np.asarray(T, dtype=float)
        T = np.broadcast_to(T, X.shape[:-1] + T.shape[-2:])
        if not self.trained:
            a = self.k._readout
        return Q, rho, T, a

    def moments(self, X, T, scale=None):
        """``(G, Gt, B, R)`` at states ``X``; ``scale`` (broadcast to the batch) multiplies ``Ω``."""
        Q, rho, T, a = self._blocks(X, T)
        if scale is not None:
            s = np.asarray(scale, dtype=float)[..., None, None]
            Q, rho, T = s * Q, s * rho, s * T
        return self.k._moments(Q, rho, T, a)

    def unconstrained(self, X, T, params, moments=None):
        """The unconstrained drift ``F`` (state order, ``Q_kk`` included) at ``X``."""
        Q, rho, _, a = self._blocks(X, T)
        G, Gt, B, R = self.moments(X, T) if moments is None else moments
        dQ, drho, da = self._drift_none(Q, rho, a, G, Gt, B, R, params)
        return self.lay.pack(dQ, drho, da if self.trained else None)

    def project(self, X, F):
        """The sphere's drift ``f_I = F_I − ½ X_I Σ_k n_{Ik} F_kk/Q_kk`` (identity off the sphere)."""
        if not self.sphere:
            return F
        r = F[..., self.diag] / X[..., self.diag]
        return F - 0.5 * X * (r @ self.mult.T)

    def drift(self, X, T, params):
        """The drift ``f`` at states ``X`` (..., dim)."""
        return self.project(X, self.unconstrained(X, T, params))

    def _step(self, x, smooth_step=SMOOTH_STEP, poly_step=POLY_STEP, poly=None):
        poly = self.poly if poly is None else poly
        return (poly_step if poly else smooth_step) * np.maximum(
            1.0, np.max(np.abs(x), axis=-1))

    def along(self, x, T, V, params):
        r"""``(f(x), ∂_t f(x + tv), ∂²_t f(x + tv))`` at ``t = 0`` for each row ``v`` of ``V``.

        `x` (..., dim), `V` (..., r, dim); returns (..., dim), (..., r, dim), (..., r, dim).
        """
        x = np.asarray(x, dtype=float)
        V = np.asarray(V, dtype=float)
        nodes = self.drift_nodes
        w1, w2 = stencil_weights(nodes)
        h = self._step(x)[..., None, None]                         # (..., 1, 1)
        t = np.array([float(v) for v in nodes])
        pts = x[..., None, None, :] + (t[:, None, None] * h[..., None, :, :]) * V[..., None, :, :]
        F = self.unconstrained(pts, _expand(T, 2), params)          # (..., n, r, dim)
        c = len(nodes) // 2
        F0 = F[..., c, 0, :]
        d1 = np.einsum("j,...jri->...ri", w1, F) / h
        d2 = np.einsum("j,...jri->...ri", w2, F) / h ** 2
        if not self.sphere:
            return F0, d1, d2
        return _sphere_along(x, V, F0, d1, d2, self.diag, self.mult)

    def jacobian(self, x, T, params):
        """``J = ∂f/∂X`` (..., dim, dim) from the stencil along the unit vectors."""
        x = np.asarray(x, dtype=float)
        eye = np.broadcast_to(np.eye(self.lay.dim), x.shape[:-1] + (self.lay.dim,) * 2)
        _, d1, _ = self.along(x, T, eye, params)
        return np.swapaxes(d1, -1, -2)

    def curvature(self, x, T, S, params):
        r"""``(f, J, ½ ∂²f : Σ)`` at one or more states, by the eigen-directions of ``Σ``.

        ``Σ = V diag(μ) Vᵀ``: ``∂²f : Σ = Σ_r μ_r ∂²_{v_r} f`` and ``J = [∂_{v_r} f] Vᵀ``.
        """
        S = 0.5 * (np.asarray(S, dtype=float) + np.swapaxes(S, -1, -2))
        mu, U = np.linalg.eigh(S)
        V = np.swapaxes(U, -1, -2)                                 # rows: eigenvectors
        f0, d1, d2 = self.along(x, T, V, params)
        J = np.swapaxes(d1, -1, -2) @ V
        return f0, J, 0.5 * np.einsum("...r,...ri->...i", mu, d2)

    def hessian(self, x, T, params):
        """The full ``∂²f_I/∂X_J∂X_K`` (..., dim, dim, dim) by polarisation (size checked)."""
        dim = self.lay.dim
        if dim ** 3 > MAX_FULL_HESSIAN:
            raise ValueError(f"the full drift Hessian has dim^3 = {dim ** 3:.3g} entries at "
                             f"dim = {dim} (limit {MAX_FULL_HESSIAN:.0e}); the O(1/N) mean "
                             f"contracts it with Σ along Σ's eigenvectors instead")
        x = np.asarray(x, dtype=float)
        J, K = np.triu_indices(dim)
        eye = np.eye(dim)
        V = eye[J] + eye[K]
        V = np.concatenate([eye, V[J != K]])
        V = np.broadcast_to(V, x.shape[:-1] + V.shape)
        _, _, d2 = self.along(x, T, V, params)
        pure, mixed = d2[..., :dim, :], d2[..., dim:, :]
        H = np.zeros(x.shape[:-1] + (dim, dim, dim))
        off = J != K
        H[..., :, np.arange(dim), np.arange(dim)] = np.swapaxes(pure, -1, -2)
        Jo, Ko = J[off], K[off]
        vals = 0.5 * (mixed - pure[..., Jo, :] - pure[..., Ko, :])         # (..., npairs, dim)
        H[..., :, Jo, Ko] = np.swapaxes(vals, -1, -2)
        H[..., :, Ko, Jo] = np.swapaxes(vals, -1, -2)
        return H

    # ---- the risk ------------------------------------------------------------------------
    def risk(self, X, T):
        """The risk at states ``X`` (the kernels' own, exact readouts when fixed)."""
        Q, rho, a = self.lay.unpack(X)
        T = np.broadcast_to(np.asarray(T, dtype=float), X.shape[:-1] + np.shape(T)[-2:])
        return np.asarray(self.k.risk(Q, rho, T, a), dtype=float)

    def _risk_along(self, x, T, V):
        nodes = self.risk_nodes
        w1, w2 = stencil_weights(nodes)
        h = self._step(x)[..., None]
        t = np.array([float(v) for v in nodes])
        pts = x[..., None, None, :] + (t[:, None, None] * h[..., None, :, None]) * V[..., None, :, :]
        r = self.risk(pts, _expand(T, 2))                          # (..., n, r)
        return (np.einsum("j,...jr->...r", w1, r) / h,
                np.einsum("j,...jr->...r", w2, r) / h ** 2)

    def risk_gradient(self, x, T):
        """``∂ε/∂X`` (..., dim)."""
        x = np.asarray(x, dtype=float)
        eye = np.broadcast_to(np.eye(self.lay.dim), x.shape[:-1] + (self.lay.dim,) * 2)
        return self._risk_along(x, T, eye)[0]

    def risk_pairs(self):
        r"""The pairs ``J < K`` of state entries the risk's Hessian can couple (its pattern).

        ``ε = ½ E[(Σ_a w_a σ_a(u_a))²] = ½ Σ_ab w_a w_b E[σ_a(u_a) σ_b(u_b)]`` (the
        activations' constants inside ``σ_a``; ``w = (a, −b)``) is a sum of functions of
        ``(C_aa, C_ab, C_bb, w_a, w_b)`` over pairs of fields, whatever the activations; so ``∂²ε/∂X_J∂X_K`` vanishes identically unless the fields of ``J``
        and ``K`` together are at most two (``Q_ij``: ``{i, j}``; ``ρ_im``: ``{i, p+m}``;
        ``a_i``: ``{i}``).  Cached.
        """
        if getattr(self, "_pairs", None) is None:
            p = self.model.p
            fields = []
            for block, i, j in self.lay.entries:
                fields.append({i, j} if block == "Q" else {i, p + j} if block == "rho" else {i})
            J, K = np.triu_indices(self.lay.dim, 1)
            keep = np.array([len(fields[a] | fields[b]) <= 2 for a, b in zip(J, K)], bool)
            self._pairs = (J[keep], K[keep])
        return self._pairs

    def risk_hessian(self, x, T):
        """``∂²ε/∂X∂X`` (..., dim, dim) by polarisation over the pairs of :meth:`risk_pairs`."""
        x = np.asarray(x, dtype=float)
        dim = self.lay.dim
        J, K = self.risk_pairs()
        eye = np.eye(dim)
        V = np.broadcast_to(np.concatenate([eye, eye[J] + eye[K]]),
                            x.shape[:-1] + (dim + len(J), dim))
        d2 = self._risk_along(x, T, V)[1]
        pure = d2[..., :dim]
        H = np.zeros(x.shape[:-1] + (dim, dim))
        H[..., np.arange(dim), np.arange(dim)] = pure
        vals = 0.5 * (d2[..., dim:] - pure[..., J] - pure[..., K])
        H[..., J, K] = vals
        H[..., K, J] = vals
        return H

    def risk_curvature(self, x, T, S):
        """``½ ∇²ε : Σ`` along the eigenvectors of ``Σ`` (..., without the Hessian)."""
        S = 0.5 * (np.asarray(S, dtype=float) + np.swapaxes(S, -1, -2))
        mu, U = np.linalg.eigh(S)
        d2 = self._risk_along(np.asarray(x, dtype=float), T, np.swapaxes(U, -1, -2))[1]
        return 0.5 * np.einsum("...r,...r->...", mu, d2)

    # ---- f1 ------------------------------------------------------------------------------
    def laplacian(self, x, T):
        r"""``L_kl = E[𝓛(σ'_k σ'_l e²)] = 2 ∂_s B_kl(sΩ)|_{s=1}`` (..., p, p)."""
        nodes = self.moment_nodes
        w1, _ = stencil_weights(nodes)
        # the scaling is of Ω only: a step of 1/(2m) keeps s in [1/2, 3/2] for polynomials
        h = 1.0 / (2 * max(nodes)) if self.poly else SMOOTH_STEP
        s = 1.0 + h * np.array([float(v) for v in nodes])
        x = np.asarray(x, dtype=float)
        X = np.broadcast_to(x[..., None, :], x.shape[:-1] + (len(s), x.shape[-1]))
        B = self.moments(X, _expand(T, 1), scale=np.broadcast_to(s, x.shape[:-1] + s.shape))[2]
        return 2.0 * np.einsum("j,...jkl->...kl", w1, B) / h

    def cross(self, x, T, moments=None):
        r"""``K_kl = M_k Ω⁺ M_lᵀ = E[∇g̃_k]ᵀ Ω E[∇g̃_l]`` (..., p, p), ``M = [G, Gt]``."""
        Q, rho, T_, _ = self._blocks(np.asarray(x, dtype=float), T)
        G, Gt, _, _ = self.moments(x, T) if moments is None else moments
        M = np.concatenate([G, Gt], axis=-1)
        Omega = np.concatenate([np.concatenate([Q, rho], -1),
                                np.concatenate([np.swapaxes(rho, -1, -2), T_], -1)], -2)
        mu, U = np.linalg.eigh(Omega)
        keep = mu > PINV_RCOND * np.max(np.abs(mu), axis=-1, keepdims=True)
        inv = np.where(keep, 1.0 / np.where(keep, mu, 1.0), 0.0)
        MU = M @ U
        return np.einsum("...kr,...r,...lr->...kl", MU, inv, MU)

    def f1_sources(self, x, T, params, D_unconstrained=None):
        r"""``f₁`` by source: ``{"norm", "cross", "decay", "sphere", "total"}``, each (..., dim).

        ``norm``, ``cross`` and ``decay`` are the unconstrained sources of the module
        docstring (projected on the sphere); ``sphere`` the renormalisation's own second
        order (needs the unconstrained diffusion matrix `D_unconstrained` on the
        sphere; zero otherwise).  ``ρ`` and a trained readout have no unconstrained
        source (their maps are linear in ``1/N``).
        """
        x = np.asarray(x, dtype=float)
        eta, wd, b = params[self.i_eta], params[self.i_wd], params[self.i_b]
        Q, rho, _, a = self._blocks(x, T)
        mom = self.moments(x, T)
        G = mom[0]
        aa = a[..., :, None] * a[..., None, :]
        aG = a[..., :, None] * G
        parts = {
            "norm": eta ** 2 / b * aa * self.laplacian(x, T),
            "cross": eta ** 2 * (1.0 - 1.0 / b) * aa * self.cross(x, T, mom),
            "decay": eta ** 2 * wd ** 2 * Q + eta ** 2 * wd * (aG + np.swapaxes(aG, -1, -2)),
        }
        zero_rho = np.zeros(rho.shape)
        zero_a = np.zeros(a.shape) if self.trained else None
        out = {}
        for name, dQ in parts.items():
            out[name] = self.project(x, self.lay.pack(dQ, zero_rho, zero_a))
        if self.sphere:
            if D_unconstrained is None:
                raise ValueError("f1 on the sphere needs the unconstrained diffusion matrix")
            F = self.unconstrained(x, T, params, mom)
            out["sphere"] = _sphere_second_order(x, F, D_unconstrained, self.lay, self.diag)
        else:
            out["sphere"] = np.zeros(x.shape)
        out["total"] = out["norm"] + out["cross"] + out["decay"] + out["sphere"]
        return out


def _expand(T, k):
    """``T`` with `k` axes before its last two when it has batch dimensions (stencil axes)."""
    T = np.asarray(T, dtype=float)
    return T if T.ndim == 2 else T.reshape(T.shape[:-2] + (1,) * k + T.shape[-2:])


def _sphere_along(x, V, F0, d1, d2, diag, mult):
    r"""Value and directional derivatives of the sphere's drift from those of ``F``.

    ``f = F − ½ X (r nᵀ)``, ``r_k = F_kk/Q_kk``; along ``X = x + tv`` (``X'' = 0``):
    ``r' = F'_kk/q − F_kk v_kk/q²``, ``r'' = F''_kk/q − 2F'_kk v_kk/q² + 2F_kk v_kk²/q³``,
    ``f' = F' − ½(v (r nᵀ) + x (r' nᵀ))``, ``f'' = F'' − ½(2 v (r' nᵀ) + x (r'' nᵀ))``.
    """
    q = x[..., diag][..., None, :]                                 # (..., 1, p)
    vk = V[..., diag]                                              # (..., r, p)
    Fk = F0[..., diag][..., None, :]
    r0 = Fk / q
    r1 = d1[..., diag] / q - Fk * vk / q ** 2
    r2 = d2[..., diag] / q - 2 * d1[..., diag] * vk / q ** 2 + 2 * Fk * vk ** 2 / q ** 3
    xs = x[..., None, :]
    f0 = F0 - 0.5 * x * (r0[..., 0, :] @ mult.T)
    f1 = d1 - 0.5 * (V * (r0 @ mult.T) + xs * (r1 @ mult.T))
    f2 = d2 - 0.5 * (2 * V * (r1 @ mult.T) + xs * (r2 @ mult.T))
    return f0, f1, f2


def _sphere_second_order(x, F, Du, lay, diag):
    r"""The sphere's renormalisation to second order: ``q`` of the module docstring.

    ``E[F_I F_J] = F_I F_J + D^u_IJ`` (a product of two batch means of one step).
    """
    EFF = F[..., :, None] * F[..., None, :] + Du
    out = np.zeros(x.shape)
    for I, (block, i, j) in enumerate(lay.entries):
        if block == "Q" and i != j:
            ki, kj = diag[i], diag[j]
            qi, qj = x[..., ki], x[..., kj]
            out[..., I] = (-0.5 * (EFF[..., I, ki] / qi + EFF[..., I, kj] / qj)
                           + x[..., I] * (0.375 * (EFF[..., ki, ki] / qi ** 2
                                                   + EFF[..., kj, kj] / qj ** 2)
                                          + 0.25 * EFF[..., ki, kj] / (qi * qj)))
        elif block == "rho":
            ki = diag[i]
            qi = x[..., ki]
            out[..., I] = (-0.5 * EFF[..., I, ki] / qi
                           + 0.375 * x[..., I] * EFF[..., ki, ki] / qi ** 2)
    return out


def schedule_time_derivative(k, Q, rho, T, a, t) -> np.ndarray:
    r"""``∂f/∂t = ∂f/∂η · η s'(t)``: the drift's explicit time dependence under a schedule.

    The drift is exactly quadratic in ``η`` (``η A + η² B/b``, weight decay ``ηλ``), so
    ``∂f/∂η = (f(η + 1) − f(η − 1))/2`` at ``η = η(t)``, exactly
    (:mod:`symquad.numeric.optimal` uses the same structure).
    """
    i = PARAMS.index("eta")
    params = list(k.params_at(t))
    eta_t = params[i]
    plus, minus = list(params), list(params)
    plus[i], minus[i] = eta_t + 1.0, eta_t - 1.0
    d_eta = 0.5 * (k._rhs_with(Q, rho, T, a, plus) - k._rhs_with(Q, rho, T, a, minus))
    return d_eta * k.model.eta * k.model.schedule.rate(float(t))


def step_phase(b: float, N: int) -> float:
    r"""``δ_N = K/N·N − N b``: how far past ``b`` the first SGD step with the new rate sits.

    Step ``k`` uses ``η(k/N)`` (right-continuous), so the first step after a jump at ``b``
    is the smallest ``K`` with ``K/N ≥ b`` in floating point (as the simulators compute it);
    ``δ_N = K − N b ∈ [0, 1)``.
    """
    K = math.ceil(N * b)
    while K > 0 and (K - 1) / N >= b:
        K -= 1
    while K / N < b:
        K += 1
    return float(K - N * b)


def step_shift(k, Q, rho, T, a, b, N) -> np.ndarray:
    r"""The jump of ``c`` at a step of the learning rate at ``b``: ``δ_N (f(x; η₋) − f(x; η₊))``.

    The map runs the old rate until its first step ``K ≥ N b``, a time ``δ_N/N`` past the
    ODE's switch (:func:`step_phase`): its mean is then ``x(b) + δ_N f₋/N`` where the ODE's
    is ``x(b) + δ_N f₊/N`` (to ``O(N⁻²)``), and from there both follow the new rate.  So
    ``c(b⁺) = c(b⁻) + δ_N (f₋ − f₊)``; ``Σ`` is continuous.
    """
    i = PARAMS.index("eta")
    sched = k.model.schedule
    out = np.zeros(k.layout.dim)
    for tj, before, after in sched.jumps(b - 1e-12 * max(1.0, abs(b)),
                                         b + 1e-12 * max(1.0, abs(b))):
        base = list(k.params_at(tj))
        left, right = list(base), list(base)
        left[i], right[i] = k.model.eta * before, k.model.eta * after
        out += step_phase(tj, N) * (k._rhs_with(Q, rho, T, a, left)
                                    - k._rhs_with(Q, rho, T, a, right))
    return out


def finite_n_drift(der, k, x, T, f, t, N) -> np.ndarray:
    r"""The O(1/N) part of SGD's mean drift, ``(f₁ − ½(J f + ∂f/∂t))/N``, at states `x`.

    Added to the order-parameter SDE's drift it makes the SDE's mean SGD's to O(1/N), not
    only the ODE's: the SDE's own nonlinearity gives ``½ ∂²f : Σ`` (Itô, ``Cov X = Σ/N``),
    and with this term ``dm/dt`` is the right-hand side of ``c``'s equation
    (docs/derivation.md §8.3a).  ``J f`` is the derivative along ``f`` (one stencil
    direction per state); unconstrained models (on the sphere ``f₁`` holds the
    renormalisation's second order, which the SDE's own projection of each step
    changes).  `x` (R, dim), `f` the drift there.
    """
    params = k.params_at(t)
    f1 = der.f1_sources(x, T, params)["total"]
    norm = np.linalg.norm(f, axis=-1, keepdims=True)
    v = np.where(norm > 0, f / np.where(norm > 0, norm, 1.0), 0.0)
    _, d1, _ = der.along(x, T, v[..., None, :], params)
    out = f1 - 0.5 * norm * d1[..., 0, :]
    if not k.model.schedule.is_constant:
        Q, rho, a = k.layout.unpack(x)
        out = out - 0.5 * schedule_time_derivative(k, Q, rho, T, a if k.model.readout_trained
                                                   else None, t)
    return out / N


def omega_map(lay_blocks, lay_iso, spectrum) -> np.ndarray:
    r"""``S`` (dim_iso × dim): the isotropic state of the total covariance from the block state.

    ``Ω_λλ = Σ_c s_c Q^c``, ``Ω_λν = Σ_c s_c ρ^c`` (docs/model.md §1a) and the readout
    unchanged: ``x_Ω = S X``.  The risk is ``ε(Ω)``, so ``∇_X ε = Sᵀ ∇ε(x_Ω)`` (per block
    ``s_c ∇ε(Ω)``) and ``∇²_X ε = Sᵀ ∇²ε(x_Ω) S``.
    """
    s = [float(sb) for _, sb in spectrum]
    col = {entry: j for j, entry in enumerate(lay_iso.entries)}
    S = np.zeros((lay_iso.dim, lay_blocks.dim))
    for J, entry in enumerate(lay_blocks.entries):
        if entry[0] == "a":
            S[col[entry], J] = 1.0
        else:
            name, c, i, j = entry
            S[col[(name, i, j)], J] = s[c]
    return S


class BlockDriftDerivatives:
    r"""The Jacobian and the risk's derivatives of a model with an input spectrum.

    **Jacobian**: stencils of the block drift kernels (:meth:`Kernels.rhs`, the sphere's
    projection included) along the unit vectors of the block state — exact polynomial
    stencils off the sphere for polynomial activations (the block drift is a polynomial of
    the state of the isotropic drift's degree: the legs replace columns of ``C``), the
    Richardson-extrapolated central differences of :data:`SMOOTH_STEP` otherwise (erf,
    ReLU, and the sphere's ``1/Q_kk``), as :class:`DriftDerivatives` does for erf and ReLU.
    **Risk**: ``ε(Ω)`` is the isotropic risk at the total covariance, so its gradient and
    Hessian are the isotropic ones (:class:`DriftDerivatives` of the model without the
    spectrum) pulled back by the linear map :func:`omega_map`.

    Parameters
    ----------
    kern : Kernels
        The block kernels of the model.
    iso : DriftDerivatives
        The isotropic model's derivatives (the same activations, readouts and loss).
    """

    def __init__(self, kern, iso):
        self.k = kern
        self.model = kern.model
        self.lay = kern.layout
        self.iso = iso
        self.trained = self.model.readout_trained
        self.S = omega_map(self.lay, iso.lay, self.model.spectrum)
        self.s = np.array([float(sb) for _, sb in self.model.spectrum])
        exact = self.model.is_polynomial and self.model.constraint != "sphere"
        self.poly = exact
        self.drift_nodes = _nodes(drift_degree(self.model) if exact else None)

    def drift(self, X, T, params):
        """The block drift at states ``X`` (..., dim); ``T`` (B, p*, p*) or batched."""
        Q, rho, a = self.lay.unpack(X)
        T = np.asarray(T, dtype=float)
        T = np.broadcast_to(T, X.shape[:-1] + T.shape[-3:])
        if not self.trained:
            a = self.k._readout
        dQ, drho, da = self.k._rhs(Q, rho, T, a, params)
        return self.lay.pack(dQ, drho, da if self.trained else None)

    def jacobian(self, x, T, params):
        """``J = ∂f/∂X`` (dim, dim) at one state `x` (stencils, class docstring)."""
        x = np.asarray(x, dtype=float)
        if x.ndim != 1:
            return np.stack([self.jacobian(xi, T, params) for xi in x])
        nodes = self.drift_nodes
        w1, _ = stencil_weights(nodes)
        step = (POLY_STEP if self.poly else SMOOTH_STEP) * max(1.0, float(np.max(np.abs(x))))
        t = np.array([float(v) for v in nodes])
        eye = np.eye(self.lay.dim)
        pts = x + step * t[:, None, None] * eye[None]              # (n_nodes, dim, dim)
        F = self.drift(pts, T, params)                             # (n_nodes, dim(dir), dim)
        return np.einsum("j,jri->ir", w1, F) / step

    def _total(self, x, T):
        """The isotropic state ``S X`` of the total covariance and ``T_Ω = Σ_c s_c T^c``."""
        xo = np.asarray(x, dtype=float) @ self.S.T
        return xo, np.einsum("c,...cij->...ij", self.s, np.asarray(T, dtype=float))

    def risk_gradient(self, x, T):
        """``∂ε/∂X`` (..., dim) ``= Sᵀ ∇ε(Ω)``."""
        return self.iso.risk_gradient(*self._total(x, T)) @ self.S

    def risk_hessian(self, x, T):
        """``∂²ε/∂X∂X`` (..., dim, dim) ``= Sᵀ ∇²ε(Ω) S``."""
        return self.S.T @ self.iso.risk_hessian(*self._total(x, T)) @ self.S
