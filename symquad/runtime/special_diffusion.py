r"""The diffusion matrix's moment kinds for an erf student (imported by :mod:`symquad.numeric.kernels`).

The generated diffusion assembly (:mod:`symquad._generated.diffusion_assembly`)
builds ``D`` from nine moment kinds
``M_{dxs}(i..; j..; k..) = E[∏_d σ'(u_i) ∏_x u_j ∏_s σ(u_k) δ^{d+s}]`` (``d ≤ 4``,
``x ≤ 2``, ``s ≤ 2``, ``d + s ≤ 4``; ``δ = Σ_a w_a σ_a(u_a) − √Δ ξ``, weights
``w = (a, −b)``, fields ``u ~ N(0, C)``, ``C = [[Q, ρ], [ρᵀ, T]]``).  For
``σ = σ* = erf(z/√2)`` (the Saad–Solla convention) this module evaluates them
from four facts (docs/special_activations.md, docs/derivation.md §8.6):

1. **Fold.** ``σ'(z) = √(2/π) e^{−z²/2}``, so the ``d`` derivative factors are a
   Gaussian weight ``e^{−|Vu|²/2}`` (``V`` the ``d × n`` selection of their
   fields, repeats allowed) and
   ``E_C[e^{−|Vu|²/2} G(u)] = det(I + VCVᵀ)^{−1/2} E_{C_F}[G]``,
   ``C_F = C − CVᵀ(I + VCVᵀ)^{−1}VC`` (complete the square; valid for singular
   ``C``).  A kind is ``(2/π)^{d/2} det(…)^{−1/2}`` times an expectation of
   ``∏u_j`` and up to four erf factors under ``C_F``.
2. **Label noise** integrated out: ``δ² → δ_c² + Δ``, ``δ³ → δ_c³ + 3Δδ_c``,
   ``δ⁴ → δ_c⁴ + 6Δδ_c² + 3Δ²``.
3. **Stein** removes the ``u_j``: ``E[u_j F] = Σ_x A_jx E[∂_x F]`` and
   ``∂_x erf = σ'`` folds again (one field), so ``E[u_j L₁]``,
   ``E[u_j L₁L₂L₃]``, ``E[u_i u_j L₁L₂]`` (``L = c·erf(u)`` linear forms of the
   erf fields) are closed: sums of folded two-point functions
   ``E[erf erf] = (2/π) asin(A_ab/√((1 + A_aa)(1 + A_bb)))``.
4. **Four erf factors** (``E[L₁L₂L₃L₄]``, a four-variate orthant function with
   no elementary form) by Price's theorem along ``A(t) = diag A + t·offdiag A``:
   ``E = E_0 + ∫_0^1 Σ_{x<y} A_xy E_t[∂_x∂_y ∏L] dt``, where the integrand folds
   ``x, y`` (closed) and ``E_0`` (independent fields) needs the one-variable
   ``E[erf(u)⁴]``, itself by the same path over four copies.  The ``t`` integral
   is a Gauss–Legendre rule whose node count grows with the largest field
   variance ``v`` of the state (:data:`NODE_TABLE`: 12 nodes for ``v ≤ 1.5``,
   16 for ``v ≤ 4``, 24 for ``v ≤ 12``, 48 above); the integrand is analytic
   near ``[0, 1]``, its nearest singularities approaching ``t = 1`` as the
   variances grow.  Measured against 200 nodes (relative to ``(Σ|c|)⁴``):
   below 1e-15 at ``v ≤ 1``, 2e-12 at ``v ≤ 3`` with 16 nodes, 6e-11 at ``v ≤ 10``
   with 24; stated accuracy ``1e-11`` for ``v ≤ 12`` (tested in
   ``tests/test_special_diffusion.py``).

Cost law (:func:`erf_diffusion_cost`): the four-erf kind ``M400`` dominates,
``C(p+3, 4)`` folds × ``n(n−1)/2`` pairs × ``n(n+1)/2`` two-point functions × nodes,
i.e. ``≈ p⁴n⁴ · nodes / 96`` arcsines; a trained readout adds ``M201``
(``≈ p³n⁴ · nodes/8``) and ``M002`` (``p²n⁴ · nodes/8``).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy

from .diffusion_engine import KindArrays
from .tensor_engine import combine, weights

__all__ = ["erf_diffusion_kinds", "erf_diffusion_cost", "NODE_TABLE", "price_nodes", "fold",
           "two_point", "four_erf", "erf_fourth_moment", "KIND_SHAPES"]

#: Gauss–Legendre nodes of the Price-path integral of four erf factors, by the largest
#: field variance of the state: ``(variance bound, nodes)``.
NODE_TABLE = ((1.5, 12), (4.0, 16), (12.0, 24), (math.inf, 48))
#: The largest node count (the cost law's worst case below variance 12).
PRICE_NODES = 24
_TWO_PI = 2.0 / math.pi
_SQRT_TWO_PI = math.sqrt(2.0 / math.pi)

#: Axis roles of each kind's array: ``d``/``s`` students (``p``), ``x`` fields (``n``).
KIND_SHAPES = {"M110": "dx", "M200": "dd", "M001": "s", "M220": "ddxx", "M310": "dddx",
               "M400": "dddd", "M111": "dxs", "M201": "dds", "M002": "ss"}


def price_nodes(variance) -> int:
    """Node count of the Price-path rule for a state whose largest field variance is `variance`."""
    for bound, nodes in NODE_TABLE:
        if variance <= bound:
            return nodes
    return NODE_TABLE[-1][1]     # NaN: the state is not finite, any rule


@functools.lru_cache(maxsize=16)
def _nodes(count):
    """Gauss–Legendre nodes and weights on ``[0, 1]`` (read-only arrays, cached)."""
    x, wts = numpy.polynomial.legendre.leggauss(int(count))
    t, wt = 0.5 * (x + 1.0), 0.5 * wts
    t.flags.writeable = False
    wt.flags.writeable = False
    return t, wt


def fold(C, F):
    """Fold the erf′ factors of fields ``F`` out of the measure.

    Parameters
    ----------
    C : ndarray (..., n, n)
        Covariance (positive semi-definite, may be singular).
    F : ndarray of int (K, d)
        ``K`` multisets of ``d`` fields (repeats allowed), one per row.

    Returns
    -------
    factor : ndarray (..., K)
        ``E_C[∏_{i∈F} σ'(u_i)] = (2/π)^{d/2} det(I_d + C_FF)^{−1/2}``.
    A : ndarray (..., K, n, n)
        The folded covariance ``C − C_{·F}(I_d + C_FF)^{−1}C_{F·}``.
    """
    F = numpy.asarray(F, dtype=int)
    K, d = F.shape
    if d == 0:
        shape = C.shape[:-2] + (K,)
        return numpy.ones(shape), numpy.broadcast_to(C[..., None, :, :], shape + C.shape[-2:])
    X = numpy.moveaxis(C[..., F], -3, -3)                  # (..., n, K, d)
    X = numpy.moveaxis(X, -3, -2)                          # (..., K, n, d)
    M = C[..., F[:, :, None], F[:, None, :]] + numpy.eye(d)  # (..., K, d, d)
    try:
        Minv_Xt = numpy.linalg.solve(M, numpy.swapaxes(X, -1, -2))   # (..., K, d, n)
    except numpy.linalg.LinAlgError:
        # I + C_FF is positive definite on the cone of covariances; a singular one means
        # a state far outside it (a diverging SDE run): NaN, which the callers report
        shape = C.shape[:-2] + (K,)
        return (numpy.full(shape, numpy.nan),
                numpy.full(shape + C.shape[-2:], numpy.nan))
    A = C[..., None, :, :] - X @ Minv_Xt
    A = 0.5 * (A + numpy.swapaxes(A, -1, -2))
    factor = _SQRT_TWO_PI ** d / numpy.sqrt(numpy.linalg.det(M))
    return factor, A


def two_point(A):
    """``E[erf(u_a/√2) erf(u_b/√2)] = (2/π) asin(A_ab/√((1+A_aa)(1+A_bb)))``; (..., n, n)."""
    s = 1.0 / numpy.sqrt(1.0 + numpy.diagonal(A, axis1=-2, axis2=-1))
    r = A * s[..., :, None] * s[..., None, :]
    return _TWO_PI * numpy.arcsin(numpy.clip(r, -1.0, 1.0))


def _g(A):
    """``E[σ'(u_x)] = √(2/π) (1 + A_xx)^{−1/2}``; (..., n)."""
    return _SQRT_TWO_PI / numpy.sqrt(1.0 + numpy.diagonal(A, axis1=-2, axis2=-1))


def _fold_each(A):
    """Every one-field fold: ``A^{(x)} = A − A_{·x}A_{x·}/(1 + A_xx)``; (..., n[x], n, n)."""
    d = numpy.diagonal(A, axis1=-2, axis2=-1)
    return A[..., None, :, :] - A[..., :, :, None] * A[..., :, None, :] / (1.0 + d)[..., :, None,
                                                                                        None]


def _u1(A, c):
    """``E[u_j L_c] = Σ_x A_jx c_x g_x``; ``c`` (..., E, n) -> (..., E, n)."""
    return numpy.einsum("...jx,...ex->...ej", A, c * _g(A)[..., None, :])


def _u1l3(A, c1, c2, c3):
    """``E[u_j L₁L₂L₃] = Σ_x A_jx g_x Σ_i c^i_x E_{A^{(x)}}[L_k L_l]``; (..., E, n)."""
    E2 = two_point(_fold_each(A))                                   # (..., x, a, b)
    inner = (c1 * numpy.einsum("...xab,...ea,...eb->...ex", E2, c2, c3)
             + c2 * numpy.einsum("...xab,...ea,...eb->...ex", E2, c1, c3)
             + c3 * numpy.einsum("...xab,...ea,...eb->...ex", E2, c1, c2))
    return numpy.einsum("...jx,...ex->...ej", A, inner * _g(A)[..., None, :])


def _u2l2(A, c1, c2):
    """``E[u_i u_j L₁L₂] = A_ij E[L₁L₂] + Σ_x A_ix g_x (c¹_x E_{A^{(x)}}[u_j L₂] + c²_x …)``.

    Returns (..., E, n, n), symmetrised in ``i ↔ j``.
    """
    P2 = numpy.einsum("...ab,...ea,...eb->...e", two_point(A), c1, c2)
    Ax = _fold_each(A)                                              # (..., x, n, n)
    gx = _g(Ax)                                                     # (..., x, n)
    # E_{A^(x)}[u_j L] = Σ_y A^(x)_jy c_y g^(x)_y, for both c: (..., E, x, j)
    h1 = numpy.einsum("...xjy,...ey,...xy->...exj", Ax, c1, gx)
    h2 = numpy.einsum("...xjy,...ey,...xy->...exj", Ax, c2, gx)
    inner = c1[..., :, None] * h2 + c2[..., :, None] * h1           # (..., E, x, j)
    out = numpy.einsum("...ix,...x,...exj->...eij", A, _g(A), inner)
    out = out + A[..., None, :, :] * P2[..., None, None]
    return 0.5 * (out + numpy.swapaxes(out, -1, -2))


def erf_fourth_moment(v, nodes=None):
    """``E[erf(u/√2)⁴]``, ``u ~ N(0, v)``, by the Price path over four copies (``PRICE_NODES``).

    With slot covariance ``v((1−t)I + t𝟙𝟙ᵀ)``: ``E = ∫_0^1 6v E_t[σ'σ' erf erf] dt``
    (the slots are independent at ``t = 0``, where ``E[erf] = 0``), the integrand
    the fold of two slots and the arcsine of the other two.
    """
    v = numpy.asarray(v, dtype=float)
    t, wt = _nodes(nodes or price_nodes(float(numpy.max(v, initial=0.0))))
    vt = v[..., None] * t                                   # off-diagonal slot covariance
    vv = v[..., None] + 0.0 * t
    det = (1.0 + vv) ** 2 - vt ** 2
    # folded covariance of slots 3, 4: Σ_34 − X M⁻¹ Xᵀ with X = vt [[1, 1], [1, 1]]
    # M⁻¹ 𝟙 = 𝟙/(1 + v + vt), so X M⁻¹ Xᵀ = 2 vt²/(1 + v + vt) in every entry
    s = 2.0 * vt ** 2 / (1.0 + vv + vt)
    a33, a34 = vv - s, vt - s
    integrand = 6.0 * vv * _TWO_PI / numpy.sqrt(det) * _TWO_PI * numpy.arcsin(
        numpy.clip(a34 / (1.0 + a33), -1.0, 1.0))
    return numpy.sum(integrand * wt, axis=-1)


#: Elements ``(rows × pairs × triangle)`` per block of the four-erf quadrature (bounded
#: memory: measured 5x faster than unblocked at p = 8 with 16 states).
FOUR_BLOCK_ELEMENTS = 1 << 17


def four_erf(A, c1, c2, c3, c4, nodes=None):
    """``E_A[L₁L₂L₃L₄]`` of four linear forms ``L_i = c^i·erf(u/√2)``; (..., E).

    ``A`` (..., n, n); ``c^i`` (..., E, n), evaluated in blocks of rows of at most
    :data:`FOUR_BLOCK_ELEMENTS` elements (:func:`_four_erf_block`).
    """
    n = A.shape[-1]
    dg = numpy.diagonal(A, axis1=-2, axis2=-1)
    nodes = nodes or price_nodes(float(numpy.max(dg, initial=0.0)))
    cs = (c1, c2, c3, c4)
    E = max(c.shape[-2] for c in cs)
    lead = numpy.broadcast_shapes(A.shape[:-2], *(c.shape[:-2] for c in cs))
    Af = numpy.broadcast_to(A, lead + (n, n)).reshape(-1, n, n)
    # the same object stays the same object (the quadratic forms are deduplicated by id)
    flat = {}
    for c in cs:
        if id(c) not in flat:
            flat[id(c)] = numpy.broadcast_to(c, lead + (E, n)).reshape(-1, E, n)
    rows = Af.shape[0]
    per_row = max(1, (n * (n - 1) // 2) * (n * (n + 1) // 2) * E)
    step = max(1, FOUR_BLOCK_ELEMENTS // per_row)
    out = numpy.empty((rows, E))
    for r0 in range(0, rows, step):
        sl = slice(r0, min(rows, r0 + step))
        blocks = {key: value[sl] for key, value in flat.items()}
        out[sl] = _four_erf_block(Af[sl], *(blocks[id(c)] for c in cs), nodes=nodes)
    return out.reshape(lead + (E,))


def _four_erf_block(A, c1, c2, c3, c4, nodes=None):
    """``E_A[L₁L₂L₃L₄]`` of four linear forms ``L_i = c^i·erf(u/√2)``; (..., E).

    ``A`` (..., n, n); ``c^i`` (..., E, n).  Price's theorem along
    ``A(t) = diag A + t offdiag A`` (see the module docstring):
    ``E_0 + ∫_0^1 Σ_{x<y} A_xy E_t[σ'_x σ'_y Σ_{i≠j} c^i_x c^j_y L_k L_l] dt``,
    `nodes` Gauss–Legendre nodes (default :func:`price_nodes` of the largest variance).
    """
    cs = (c1, c2, c3, c4)
    n = A.shape[-1]
    dg = numpy.diagonal(A, axis1=-2, axis2=-1)
    nodes = nodes or price_nodes(float(numpy.max(dg, initial=0.0)))
    # t = 0: independent fields, E[erf²] = (2/π) asin(v/(1+v)), cumulant κ₄ = m₄ − 3m₂²
    m2 = _TWO_PI * numpy.arcsin(dg / (1.0 + dg))
    k4 = erf_fourth_moment(dg, nodes) - 3.0 * m2 ** 2
    m2e = m2[..., None, :]

    def pm(u, v):
        return numpy.sum(u * m2e * v, axis=-1)
    total = (numpy.sum(c1 * c2 * c3 * c4 * k4[..., None, :], axis=-1)
             + pm(c1, c2) * pm(c3, c4) + pm(c1, c3) * pm(c2, c4) + pm(c1, c4) * pm(c2, c3))
    xs, ys = numpy.triu_indices(n, 1)
    if xs.size == 0:
        return total
    off = A - dg[..., :, None] * numpy.eye(n)
    Axy = A[..., xs, ys]                                           # (..., P)
    t, wt = _nodes(nodes)
    # Σ_{i≠j} c^i_x c^j_y E[L_k L_l]: one quadratic form per unordered {k, l} (deduplicated
    # when the linear forms are the same object, e.g. four times δ)
    splits = [((i, j), tuple(m for m in range(4) if m not in (i, j)))
              for i in range(4) for j in range(i + 1, 4)]
    # the folded two-point functions on the triangle a <= b only (E2 is symmetric):
    # Σ_ab E2_ab c_a d_b = Σ_{a<=b} E2_ab (c_a d_b + c_b d_a)/(1 + δ_ab)
    ta, tb = numpy.triu_indices(n)
    half = numpy.where(ta == tb, 0.5, 1.0)
    sym = {}

    def tri(k, l):
        key = tuple(sorted((id(cs[k]), id(cs[l]))))
        if key not in sym:
            ck, cl = cs[k], cs[l]
            sym[key] = (ck[..., ta] * cl[..., tb] + ck[..., tb] * cl[..., ta]) * half
        return key, sym[key]
    for tk, wk in zip(t, wt):
        At = off * tk + dg[..., :, None] * numpy.eye(n)
        factor, E2 = _pair_fold_triangle(At, xs, ys, ta, tb)      # (..., P), (..., P, T)
        forms = {}
        S = 0.0
        for (i, j), (k, l) in splits:
            key, coeff = tri(k, l)
            if key not in forms:
                forms[key] = numpy.einsum("...PT,...eT->...eP", E2, coeff)
            outer = cs[i][..., xs] * cs[j][..., ys] + cs[j][..., xs] * cs[i][..., ys]
            S = S + outer * forms[key]
        total = total + wk * numpy.einsum("...P,...eP->...e", Axy * factor, S)
    return total


def _pair_fold_triangle(A, xs, ys, ta, tb):
    """Fold two fields ``(x, y)`` for every pair, then :func:`two_point` on ``(ta, tb)``.

    The ``2 × 2`` inverse written out: with ``M = [[1 + A_xx, A_xy], [A_xy, 1 + A_yy]]``,
    ``A'' = A − (1/det M)[(1 + A_yy) u_x u_xᵀ − A_xy (u_x u_yᵀ + u_y u_xᵀ) + (1 + A_xx) u_y u_yᵀ]``,
    ``u_v = A_{·v}`` (measured 3x faster than a batched ``solve``).  Returns the fold factor (..., P) and ``E[erf erf]`` of the folded covariance at
    the index pairs (..., P, T).
    """
    a = A[..., xs, xs] + 1.0
    b = A[..., ys, ys] + 1.0
    c = A[..., xs, ys]
    det = a * b - c * c
    ux = numpy.swapaxes(A[..., :, xs], -1, -2)                     # (..., P, n)
    uy = numpy.swapaxes(A[..., :, ys], -1, -2)
    inv = 1.0 / det
    vx = (b * inv)[..., None] * ux - (c * inv)[..., None] * uy
    vy = (a * inv)[..., None] * uy - (c * inv)[..., None] * ux
    diag = numpy.diagonal(A, axis1=-2, axis2=-1)[..., None, :] - ux * vx - uy * vy
    s = 1.0 / numpy.sqrt(1.0 + diag)                               # (..., P, n)
    off = (A[..., ta, tb][..., None, :] - ux[..., ta] * vx[..., tb] - uy[..., ta] * vy[..., tb])
    r = off * s[..., ta] * s[..., tb]
    return _TWO_PI / numpy.sqrt(det), _TWO_PI * numpy.arcsin(numpy.clip(r, -1.0, 1.0))


def _tuples(p, d):
    """Sorted multisets of ``d`` students, (K, d)."""
    return numpy.array(list(itertools.combinations_with_replacement(range(p), d)),
                       dtype=int).reshape(-1, d)


def _scatter_symmetric(values, tuples, p, extra_shape):
    """Full array (..., p^d, *extra) from the values (..., K, *extra) on sorted multisets."""
    K, d = tuples.shape
    batch = values.shape[:values.ndim - 1 - len(extra_shape)]
    out = numpy.empty(batch + (p,) * d + extra_shape)
    for perm in set(itertools.permutations(range(d))):
        idx = tuple(tuples[:, perm[i]] for i in range(d))
        out[(Ellipsis,) + idx + (slice(None),) * len(extra_shape)] = values
    return out


def erf_diffusion_cost(p: int, p_star: int, trained: bool) -> float:
    """Arcsine evaluations of one ``D`` at the worst-case node count :data:`PRICE_NODES`.

    The cost law: ``M400`` (``C(p+3, 4)`` folds of the four-erf moment), ``M310``
    (``C(p+2, 3) n³``) and, with a trained readout, ``M201`` (``C(p+1, 2) p``
    four-erf moments) and ``M002`` (``C(p+1, 2)``).
    """
    n = p + p_star
    per_four = PRICE_NODES * (n * (n - 1) // 2) * (n * (n + 1) // 2)
    count = math.comb(p + 3, 4) * per_four + math.comb(p + 2, 3) * n ** 3
    if trained:
        count += math.comb(p + 1, 2) * p * per_four + math.comb(p + 1, 2) * per_four
    return float(count)


def erf_diffusion_kinds(Q, rho, T, a, b, Delta, names):
    """The moment kinds ``names`` for ``σ = σ* = erf(z/√2)`` as whole arrays (a :class:`KindArrays`).

    Same contract and axes as :func:`symquad.runtime.diffusion_engine.tensor_kinds`:
    students (``p``) for ``σ'`` and ``σ`` arguments, fields (``n``) for ``u``
    arguments; leading batch dimensions allowed.  Each batch element gets the
    node count of its own largest variance (:func:`price_nodes`), so a state's
    kinds do not depend on the other states of the batch.
    """
    C, p = combine(Q, rho, T)
    w = weights(a, b)
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    n = C.shape[-1]
    C = numpy.broadcast_to(C, batch + (n, n)).reshape(-1, n, n)
    w = numpy.broadcast_to(w, batch + (n,)).reshape(-1, n)
    counts = numpy.array([price_nodes(v) for v in
                          numpy.max(numpy.diagonal(C, axis1=-2, axis2=-1), axis=-1, initial=0.0)],
                         dtype=int)
    parts = {}
    for count in numpy.unique(counts):
        sel = numpy.nonzero(counts == count)[0]
        parts[count] = (sel, _kinds(C[sel], w[sel], p, float(Delta), names, int(count)))
    out = {}
    for name in names:
        first = next(iter(parts.values()))[1][name]
        full = numpy.empty((C.shape[0],) + first.shape[1:])
        for sel, values in parts.values():
            full[sel] = values[name]
        out[name] = full.reshape(batch + first.shape[1:])
    return KindArrays(out)


def _kinds(C, w, p, Delta, names, nodes):
    """The kinds of one group of states ``C`` (B, n, n), weights ``w`` (B, n), `nodes` nodes."""
    batch = C.shape[:-2]
    n = C.shape[-1]
    eye = numpy.eye(n)
    out = {}
    folds = {}

    def folded(d):
        if d not in folds:
            F = _tuples(p, d)
            folds[d] = (F,) + fold(C, F)
        return folds[d]

    def wk(K):                          # w per fold row, as one linear form: (..., K, 1, n)
        return numpy.broadcast_to(w[..., None, None, :], batch + (K, 1, n))

    for name in names:
        if name == "M110":
            F, c, A = folded(1)
            val = c[..., :, None] * _u1(A, wk(len(F)))[..., 0, :]          # (..., p, n)
            out[name] = val
        elif name == "M200":
            F, c, A = folded(2)
            P2 = numpy.einsum("...ab,...a,...b->...", two_point(A), w[..., None, :],
                              w[..., None, :])
            out[name] = _scatter_symmetric(c * (P2 + Delta), F, p, ())
        elif name == "M001":
            out[name] = numpy.einsum("...sa,...a->...s", two_point(C)[..., :p, :], w)
        elif name == "M220":
            F, c, A = folded(2)
            U = _u2l2(A, wk(len(F)), wk(len(F)))[..., 0, :, :]               # (..., K, n, n)
            val = c[..., None, None] * (U + Delta * A)
            out[name] = _scatter_symmetric(val, F, p, (n, n))
        elif name == "M310":
            F, c, A = folded(3)
            W = wk(len(F))
            val = _u1l3(A, W, W, W)[..., 0, :] + 3.0 * Delta * _u1(A, W)[..., 0, :]
            out[name] = _scatter_symmetric(c[..., None] * val, F, p, (n,))
        elif name == "M400":
            F, c, A = folded(4)
            W = wk(len(F))
            P4 = four_erf(A, W, W, W, W, nodes)[..., 0]
            P2 = numpy.einsum("...kab,...ka,...kb->...k", two_point(A), W[..., 0, :],
                              W[..., 0, :])
            out[name] = _scatter_symmetric(c * (P4 + 6.0 * Delta * P2 + 3.0 * Delta ** 2),
                                           F, p, ())
        elif name == "M111":
            F, c, A = folded(1)
            K = len(F)
            E = numpy.broadcast_to(eye[:p], batch + (K, p, n))            # e_s, s students
            W = numpy.broadcast_to(w[..., None, None, :], batch + (K, p, n))
            val = _u1l3(A, E, W, W) + Delta * _u1(A, E)                   # (..., k, s, j)
            out[name] = numpy.swapaxes(c[..., None, None] * val, -1, -2)   # (..., k, j, s)
        elif name == "M201":
            F, c, A = folded(2)
            K = len(F)
            E = numpy.broadcast_to(eye[:p], batch + (K, p, n))
            W = numpy.broadcast_to(w[..., None, None, :], batch + (K, p, n))
            P4 = four_erf(A, E, W, W, W, nodes)                                   # (..., K, s)
            P2 = numpy.einsum("...kab,...b->...ka", two_point(A), w)[..., :p]
            out[name] = _scatter_symmetric(c[..., None] * (P4 + 3.0 * Delta * P2), F, p, (p,))
        elif name == "M002":
            ss, tt = numpy.triu_indices(p)
            E1 = numpy.broadcast_to(eye[ss], batch + (ss.size, n))[..., None, :, :]
            E2_ = numpy.broadcast_to(eye[tt], batch + (ss.size, n))[..., None, :, :]
            W = numpy.broadcast_to(w[..., None, None, :], batch + (1, ss.size, n))
            P4 = four_erf(C[..., None, :, :], E1, E2_, W, W, nodes)[..., 0, :]     # (..., pairs)
            val = P4 + Delta * two_point(C)[..., ss, tt]
            M = numpy.empty(batch + (p, p))
            M[..., ss, tt] = val
            M[..., tt, ss] = val
            out[name] = M
        else:
            raise NotImplementedError(f"moment kind {name!r} of the erf diffusion")
    return out
