r"""Evaluation of the tensor route's moment kinds from a generated contraction plan.

A generated tensor module (:mod:`symquad.codegen.tensor_render`) holds, for one
pair of activations ``(σ, σ*)``, the vertex functions ``φ_j(D) = E[σ_a^{(j)}(x)]``
(``x ~ N(0, D)``) and the multigraph terms of ``I_2, J_2, I_3, I_4`` grouped into
tables (a :class:`Plan`).  This module evaluates them with Hadamard powers
``C^{∘j}/j!`` of the combined covariance ``C = [[Q, ρ], [ρᵀ, T]]`` and matrix
products (docs/derivation.md §4; the grouping of the four-point sum is
described in :mod:`symquad.codegen.tensor_render`):

* ``G_kj = Σ_a w_a I_3(k, j, a) = E[σ'(λ_k) u_j δ]`` for students ``k`` and all fields ``j``;
* ``B_kl = Σ_ab w_a w_b I_4(k, l, a, b) + Δ J_2(k, l) = E[σ'(λ_k) σ'(λ_l) δ²]``;
* ``R_k = Σ_a w_a I_2(k, a) = E[σ(λ_k) δ]`` (trained readouts only);
* the risk ``ε = ½ Σ_ab w_a w_b I_2(a, b)``,

with output weights ``w = (a_1..a_p, −b_1..−b_p*)``, the readouts.  The moment
kinds are defined in :mod:`symquad.symbolic.moments`; how they combine into the
ODE is the generated assembly (:mod:`symquad._generated.assembly`), not this
module.  Costs: ``O(p² n²)`` for ``B``, ``O(p n²)`` for ``G``, ``O(n²)`` for
``R`` and the risk (``n = p + p*``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy

__all__ = ["Plan", "combine", "weights", "moments", "risk", "BLOCK_ELEMENTS"]

#: Elements of one block of the 4-point contraction (~1 MB: a block's tables
#: stay in cache; measured 15-25 % faster at p = 64-128 than 32 MB blocks).
BLOCK_ELEMENTS = 1 << 17


class Plan(NamedTuple):
    """The tables of one generated tensor module (see ``tensor_render.tensor_plan``)."""

    degree: int
    risk: tuple
    noise: tuple
    i3_direct: tuple
    i3_through: tuple
    i4: tuple
    phi: Callable


def combine(Q, rho, T):
    """Combined covariance ``C = [[Q, ρ], [ρᵀ, T]]`` (..., n, n) and the student width ``p``."""
    Q = numpy.asarray(Q, dtype=float)
    rho = numpy.asarray(rho, dtype=float)
    T = numpy.asarray(T, dtype=float)
    batch = numpy.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2])
    p, k = rho.shape[-2], rho.shape[-1]
    C = numpy.empty(batch + (p + k, p + k))
    C[..., :p, :p] = Q
    C[..., :p, p:] = rho
    C[..., p:, :p] = numpy.swapaxes(rho, -1, -2)
    C[..., p:, p:] = T
    return C, p


def weights(a, b, dtype=float):
    """Output weights ``w = (a, −b)`` of the clean error ``Σ_a w_a σ_a(u_a)``; shape (..., n)."""
    a = numpy.asarray(a, dtype=dtype)
    b = numpy.asarray(b, dtype=dtype)
    batch = numpy.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return numpy.concatenate([numpy.broadcast_to(a, batch + a.shape[-1:]),
                              numpy.broadcast_to(-b, batch + b.shape[-1:])], axis=-1)


def _hadamard_powers(C, top):
    """[C^∘j / j! for j = 0..top]."""
    out = [numpy.ones_like(C)]
    for j in range(1, top + 1):
        out.append(out[-1] * C * (1.0 / j))
    return out


def _vertex_tables(plan, C, w, p):
    """``v_j = φ_j(D) w`` over all fields and ``φ_j(D_k)`` over the students (None: ≡ 0)."""
    D = numpy.diagonal(C, axis1=-2, axis2=-1)
    phi = plan.phi(D, p)
    v = [None if f is None else f * w for f in phi]
    phik = [None if f is None else f[..., :p] for f in phi]
    return v, phik


def risk(plan: Plan, Q, rho, T, a, b):
    """Population risk ``ε = ½ Σ_ab w_a w_b I_2(a, b)``; shape (...,).

    Near zero risk the student (``w > 0``) and teacher (``w < 0``) terms cancel to
    the size of ``ε`` itself, so this ``O(n²)`` sum runs in ``numpy.longdouble``
    (64-bit mantissa on x86-64; plain float64 where the platform has no wider
    type): pass the readouts in that precision (``a``, ``b`` as longdouble
    arrays formed from exact rationals) to keep the cancellation exact.
    """
    C, p = combine(Q, rho, T)
    C = C.astype(numpy.longdouble)
    w = weights(a, b, numpy.longdouble)
    v, _ = _vertex_tables(plan, C, w, p)
    Cp = _hadamard_powers(C, max(plan.risk))
    total = numpy.zeros(numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1]),
                        dtype=numpy.longdouble)
    for eps in plan.risk:
        total = total + numpy.einsum("...a,...ab,...b->...", v[eps], Cp[eps], v[eps])
    return (0.5 * total).astype(float)


def _three_point(plan, C, Cp, v, phik, p, batch, legs=None):
    """``G_kj = Σ_a w_a I_3(k, j, a)`` for students k and all fields j; (..., p, n).

    The field ``u_j`` enters ``I_3(k, j, a) = E[σ'(u_k) u_j σ(u_a)]`` linearly, only through
    its covariances ``C_jk`` (the *direct* terms) and ``C_ja`` (the terms *through* ``a``):
    ``I_3 = C_jk E[σ''(u_k) σ(u_a)] + C_ja E[σ'(u_k) σ'(u_a)]`` (Stein's lemma).  With `legs`
    (..., n, m), the covariances of ``m`` further Gaussian variables with the ``n`` fields,
    those replace the columns of ``C``: the result (..., p, m) is ``E[σ'(λ_k) μ_j δ]`` for
    the legs ``μ_j`` (the block fields of an input spectrum, :mod:`symquad.symbolic.blocks`).
    """
    right = C if legs is None else legs
    G = numpy.zeros(batch + (p, right.shape[-1]))
    for mu, jk, ja in plan.i3_direct:
        s = phik[jk] * numpy.einsum("...ka,...a->...k", Cp[mu][..., :p, :], v[ja])
        G += s[..., :, None] * right[..., :p, :]
    for mu, jk, ja in plan.i3_through:
        G += phik[jk][..., :, None] * ((Cp[mu][..., :p, :] * v[ja][..., None, :]) @ right)
    return G


def _four_point(plan, C, Cp, v, phik, p, batch):
    """``Σ_ab w_a w_b I_4(k, l, a, b)``; (..., p, p).  See :mod:`symquad.codegen.tensor_render`."""
    n = C.shape[-1]
    size = 1
    for d in batch:
        size *= d
    S = [c[..., :p, :] for c in Cp]
    pair_sums = {}

    def pair(s, t, eps_terms):
        key = (s, t)
        if key not in pair_sums:
            acc = numpy.zeros(batch + (n, n))
            for eps, ja, jb in eps_terms:
                acc += Cp[eps] * v[ja][..., :, None] * v[jb][..., None, :]
            pair_sums[key] = acc
        return pair_sums[key]

    B = numpy.zeros(batch + (p, p))
    for mu, keys in plan.i4:
        K = len(keys)
        block = max(1, min(n, BLOCK_ELEMENTS // max(1, size * p * K * n)))
        R = numpy.zeros(batch + (p, p))
        E = numpy.empty(batch + (p, K, block, n))
        H = numpy.empty(batch + (p, K, block, n))
        scratch = numpy.empty(batch + (p, block, n))
        for a0 in range(0, n, block):
            sl = slice(a0, min(n, a0 + block))
            m = sl.stop - a0
            if m < block:
                E, H, scratch = E[..., :m, :], H[..., :m, :], scratch[..., :m, :]
            H[...] = 0.0
            for i, (alpha, beta, weight, jk, inner) in enumerate(keys):
                left = weight * phik[jk][..., :, None]
                if alpha:
                    left = left * S[alpha][..., :, sl]
                Ei = E[..., i, :, :]
                if beta:
                    numpy.multiply(left[..., :, :, None], S[beta][..., :, None, :], out=Ei)
                else:
                    Ei[...] = left[..., :, :, None]
                Hi = H[..., i, :, :]
                for gamma, delta, jl, eps_terms in inner:
                    Gp = pair(alpha + gamma, beta + delta, eps_terms)[..., None, sl, :]
                    coef = phik[jl][..., :, None]
                    if gamma:
                        coef = coef * S[gamma][..., :, sl]
                    if delta:
                        numpy.multiply(S[delta][..., :, None, :], Gp, out=scratch)
                        scratch *= coef[..., :, :, None]
                    else:
                        numpy.multiply(coef[..., :, :, None], Gp, out=scratch)
                    Hi += scratch
            flat = batch + (p, K * m * n)
            R += (numpy.ascontiguousarray(E).reshape(flat)
                  @ numpy.swapaxes(numpy.ascontiguousarray(H).reshape(flat), -1, -2))
        B += Cp[mu][..., :p, :p] * R
    return B


def _readout_moment(plan, Cp, v, phik, p):
    """``R_k = Σ_a w_a I_2(k, a) = Σ_ε φ_ε(D_k) Σ_a (C^∘ε/ε!)_ka φ_ε(D_a) w_a``; (..., p)."""
    R = 0.0
    for eps in plan.risk:
        R = R + phik[eps] * numpy.einsum("...ka,...a->...k", Cp[eps][..., :p, :], v[eps])
    return R


def moments(plan: Plan, Q, rho, T, a, b, Delta, readout=False, legs=None):
    """The moment kinds ``(G, Gt, B, R)`` at ``(Q, ρ, T)`` with readouts ``a``, ``b``.

    Returns ``G`` (..., p, p) and ``Gt`` (..., p, p*) — the student and
    teacher columns of ``Σ_a w_a I_3(k, j, a)`` — ``B`` (..., p, p) and ``R``
    (..., p), or None unless `readout`.  With `legs` (..., n, m) (covariances of
    further Gaussian variables with the fields, :func:`_three_point`) the first
    two are ``E[σ'(λ_k) μ_j δ]`` (..., p, m) for those legs and None.
    """
    C, p = combine(Q, rho, T)
    w = weights(a, b)
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    v, phik = _vertex_tables(plan, C, w, p)
    Cp = _hadamard_powers(C, plan.degree)
    G = _three_point(plan, C, Cp, v, phik, p, batch, legs)
    B = _four_point(plan, C, Cp, v, phik, p, batch)
    for eps in plan.noise:
        B = B + Delta * (Cp[eps][..., :p, :p] * phik[eps + 1][..., :, None]
                         * phik[eps + 1][..., None, :])
    R = _readout_moment(plan, Cp, v, phik, p) if readout else None
    if legs is not None:
        return G, None, B, R
    return G[..., :, :p], G[..., :, p:], B, R
