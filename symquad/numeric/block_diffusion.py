r"""The diffusion matrix of an input spectrum from the isotropic one (docs/derivation.md §8.8).

With ``x ~ N(0, Σ)``, ``Σ = Σ_c s_c P_c``, one SGD step changes the block state
``X = (Q^1, …, Q^B upper triangles, ρ^1, …, ρ^B, a)`` by ``(1/N) Mean_μ φ_X`` with the
per-sample increments (docs/derivation.md §1a; ``g_k = a_k σ'(λ_k) e``, ``G_kl = g_k g_l``)

.. math::  φ_{Q^c_{kl}} = −η (g_k μ^c_l + g_l μ^c_k) + \frac{η^2}{b} κ_c G_{kl}, \qquad
           φ_{ρ^c_{km}} = −η g_k μ^{*c}_m, \qquad φ_{a_k} = −η_a σ(λ_k) e,

``μ^c_l = w_l P_c x/√N`` the block fields, ``κ_c = f_c s_c`` the limit of
``r_c = xᵀP_c x/N`` (its ``O(N^{-1/2})`` fluctuation enters ``D`` at ``O(1/N)`` only, like
``|x|²/N`` in the isotropic ``D``: it multiplies the ``η²`` term, is independent of the
fields up to ``O(1/N)`` and has mean ``0``, so its covariance with ``φ`` is ``O(1/N)`` and
its own variance ``2 f_c s_c²/N``).  ``D = Cov[φ]/b``.

**Reduction to the isotropic ``D``.**  The fields ``(λ, ν, μ^1, …, μ^B)`` are jointly
Gaussian: ``Cov(z, z) = Ω = Σ_c s_c C^c``, ``Cov(μ^c, z) = s_c C^c``, ``Cov(μ^c, μ^d) =
δ_cd s_c C^c`` (``C^c = [[Q^c, ρ^c], [ρ^cᵀ, T^c]]``; ``P_c Σ P_d = δ_cd s_c P_c``).  Take the
isotropic model with the same students and a *virtual teacher* of ``p* + B n`` fields
(``n = p + p*``), readout ``(b, 0, …, 0)`` (the zero-readout fields do not enter the
labels): the teacher's own ``ν``, and per block ``v^c_l = λ_l − μ^c_l/κ_c`` (``l ≤ p``)
and ``μ^{*c}_m``.  Its per-sample increments ``φ^{iso}`` (isotropic, at the virtual
covariance) give the block ones linearly,

.. math::  φ_{Q^c_{kl}} = κ_c\,\big(φ^{iso}_{Q_{kl}} − φ^{iso}_{ρ_{k, v^c_l}} − φ^{iso}_{ρ_{l, v^c_k}}\big),
           \qquad φ_{ρ^c_{km}} = φ^{iso}_{ρ_{k, μ^{*c}_m}}, \qquad φ_a = φ^{iso}_a

(``−φ^{iso}_{ρ_{k,v}} = η g_k (λ_l − μ^c_l/κ_c)`` cancels the ``λ`` terms of
``φ^{iso}_{Q_{kl}}``), so ``D = A D^{iso}_{virtual} Aᵀ`` with that constant map ``A``, and
every route of the isotropic ``D`` (matrix, tensor, erf's closed forms, the cubature of
ReLU and mixed pairs) serves unchanged.  On the sphere the per-sample increment is
projected as the drift is, ``φ^c_{kl} − ½ Q^c_{kl} (φ_{kk}/Q_{kk} + φ_{ll}/Q_{ll})`` with the
Euclidean ``φ_{kk} = Σ_c φ^c_{kk}``, ``Q_{kk} = Σ_c Q^c_{kk}``: ``D = P A D^{iso} Aᵀ Pᵀ``.
Cost: the isotropic ``D`` at ``p* + B n`` teacher fields (the tensor route's
``O(p⁴ n⁴)`` becomes ``O(p⁴ (B + 1)⁴ n⁴)``).

Only mathematics: the caller passes the isotropic ``D`` of the virtual model.
"""

from __future__ import annotations

import numpy as np

from .layout import StateLayout
from ..runtime.tensor_engine import combine

__all__ = ["virtual_teacher_size", "virtual_overlaps", "virtual_map", "sphere_projection"]


def virtual_teacher_size(p: int, p_star: int, n_blocks: int) -> int:
    """Fields of the virtual teacher: ``p* + B (p + p*)`` (the teacher, then ``v^c``, ``μ*^c``)."""
    return p_star + n_blocks * (p + p_star)


def _fractions(spectrum):
    f = np.array([float(fb) for fb, _ in spectrum])
    s = np.array([float(sb) for _, sb in spectrum])
    return f, s


def virtual_overlaps(spectrum, Q, rho, T):
    r"""``(Q_v, ρ_v, T_v)``: the covariance of the students and the virtual teacher's fields.

    ``Q`` (..., B, p, p), ``ρ`` (..., B, p, p*), ``T`` (..., B, p*, p*).  The joint
    covariance ``K`` of ``Y = (z, μ^1, …, μ^B)`` (``n (B + 1)`` fields, module docstring) is
    mapped by the rows ``M`` of the virtual fields, ``M K Mᵀ``.  Returns ``Q_v = Ω_λλ``
    (..., p, p), ``ρ_v`` (..., p, p*_v), ``T_v`` (..., p*_v, p*_v).
    """
    f, s = _fractions(spectrum)
    kappa = f * s
    C, p = combine(Q, rho, T)                                   # (..., B, n, n)
    B, n = C.shape[-3], C.shape[-1]
    ps = n - p
    scaled = s[:, None, None] * C                               # s_c C^c
    size = n * (B + 1)
    K = np.zeros(C.shape[:-3] + (size, size))
    K[..., :n, :n] = scaled.sum(-3)                             # Ω
    for c in range(B):
        blk = slice(n * (c + 1), n * (c + 2))
        K[..., blk, :n] = scaled[..., c, :, :]                  # Cov(μ^c, z) = s_c C^c
        K[..., :n, blk] = scaled[..., c, :, :]
        K[..., blk, blk] = scaled[..., c, :, :]                 # Cov(μ^c, μ^c) = s_c C^c
    M = np.zeros((p + virtual_teacher_size(p, ps, B), size))
    M[:n, :n] = np.eye(n)                                       # λ, then the teacher's ν
    row = n
    for c in range(B):
        for l in range(p):                                      # v^c_l = λ_l − μ^c_l/κ_c
            M[row, l] = 1.0
            M[row, n * (c + 1) + l] = -1.0 / kappa[c]
            row += 1
        for m in range(ps):                                     # μ*^c_m
            M[row, n * (c + 1) + p + m] = 1.0
            row += 1
    Cv = M @ K @ M.T
    Cv = 0.5 * (Cv + np.swapaxes(Cv, -1, -2))
    return Cv[..., :p, :p], Cv[..., :p, p:], Cv[..., p:, p:]


def virtual_map(spectrum, p: int, p_star: int, trained: bool) -> np.ndarray:
    r"""``A`` (dim × dim_v): the block increments from the virtual isotropic ones (module docstring).

    Rows in the block state order (:class:`~symquad.numeric.layout.StateLayout` with
    ``spectrum_blocks = B``), columns in the virtual isotropic state order (``p`` students,
    ``p* + B n`` teacher fields).
    """
    f, s = _fractions(spectrum)
    kappa = f * s
    B, n = len(kappa), p + p_star
    lay = StateLayout(p, p_star, trained, B)
    virt = StateLayout(p, virtual_teacher_size(p, p_star, B), trained, 0)   # 0: isotropic
    col = {entry: j for j, entry in enumerate(virt.entries)}
    A = np.zeros((lay.dim, virt.dim))
    for I, entry in enumerate(lay.entries):
        if entry[0] == "Q":
            _, c, i, j = entry
            A[I, col[("Q", i, j)]] += kappa[c]
            A[I, col[("rho", i, p_star + c * n + j)]] -= kappa[c]
            A[I, col[("rho", j, p_star + c * n + i)]] -= kappa[c]
        elif entry[0] == "rho":
            _, c, i, m = entry
            A[I, col[("rho", i, p_star + c * n + p + m)]] = 1.0
        else:
            A[I, col[entry]] = 1.0
    return A


def sphere_projection(lay, x) -> np.ndarray:
    r"""``P`` (..., dim, dim): the sphere's first-order projection of a block increment.

    ``(Pφ)_I = φ_I − ½ X_I Σ_k n_{Ik} φ_{kk}/Q_{kk}`` with ``n_{Ik}`` the multiplicity of unit
    ``k`` in entry ``I`` (``Q^c_kl``: ``k`` and ``l``; ``ρ^c_km``: ``k``; ``a``: none) and the
    Euclidean ``φ_kk = Σ_c φ_{Q^c_kk}``, ``Q_kk = Σ_c Q^c_kk`` (docs/derivation.md §1a).
    """
    x = np.asarray(x, dtype=float)
    p = lay.p
    mult = np.zeros((lay.dim, p))
    total = np.zeros((p, lay.dim))                               # sums the blocks' (k, k)
    for I, entry in enumerate(lay.entries):
        if entry[0] == "Q":
            _, _, i, j = entry
            mult[I, i] += 1
            mult[I, j] += 1
            if i == j:
                total[i, I] = 1.0
        elif entry[0] == "rho":
            mult[I, entry[2]] += 1
    qkk = x @ total.T                                            # (..., p)
    weights = np.einsum("Ik,...k,kJ->...IJ", mult, 1.0 / qkk, total)
    return np.eye(lay.dim) - 0.5 * x[..., :, None] * weights
