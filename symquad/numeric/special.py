r"""Quadrature kernel for the four-point function of a ReLU student.

``I_4(k,l,a,b) = E[1{u_k>0} 1{u_l>0} σ_a(u_a) σ_b(u_b)]`` with ``σ_a, σ_b`` ReLU or
``erf(z/√2)`` has no elementary closed form (it contains a four-variate
Gaussian orthant probability, see :mod:`symquad.symbolic.special`).  This
module evaluates it as a one-dimensional integral with fixed Gauss–Legendre
nodes: arrays of covariance entries in, an array out, deterministic, and
numerically stable on the whole positive semi-definite cone (coincident and
nearly collinear fields included).  The loops are compiled with numba
(``cache=True``; the first call in a fresh checkout compiles them).

**The polar reduction.**  Whiten the student pair, ``(u_k, u_l) = L x`` with
``L`` the Cholesky factor of their 2×2 covariance and ``x ~ N(0, I_2)``, and
regress the other two fields on ``x``: ``u_a = c_a·x + s_a``, ``u_b = c_b·x +
s_b`` with ``(s_a, s_b) ~ N(0, S)`` independent of ``x`` (``S`` the
conditional covariance of ``(u_a, u_b)`` given ``(u_k, u_l)``).  In polar
coordinates ``x = r(cos φ, sin φ)`` the two indicators select the arc
``φ ∈ (ψ − π/2, π/2)``, ``ψ = arccos ρ_kl``, and since
``∫_0^∞ r e^{−r²/2} h(r) dr = √(2π) E[relu(X) h(X)]`` for ``X ~ N(0,1)``,

.. math::

   I_4 = \frac{1}{\sqrt{2π}} \int_{ψ-π/2}^{π/2} K(φ)\, dφ, \qquad
   K(φ) = E[\mathrm{relu}(X)\, σ_a(α X + s_a)\, σ_b(β X + s_b)],

with ``α = c_a·e_φ``, ``β = c_b·e_φ``.  ``K`` is a trivariate expectation and
closes (:func:`inner_relu_relu`, :func:`inner_relu_erf`,
:func:`inner_erf_erf`; erf enters through ``erf(A/√2) = E[sgn(A − Z)]``,
``Z ~ N(0,1)`` independent, which adds 1 to the variance of ``s``).

**Stability.**  The textbook (Tallis) form of ``K`` for three ReLUs contains
partial correlations that become ``0/0`` when ``s_a`` or ``s_b`` is small (a
field close to the student plane: at convergence every teacher is, and at
``a = k`` it lies in it), with O(1) coefficients that cancel.
:func:`inner_relu_relu` instead writes ``K`` through the sides of the
spherical orthant triangle, each side the half-sum of two solid angles of the
signed face normals, each solid angle by the Van Oosterom–Strackee formula
``Ω = 2 atan2(√det R, 1 ± ρ_12 ± ρ_13 ± ρ_23)`` (pairwise correlations only),
and uses the identity ``Ω_0 + Ω_X + Ω_A + Ω_B = 2π`` to drop the worst
conditioned one.  Exactly singular ``S`` (coincident indices, rank-2 or rank-3
covariances) is evaluated to rounding.

**Quadrature.**  ``K`` is analytic on the arc except near the complex zeros of
``α² + S_aa``, ``β² + S_bb`` (ReLU fields) and ``C_AAC_BB − C_AB²`` (both
ReLU); each is ``n_0 + R cos 2(φ − φ_0)``, with zeros at real part
``φ_0 + π/2`` (mod π) and imaginary part ``asinh(√((n_0 − R)/2R))``.  A zero
whose Bernstein ellipse parameter with respect to the arc is below
:data:`RHO_SPLIT` splits the arc at its real part (the singular limit has a
kink there).  A panel whose ends are farther than its length from every such
zero gets :data:`PLAIN_NODES` Gauss–Legendre nodes; otherwise each half panel
is mapped by ``φ = e ± d sinh(t)`` (Elliott & Johnston's sinh
transformation), ``d`` the distance from the end ``e`` to the nearest zero
(floored at :data:`D_FLOOR` × the half panel: a closer layer is below the
stated accuracy), with :data:`SINH_NODES` nodes.

**Accuracy and cost** (tests/test_special.py, benchmarks/bench_special.py):
absolute error ≤ 1e-10 (in units of ``√(C_aa C_bb)`` for ReLU, 1 for erf)
against a 30-digit adaptive evaluation of the same integral, over random,
rank-2, rank-3, nearly collinear and exactly coincident covariances.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from ..kernel_files import (GENERATED_DIR, KernelFileError, atomic_write, cache_dir,
                            load_module_file)
from ..spec import NAMED_ACTIVATIONS, activation_key, activation_tag, special_module_name

__all__ = ["relu_four_point", "relu_four_point_sums", "relu_four_point_grid", "inner_relu_relu",
           "inner_relu_erf", "inner_erf_erf", "inner_coincident_relu", "inner_coincident_erf",
           "inner_square_relu",
           "NAMED_ACTIVATIONS", "activation_key", "special_module_name", "SpecialKernels",
           "special_kernels", "FUNCTIONS",
           "PLAIN_NODES", "SINH_NODES", "D_FLOOR", "RHO_SPLIT", "PLAIN_TOL", "PLAIN_MARGIN",
           "ACTIVATION_PAIRS"]

#: Gauss–Legendre nodes of a panel far from every near-real singularity.
PLAIN_NODES = 14
#: Gauss–Legendre nodes of each sinh-mapped half panel.  (20 until December 2026: up to
#: 2.5e-10 in units of √(C_aa C_bb), above the stated 1e-10, where a field within 1e-4 of
#: a student sits at the end of an arc of length ≈ π, e.g. k ≈ l with a = k and b ≈ k;
#: 30 gives ≤ 1.5e-14 on those cases, tests/test_special.py.)
SINH_NODES = 30
#: Smallest sinh-map scale, relative to the half panel.
D_FLOOR = 1e-4
#: Zeros with a Bernstein ellipse parameter (w.r.t. the arc) below this split the arc.
RHO_SPLIT = 3.0
#: Target of the plain rules' error bound ρ^{−2m}, and the safety factor on ρ.
PLAIN_TOL = 1e-13
PLAIN_MARGIN = 1.5

#: (sigma_a, sigma_b) pairs the kernel evaluates, and their integer codes.
ACTIVATION_PAIRS = {("relu", "relu"): 0, ("relu", "erf"): 1, ("erf", "relu"): 2,
                    ("erf", "erf"): 3}

#: Integrand codes beyond ACTIVATION_PAIRS, used by the sums where the indices say that a
#: field coincides with a student of the pair or that ``a = b`` (:func:`_row_values`).
_COINCIDENT_RELU, _COINCIDENT_ERF, _SQUARE_RELU = 4, 5, 6

_TWO_PI = 2.0 * math.pi
_INV_SQRT_2PI = 1.0 / math.sqrt(_TWO_PI)


@njit(cache=True)
def _div(num, den):
    return num / den if den > 0.0 else 0.0


@njit(cache=True)
def inner_relu_relu(al, be, Saa, Sbb, Sab, sdet):
    r"""``E[relu(X) relu(αX + s_a) relu(βX + s_b)]``, ``(s_a, s_b) ~ N(0, S)`` ⊥ ``X ~ N(0, 1)``.

    ``sdet = √det S``.  With ``C`` the covariance of ``(X, A, B)`` (``det C =
    det S``), Stein's lemma three times gives

    .. math:: 2π\sqrt{2π}\, K = \sqrt{\det S} + \sum_i γ_i\, s_i,\qquad
              γ_i = (C_{ii}C_{jk} + C_{ij}C_{ik})/\sqrt{C_{ii}},

    ``s_i = π/2 + asin ρ_{jk·i}`` the side of the spherical triangle ``{X, A,
    B > 0}`` on the face ``v_i = 0``.  Flipping the sign of one field gives the
    neighbouring triangles, whence ``s_X = (Ω_A + Ω_B)/2``, ``s_A = (Ω_B +
    Ω_X)/2``, ``s_B = (Ω_A + Ω_X)/2`` with ``Ω_v`` the solid angle of the face
    normals after flipping ``v``, ``Ω = 2 atan2(√det S, t_0 ± t_XA ± t_XB ±
    C_AB)`` (both arguments scaled by ``√(C_AA C_BB)``).
    """
    CAA = al * al + Saa
    CBB = be * be + Sbb
    CAB = al * be + Sab
    rA = math.sqrt(CAA)
    rB = math.sqrt(CBB)
    gX = CAB + al * be
    gA = _div(CAA * be + al * CAB, rA)
    gB = _div(CBB * al + be * CAB, rB)
    t0 = rA * rB
    tXA = al * rB
    tXB = be * rA
    d0 = t0 + tXA + tXB + CAB
    dX = t0 - tXA - tXB + CAB
    dA = t0 - tXA + tXB - CAB
    dB = t0 + tXA - tXB - CAB
    cX = 0.5 * (gA + gB)
    cA = 0.5 * (gX + gB)
    cB = 0.5 * (gX + gA)
    # Σ = cX ΩX + cA ΩA + cB ΩB + λ(Ω0 + ΩX + ΩA + ΩB − 2π): λ removes the worst
    # conditioned solid angle (smallest |(√det S, d)|)
    s2 = sdet * sdet
    h0, hX, hA, hB = s2 + d0 * d0, s2 + dX * dX, s2 + dA * dA, s2 + dB * dB
    lam = 0.0
    hmin = h0
    if hX < hmin:
        lam, hmin = -cX, hX
    if hA < hmin:
        lam, hmin = -cA, hA
    if hB < hmin:
        lam, hmin = -cB, hB
    total = sdet - _TWO_PI * lam
    if lam != 0.0:
        total += 2.0 * lam * math.atan2(sdet, d0)
    if cX + lam != 0.0:
        total += 2.0 * (cX + lam) * math.atan2(sdet, dX)
    if cA + lam != 0.0:
        total += 2.0 * (cA + lam) * math.atan2(sdet, dA)
    if cB + lam != 0.0:
        total += 2.0 * (cB + lam) * math.atan2(sdet, dB)
    return total * (_INV_SQRT_2PI / _TWO_PI)


# ---- a vectorisable atan2 and the ReLU integrand built on it ------------------------------
#
# libm's atan2 is a call that LLVM cannot vectorise (numba has no SVML here): it cost ~19 ns
# of the ~55 ns of one inner_relu_relu (three of them).  The loop over the nodes of many
# (a, b) pairs in _row_values runs the same arithmetic with the polynomial atan below, which
# LLVM vectorises (measured 1.8 ns per atan2, 11 ns per integrand, AVX-512, one core).

#: atan(r) = r + r t P(t), t = r², |r| ≤ tan(π/8): the coefficients of P (degree 10),
#: interpolating (atan √t − √t)/(t √t) at the 11 Chebyshev points of [0, tan²(π/8)] in
#: 50-digit arithmetic (mpmath) and rounded to float64; the interpolation error is 7e-18
#: relative to atan (tests/test_special.py::test_polynomial_atan2_coefficients_and_accuracy
#: recomputes them and checks ≤ 2 ulp against libm and mpmath).
_ATAN_P = (-0.3333333333333333, 0.1999999999999552, -0.14285714284666542, 0.11111111015256361,
           -0.09090904578123903, 0.07692183190826087, -0.06664511447381948, 0.0585814891280221,
           -0.0508544973794026, 0.03923165829558719, -0.01917688711906226)
(_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9, _P10) = _ATAN_P
_TAN_PI_8 = math.tan(math.pi / 8)


@njit(cache=True, inline="always")
def atan2_upper(y, x):
    """``atan2(y, x)`` for ``y ≥ 0`` without branches or calls (vectorisable), ≤ 2 ulp.

    With ``u = min(y, |x|)``, ``v = max(y, |x|)``: ``atan(u/v)`` by the polynomial
    :data:`_ATAN_P` on ``r = u/v`` (``u ≤ tan(π/8) v``) or on ``r = (u − v)/(u + v)`` plus
    ``π/4`` (one division either way), then ``π/2 − ·`` if ``y > |x|`` and ``π − ·`` for
    ``x < 0`` or ``x = −0`` (libm's signed-zero convention: ``atan2(0, −0) = π``).
    """
    ax = abs(x)
    swap = y > ax
    u = ax if swap else y
    v = y if swap else ax
    big = u > _TAN_PI_8 * v
    top = u - v if big else u
    bot = u + v if big else v
    r = top / bot if bot > 0.0 else 0.0
    t = r * r
    p = _P10
    p = p * t + _P9
    p = p * t + _P8
    p = p * t + _P7
    p = p * t + _P6
    p = p * t + _P5
    p = p * t + _P4
    p = p * t + _P3
    p = p * t + _P2
    p = p * t + _P1
    p = p * t + _P0
    a = r + r * t * p
    a = a + 0.25 * math.pi if big else a
    a = 0.5 * math.pi - a if swap else a
    negative = x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0)
    return math.pi - a if negative else a


@njit(cache=True, inline="always")
def _inner_relu_relu_simd(al, be, Saa, Sbb, Sab, sdet):
    """:func:`inner_relu_relu` in straight-line form (all four solid angles, the dropped
    one with coefficient 0) with :func:`atan2_upper`: vectorisable over elements."""
    CAA = al * al + Saa
    CBB = be * be + Sbb
    CAB = al * be + Sab
    rA = math.sqrt(CAA)
    rB = math.sqrt(CBB)
    gX = CAB + al * be
    gA = (CAA * be + al * CAB) / rA if rA > 0.0 else 0.0
    gB = (CBB * al + be * CAB) / rB if rB > 0.0 else 0.0
    t0 = rA * rB
    tXA = al * rB
    tXB = be * rA
    d0 = t0 + tXA + tXB + CAB
    dX = t0 - tXA - tXB + CAB
    dA = t0 - tXA + tXB - CAB
    dB = t0 + tXA - tXB - CAB
    cX = 0.5 * (gA + gB)
    cA = 0.5 * (gX + gB)
    cB = 0.5 * (gX + gA)
    s2 = sdet * sdet
    hX, hA, hB = s2 + dX * dX, s2 + dA * dA, s2 + dB * dB
    # λ removes the worst conditioned solid angle, as in inner_relu_relu (same ties)
    hmin = s2 + d0 * d0
    lam = 0.0
    lam = -cX if hX < hmin else lam
    hmin = hX if hX < hmin else hmin
    lam = -cA if hA < hmin else lam
    hmin = hA if hA < hmin else hmin
    lam = -cB if hB < hmin else lam
    total = sdet - _TWO_PI * lam
    total += 2.0 * lam * atan2_upper(sdet, d0)
    total += 2.0 * (cX + lam) * atan2_upper(sdet, dX)
    total += 2.0 * (cA + lam) * atan2_upper(sdet, dA)
    total += 2.0 * (cB + lam) * atan2_upper(sdet, dB)
    return total * (_INV_SQRT_2PI / _TWO_PI)


@njit(cache=True)
def _orthant2(v1, c, v2):
    """P(y1 > 0, y2 > 0) for a centred pair with variances v1, v2 and covariance c."""
    den = math.sqrt(v1 * v2)
    r = c / den if den > 0.0 else 0.0
    r = min(1.0, max(-1.0, r))
    return 0.25 + math.asin(r) / _TWO_PI


@njit(cache=True)
def inner_erf_erf(al, be, Saa, Sbb, Sab):
    r"""``E[relu(X) erf(A/√2) erf(B/√2)]`` with ``A = αX + s_a``, ``B = βX + s_b``.

    ``erf(A/√2) = E[sgn(A')]``, ``A' = A − Z_1``: ``K = 4M_2 − 2M_A − 2M_B +
    E[relu X]`` with ``M_2 = E[X1{X,A',B'>0}]``, ``M_A = E[X1{X,A'>0}]``; Stein
    on ``X``: ``M_2 = φ(0)P_2(A',B'|X) + α φ_{A'}(0) P_2(X,B'|A') + β
    φ_{B'}(0) P_2(X,A'|B')``, ``M_A = (1 + α/√C_{A'A'})/(2√(2π))``.  Every
    conditional variance is bounded below (the noise of ``A'`` has variance
    ``S_aa + 1``): well conditioned.
    """
    Va = Saa + 1.0
    Vb = Sbb + 1.0
    CAA = al * al + Va
    CBB = be * be + Vb
    CAB = al * be + Sab
    qq = max(CAA * CBB - CAB * CAB, 0.0)
    M2 = _INV_SQRT_2PI * _orthant2(Va, Sab, Vb)
    M2 += al / math.sqrt(_TWO_PI * CAA) * _orthant2(Va, be * Va - al * Sab, qq)
    M2 += be / math.sqrt(_TWO_PI * CBB) * _orthant2(Vb, al * Vb - be * Sab, qq)
    MA = (1.0 + al / math.sqrt(CAA)) * (0.5 * _INV_SQRT_2PI)
    MB = (1.0 + be / math.sqrt(CBB)) * (0.5 * _INV_SQRT_2PI)
    return 4.0 * M2 - 2.0 * MA - 2.0 * MB + _INV_SQRT_2PI


@njit(cache=True)
def inner_relu_erf(al, be, Saa, Sbb, Sab):
    r"""``E[relu(X) relu(A) erf(B/√2)]`` with ``A = αX + s_a``, ``B = βX + s_b``.

    ``= 2E[XA 1{X,A,B'>0}] − E[relu(X) relu(A)]`` with ``B' = B − Z``; Stein on
    ``X``: ``E[XA1{X,A,B'>0}] = φ(0)E[s_a 1{s_a, B'>0}|X=0] + α P_3(X,A,B') +
    β φ_{B'}(0) E[A 1{X,A>0} | B'=0]``.  Only pairwise correlations and
    conditional laws given ``X`` or ``B'`` appear (stable as ``S_aa → 0``).
    """
    Vb = Sbb + 1.0
    CAA = al * al + Saa
    CBB = be * be + Vb
    CAB = al * be + Sab
    sa = math.sqrt(Saa)
    asin_xa = math.atan2(al, sa)                       # asin corr(X, A)
    rr = (sa + al * (0.5 * math.pi + asin_xa)) / _TWO_PI  # E[relu X relu A]
    t1 = _INV_SQRT_2PI * (sa + Sab / math.sqrt(Vb)) * (0.5 * _INV_SQRT_2PI)
    asin_xb = math.asin(min(1.0, max(-1.0, be / math.sqrt(CBB))))
    rab = _div(CAB, math.sqrt(CAA * CBB))
    asin_ab = math.asin(min(1.0, max(-1.0, rab)))
    P3 = 0.125 + (asin_xa + asin_xb + asin_ab) / (2.0 * _TWO_PI)
    # the pair (X, A) given B' = 0
    vX = Vb / CBB
    vA = max(CAA - CAB * CAB / CBB, 0.0)
    cXA = al - be * CAB / CBB
    first = (math.sqrt(vA) + cXA / math.sqrt(vX)) * (0.5 * _INV_SQRT_2PI)
    t3 = be / math.sqrt(_TWO_PI * CBB) * first
    return 2.0 * (t1 + al * P3 + t3) - rr


@njit(cache=True)
def _plus_root(x, V, r):
    """``x + √(x² + V)`` with ``r = √(x² + V)``, without cancellation for ``x < 0``."""
    return x + r if x >= 0.0 else _div(V, r - x)


@njit(cache=True)
def inner_coincident_relu(al, be, V):
    r"""``E[relu(X) relu(αX) relu(βX + s)]``, ``α ≥ 0``, ``s ~ N(0, V)`` ⊥ ``X ~ N(0, 1)``.

    The integrand ``K`` of the polar quadrature when ``a`` is one of the student
    fields ``k, l`` (then ``s_a = 0`` and ``α ≥ 0`` on the arc, so ``relu(αX) =
    α relu(X)``): ``K = α M_2`` with ``M_2 = E[X² 1{X>0} relu(B)]``, ``B = βX + s``.
    Stein's lemma on ``X`` gives ``M_2 = E[1{X>0} relu(B)] + β E[X 1{X>0} 1{B>0}]``
    and ``E[Z 1{Y>0} 1{Z>0}] = (√v_Z + c_{YZ}/√v_Y)/(2√(2π))`` for a centred pair, so

    .. math:: M_2 = \frac{(β + r)^2}{2\sqrt{2π}\, r}, \qquad r = \sqrt{β^2 + V}

    (``β + r = V/(r − β)`` for ``β < 0``: no cancellation).  Elementary: one square
    root, no orthant angle.
    """
    r = math.sqrt(be * be + V)
    t = _plus_root(be, V, r)
    return al * _div(t * t, r) * (0.5 * _INV_SQRT_2PI)


@njit(cache=True)
def inner_coincident_erf(al, be, V):
    r"""``E[relu(X) relu(αX) erf(B/√2)]``, ``α ≥ 0``, ``B = βX + s``, ``s ~ N(0, V)``.

    As :func:`inner_coincident_relu` with an erf field ``b``: ``K = α M_2``,
    ``M_2 = E[X² 1{X>0} erf(B/√2)] = 2E[X² 1{X>0} 1{B'>0}] − ½`` (``erf(B/√2) =
    E[sgn(B − Z)]``, ``B' = B − Z`` of variance ``W = β² + V + 1``); Stein on ``X``:
    ``E[X² 1{X>0} 1{B'>0}] = P(X, B' > 0) + β φ_{B'}(0) E[X 1{X>0} | B' = 0]``, so

    .. math:: M_2 = \frac{1}{π}\Big[\operatorname{atan2}(β, \sqrt{V+1})
              + \frac{β\sqrt{V+1}}{W}\Big].
    """
    v1 = math.sqrt(V + 1.0)
    return al * (math.atan2(be, v1) + be * v1 / (be * be + V + 1.0)) / math.pi


@njit(cache=True)
def inner_square_relu(al, V):
    r"""``E[relu(X) relu(A)²]``, ``A = αX + s``, ``s ~ N(0, V)`` ⊥ ``X ~ N(0, 1)``.

    The integrand of the polar quadrature at ``a = b`` (both ReLU).  Stein on ``X``:
    ``E[X 1{X>0} relu(A)²] = φ(0) E[relu(s)²] + 2α E[1{X>0} relu(A)]``, with
    ``E[relu(s)²] = V/2`` and ``E[A 1{X>0} 1{A>0}] = (r + α)/(2√(2π))``, ``r = √(α² +
    V)``:

    .. math:: K = \frac{V/2 + α(α + r)}{\sqrt{2π}}.
    """
    r = math.sqrt(al * al + V)
    return (0.5 * V + al * _plus_root(al, V, r)) * _INV_SQRT_2PI


@njit(cache=True)
def _inner(kind, al, be, Saa, Sbb, Sab, sdet):
    if kind == 0:
        return inner_relu_relu(al, be, Saa, Sbb, Sab, sdet)
    if kind == 1:
        return inner_relu_erf(al, be, Saa, Sbb, Sab)
    if kind == 2:
        return inner_relu_erf(be, al, Sbb, Saa, Sab)
    if kind == 3:
        return inner_erf_erf(al, be, Saa, Sbb, Sab)
    if kind == _COINCIDENT_RELU:
        return inner_coincident_relu(al, be, Sbb)
    if kind == _COINCIDENT_ERF:
        return inner_coincident_erf(al, be, Sbb)
    return inner_square_relu(al, Saa)


@njit(cache=True)
def _bernstein(zr, zi, lo, hi):
    """Bernstein ellipse parameter of the point zr + i zi for the interval [lo, hi]."""
    mid = 0.5 * (lo + hi)
    rad = 0.5 * (hi - lo)
    if rad <= 0.0:
        return np.inf
    z = complex((zr - mid) / rad, zi / rad)
    root = (z * z - 1.0) ** 0.5
    return max(abs(z + root), abs(z - root))


@njit(cache=True)
def _one(kind, Ckk, Ckl, Cll, Cka, Ckb, Cla, Clb, Caa, Cab, Cbb, xp, wp, plain_rho, xs, ws,
         rho_split, d_floor):
    # Cholesky of the student pair, written with products of the entries so that
    # identical fields (k = l: C_kk = C_kl = C_ll) give L22 = 0 and c_2 = 0 exactly
    L11 = math.sqrt(Ckk)
    L21 = Ckl / L11
    det2 = max(Ckk * Cll - Ckl * Ckl, 0.0)
    root = math.sqrt(Ckk * det2)
    ca1 = Cka / L11
    cb1 = Ckb / L11
    ca2 = _div(Cla * Ckk - Ckl * Cka, root)
    cb2 = _div(Clb * Ckk - Ckl * Ckb, root)
    Saa = max(Caa - ca1 * ca1 - ca2 * ca2, 0.0)
    Sbb = max(Cbb - cb1 * cb1 - cb2 * cb2, 0.0)
    lim = math.sqrt(Saa * Sbb)
    Sab = min(lim, max(-lim, Cab - ca1 * cb1 - ca2 * cb2))
    sdet = math.sqrt(max(Saa * Sbb - Sab * Sab, 0.0))
    lo = math.atan2(math.sqrt(det2 / Ckk), L21) - 0.5 * math.pi
    hi = 0.5 * math.pi
    # near-real complex zeros of C_AA, C_BB and C_AA C_BB − C_AB² (with the unit noise
    # variance that an erf field adds): real part (mod pi) and imaginary distance
    Ta = Saa + (0.0 if kind == 0 or kind == 1 else 1.0)
    Tb = Sbb + (0.0 if kind == 0 or kind == 2 else 1.0)
    centre = 0.5 * (lo + hi)
    halfarc = 0.5 * (hi - lo)
    r1, i1 = _zero_of_field(ca1, ca2, Ta)
    r2, i2 = _zero_of_field(cb1, cb2, Tb)
    r3, i3 = _zero_of_pair(ca1, ca2, cb1, cb2, Ta, Tb, Sab)
    r1, i1, rho1 = _classify(r1, i1, lo, hi, centre, halfarc, rho_split)
    r2, i2, rho2 = _classify(r2, i2, lo, hi, centre, halfarc, rho_split)
    r3, i3, rho3 = _classify(r3, i3, lo, hi, centre, halfarc, rho_split)
    size = _max_arc_nodes(xp, xs)
    return _quad(kind, lo, hi, ca1, ca2, cb1, cb2, Saa, Sbb, Sab, sdet, r1, i1, r2, i2, r3, i3,
                 _plain_rule_index(min(rho1, min(rho2, rho3)), plain_rho), xp, wp, xs, ws,
                 d_floor, np.empty(size), np.empty(size))[0]


@njit(cache=True)
def _arc_nodes(lo, hi, r1, i1, r2, i2, r3, i3, j_plain, xp, wp, xs, ws, d_floor, phi, wt):
    """Nodes ``φ`` and weights of the quadrature of the arc ``[lo, hi]`` into `phi`, `wt`;
    returns their number.

    ``(r_j, i_j)``: a zero's real part next to the arc and its imaginary distance, ``i_j =
    inf`` when it is far (Bernstein parameter ≥ ``rho_split``, :func:`_classify`);
    ``j_plain`` the plain rule of the whole arc when every zero is far (chosen from the
    nearest zero's Bernstein parameter, :func:`_plain_rule_index`).  Zeros inside the arc
    split it; a panel whose ends are farther than its length from every zero gets the
    largest plain rule, the others are integrated by two halves mapped by ``φ = e ± d
    sinh(t)``, ``t ∈ [0, asinh(half/d)]``, with ``len(xs)`` nodes each (``d`` the distance
    from the end ``e`` to the nearest zero, within ``[d_floor, 100]`` × the half panel).
    At most ``4 max(len(xp[0]), 2 len(xs))`` nodes.
    """
    near = 0
    s1 = s2 = s3 = hi
    if i1 < np.inf:
        near += 1
        if lo < r1 < hi:
            s1 = r1
    if i2 < np.inf:
        near += 1
        if lo < r2 < hi:
            s2 = r2
    if i3 < np.inf:
        near += 1
        if lo < r3 < hi:
            s3 = r3
    count = 0
    if near == 0:
        # one panel; the nodes of the plain rule adapt to the nearest zero
        h = hi - lo
        for i in range(xp.shape[1]):
            if wp[j_plain, i] == 0.0:
                break
            phi[count] = lo + h * xp[j_plain, i]
            wt[count] = wp[j_plain, i] * h
            count += 1
        return count
    # sort the breakpoints lo <= s_1 <= s_2 <= s_3 <= hi (those not inside sit at hi)
    if s1 > s2:
        s1, s2 = s2, s1
    if s2 > s3:
        s2, s3 = s3, s2
    if s1 > s2:
        s1, s2 = s2, s1
    last = xp.shape[0] - 1
    for p in range(4):
        if p == 0:
            a, b = lo, s1
        elif p == 1:
            a, b = s1, s2
        elif p == 2:
            a, b = s2, s3
        else:
            a, b = s3, hi
        if b <= a:
            continue
        half = 0.5 * (b - a)
        da = min(_dist(a, r1, i1), _dist(a, r2, i2), _dist(a, r3, i3))
        db = min(_dist(b, r1, i1), _dist(b, r2, i2), _dist(b, r3, i3))
        if min(da, db) >= b - a:
            h = b - a
            for i in range(xp.shape[1]):
                if wp[last, i] == 0.0:
                    break
                phi[count] = a + h * xp[last, i]
                wt[count] = wp[last, i] * h
                count += 1
            continue
        for side in range(2):
            if side == 0:
                e, sign, d = a, 1.0, min(max(da, d_floor * half), 100.0 * half)
            else:
                e, sign, d = b, -1.0, min(max(db, d_floor * half), 100.0 * half)
            U = math.asinh(half / d)
            for i in range(xs.shape[0]):
                t = U * xs[i]
                phi[count] = e + sign * d * math.sinh(t)
                wt[count] = ws[i] * math.cosh(t) * U * d
                count += 1
    return count


@njit(cache=True)
def _max_arc_nodes(xp, xs):
    return 4 * max(xp.shape[1], 2 * xs.shape[0])


@njit(cache=True)
def _quad(kind, lo, hi, ca1, ca2, cb1, cb2, Saa, Sbb, Sab, sdet, r1, i1, r2, i2, r3, i3,
          j_plain, xp, wp, xs, ws, d_floor, phi, wt):
    """``(2π)^{-1/2} ∫_lo^hi K(φ) dφ`` on the nodes of :func:`_arc_nodes` (`phi`, `wt`:
    work arrays), summed in node order; returns the value and the number of nodes."""
    count = _arc_nodes(lo, hi, r1, i1, r2, i2, r3, i3, j_plain, xp, wp, xs, ws, d_floor,
                       phi, wt)
    total = 0.0
    for i in range(count):
        c = math.cos(phi[i])
        s = math.sin(phi[i])
        total += wt[i] * _inner(kind, ca1 * c + ca2 * s, cb1 * c + cb2 * s, Saa, Sbb, Sab, sdet)
    return total * _INV_SQRT_2PI, count


@njit(cache=True)
def _rule_size(wp, j):
    """Nodes of plain rule ``j`` (zero weights pad the table)."""
    m = 0
    while m < wp.shape[1] and wp[j, m] != 0.0:
        m += 1
    return m


@njit(cache=True)
def _zero_of_field(c1, c2, T):
    """Zero of α(φ)² + T, α = c·e_φ: real part and imaginary distance (inf if none)."""
    nrm = math.hypot(c1, c2)
    if nrm > 0.0:
        return math.atan2(c2, c1) + 0.5 * math.pi, math.asinh(math.sqrt(T) / nrm)
    return 0.0, np.inf


@njit(cache=True)
def _pair_q(ca1, ca2, cb1, cb2, Ta, Tb, Sab):
    """``(N_12, h_x, q)`` of ``C_AA C_BB − C_AB² = eᵀ N e + det T``, ``N = Mᵀ adj(T) M`` (M:
    rows c_a, c_b), ``= n_0 + R cos 2(φ − φ_0)``: its zeros have real part ``φ_0 + π/2``,
    ``2φ_0 = atan2(N_12, h_x)``, and imaginary distance ``asinh q``, ``q = √((λ_min +
    det T)/(2R))`` (``q = inf``: constant, no zero)."""
    N11 = Tb * ca1 * ca1 - 2.0 * Sab * ca1 * cb1 + Ta * cb1 * cb1
    N22 = Tb * ca2 * ca2 - 2.0 * Sab * ca2 * cb2 + Ta * cb2 * cb2
    N12 = Tb * ca1 * ca2 - Sab * (ca1 * cb2 + ca2 * cb1) + Ta * cb1 * cb2
    n0 = 0.5 * (N11 + N22)
    hx = 0.5 * (N11 - N22)
    R = math.hypot(hx, N12)
    if R > 0.0:
        lam_min = _div(max(N11 * N22 - N12 * N12, 0.0), n0 + R)
        detT = max(Ta * Tb - Sab * Sab, 0.0)
        return N12, hx, math.sqrt(0.5 * (lam_min + detT) / R)
    return N12, hx, np.inf


@njit(cache=True)
def _zero_of_pair(ca1, ca2, cb1, cb2, Ta, Tb, Sab):
    """Zero of C_AA C_BB − C_AB² (:func:`_pair_q`): real part and imaginary distance."""
    N12, hx, q = _pair_q(ca1, ca2, cb1, cb2, Ta, Tb, Sab)
    if q < np.inf:
        return 0.5 * math.atan2(N12, hx) + 0.5 * math.pi, math.asinh(q)
    return 0.0, np.inf


@njit(cache=True)
def _classify(r, i, lo, hi, centre, halfarc, rho_split):
    """(real part moved next to the arc, imaginary part or inf if far, Bernstein parameter)."""
    if i == np.inf:
        return r, np.inf, np.inf
    y = i / halfarc if halfarc > 0.0 else np.inf
    bound = y + math.sqrt(1.0 + y * y)
    if bound >= rho_split:
        return r, np.inf, bound
    r -= math.pi * math.floor((r - centre) / math.pi + 0.5)
    rho = _bernstein(r, i, lo, hi)
    if rho >= rho_split:
        return r, np.inf, rho
    return r, i, rho


@njit(cache=True)
def _dist(e, r, i):
    """Distance from the real point e to the nearest of r + kπ ± i·i (inf if i is inf)."""
    if i == np.inf:
        return np.inf
    delta = abs((e - r) - math.pi * math.floor((e - r) / math.pi + 0.5))
    return math.hypot(delta, i)


@njit(cache=True)
def _plain_rule_index(rho, plain_rho):
    """Smallest plain rule whose Bernstein threshold the nearest zero exceeds."""
    for j in range(plain_rho.shape[0]):
        if rho >= plain_rho[j]:
            return j
    return plain_rho.shape[0] - 1


@njit(cache=True, parallel=True)
def _many(kind, E, xp, wp, plain_rho, xs, ws, rho_split, d_floor, out):
    # every element is computed by the same scalar code, so the result does not depend
    # on the number of threads
    for i in prange(out.shape[0]):
        out[i] = _one(kind, E[0, i], E[1, i], E[2, i], E[3, i], E[4, i], E[5, i], E[6, i],
                      E[7, i], E[8, i], E[9, i], xp, wp, plain_rho, xs, ws, rho_split, d_floor)


@njit(cache=True)
def _trig_rule_index(omega, trig_omega):
    """Smallest plain rule that integrates ``cos(Ω t + θ)`` on ``[−1, 1]`` to the plain
    tolerance for every ``Ω ≤ omega`` (thresholds from :func:`_trig_limits`)."""
    for j in range(trig_omega.shape[0]):
        if omega <= trig_omega[j]:
            return j
    return trig_omega.shape[0] - 1


@njit(cache=True)
def _far_thresholds(halfarc, plain_rho, rho_split):
    r"""Thresholds on ``q = sinh(imaginary distance)`` of a zero, for an arc of half length
    `halfarc`: entry ``j`` for the plain rule ``j`` (:func:`_plain_rules`), the last one for
    ``rho_split``.

    A zero at imaginary distance ``d`` has Bernstein parameter ``≥ y + √(1 + y²)``, ``y =
    d/halfarc`` (:func:`_classify`), and that bound is ``≥ ρ*`` iff ``y ≥ (ρ* − 1/ρ*)/2``,
    i.e. ``q ≥ sinh(halfarc (ρ* − 1/ρ*)/2)``: far zeros are classified and their rule
    chosen by comparisons, without ``asinh``, ``atan2`` or the exact parameter.
    """
    J = plain_rho.shape[0]
    out = np.empty(J + 1)
    for j in range(J):
        rr = plain_rho[j]
        out[j] = math.sinh(halfarc * 0.5 * (rr - 1.0 / rr)) if rr > 0.0 else 0.0
    out[J] = math.sinh(halfarc * 0.5 * (rho_split - 1.0 / rho_split))
    return out


@njit(cache=True)
def _far_rule(q, qthr):
    """Smallest plain rule whose threshold ``q`` reaches (:func:`_far_thresholds`)."""
    J = qthr.shape[0] - 1
    for j in range(J):
        if q >= qthr[j]:
            return j
    return J - 1


@njit(cache=True)
def _field_zero(c1, c2, T, lo, hi, centre, halfarc, rho_split, plain_rho, qthr):
    """``(r, i, j)`` of the zeros of ``α² + T``, ``α = c·e_φ``: ``i = inf`` when far, ``j``
    the plain rule they need (as :func:`_zero_of_field` with :func:`_classify`)."""
    nrm = math.hypot(c1, c2)
    if nrm == 0.0:
        return 0.0, np.inf, 0
    q = math.sqrt(T) / nrm
    if q >= qthr[qthr.shape[0] - 1]:
        return 0.0, np.inf, _far_rule(q, qthr)
    r, i = math.atan2(c2, c1) + 0.5 * math.pi, math.asinh(q)
    r, i, rho = _classify(r, i, lo, hi, centre, halfarc, rho_split)
    return r, i, _plain_rule_index(rho, plain_rho)


@njit(cache=True)
def _pair_zero(ca1, ca2, cb1, cb2, Ta, Tb, Sab, lo, hi, centre, halfarc, rho_split,
               plain_rho, qthr):
    """``(r, i, j)`` of the zeros of ``C_AA C_BB − C_AB²`` (as :func:`_zero_of_pair` with
    :func:`_classify`)."""
    N12, hx, q = _pair_q(ca1, ca2, cb1, cb2, Ta, Tb, Sab)
    if q == np.inf:
        return 0.0, np.inf, 0
    if q >= qthr[qthr.shape[0] - 1]:
        return 0.0, np.inf, _far_rule(q, qthr)
    r, i = 0.5 * math.atan2(N12, hx) + 0.5 * math.pi, math.asinh(q)
    r, i, rho = _classify(r, i, lo, hi, centre, halfarc, rho_split)
    return r, i, _plain_rule_index(rho, plain_rho)


@njit(cache=True)
def _node_table(j, lo, hi, xp, wp, cos_tab, sin_tab, have):
    """``cos φ``, ``sin φ`` at the nodes of plain rule ``j`` on ``[lo, hi]``, once per row."""
    if have[j]:
        return
    h = hi - lo
    for i in range(xp.shape[1]):
        if wp[j, i] == 0.0:
            break
        phi = lo + h * xp[j, i]
        cos_tab[j, i] = math.cos(phi)
        sin_tab[j, i] = math.sin(phi)
    have[j] = True


@njit(cache=True)
def _vector_sums(code, E, m, first, q, out):
    """``out[t] = Σ_{e ∈ pair t} E[last, e] K(E[·, e])`` (node order) for the ``q`` pairs of
    one integrand code, the ``m`` elements in one vectorised loop."""
    K = np.empty(m)
    if code == 0:
        for e in range(m):
            K[e] = E[6, e] * _inner_relu_relu_simd(E[0, e], E[1, e], E[2, e], E[3, e],
                                                   E[4, e], E[5, e])
    elif code == _COINCIDENT_RELU:
        for e in range(m):
            K[e] = E[3, e] * inner_coincident_relu(E[0, e], E[1, e], E[2, e])
    else:
        for e in range(m):
            K[e] = E[2, e] * inner_square_relu(E[0, e], E[1, e])
    for t in range(q):
        total = 0.0
        for e in range(first[t], first[t + 1]):
            total += K[e]
        out[t] = total


def _scratch(n, width, arc):
    """Work arrays of one thread for :func:`_row_values` (see there): the three flat
    streams (room for every pair's plain rule, and for at least one pair's largest arc
    rule), their pairs, the pairs' sums, and the nodes of one arc."""
    P = n * (n + 1) // 2
    return (np.empty((3, 7, max(P * width, arc))), np.empty((3, P + 1), dtype=np.int64),
            np.empty((3, P), dtype=np.int64), np.empty((3, P)), np.empty((2, arc)))


_scratch_jit = njit(cache=True)(_scratch)


@njit(cache=True)
def _row_values(kinds, C, bt, k, l, p, wrow, xp, wp, plain_rho, trig_omega, xs, ws, rho_split,
                d_floor, vals, E, first, pairs, sums, arc, counts):
    r"""``I_4(k, l, a, b)`` for every ``a ≤ b`` of batch element ``bt`` into ``vals[a, b]``
    (0 where ``wrow[a] wrow[b] = 0``: terms a weighted sum does not need), and the number
    of integrand evaluations of each into ``counts[a, b]`` if ``counts`` is ``n × n``.

    The same polar quadrature as :func:`_one`, with the work that depends on fewer
    indices done once: the student pair's factor and arc per row, each field's
    regression ``(c_1, c_2)``, conditional variance and nearest zero per field, the
    nodes' ``cos φ, sin φ`` per rule; far zeros classified by comparisons
    (:func:`_far_thresholds`); and the index coincidences used instead of detected:

    * ``a ∈ {k, l}`` (or ``b``): ``u_a`` is a student of the pair, ``s_a = 0`` and
      ``α ≥ 0`` on the arc, so the integrand is ``α M_2`` (:func:`inner_coincident_relu`,
      :func:`inner_coincident_erf`: no orthant angle).  The zeros of ``α²`` and of the
      pair determinant then lie at the arc's ends and are removable; the entire factor
      ``α`` (and ``β`` if both coincide) is a sinusoid of frequency ≤ 2 in ``φ``, which
      sets the smallest plain rule (:func:`_trig_rule_index`);
    * ``a = b``, ReLU: :func:`inner_square_relu` (no pair determinant, which vanishes
      identically and, rounded, was mistaken for a near zero);
    * ``k = l``: ``c_2 = 0`` for every field and the integrand is even in ``φ``, so the
      arc ``(−π/2, π/2)`` is folded onto ``(0, π/2)``.

    The nodes of each pair (:func:`_arc_nodes`: one plain panel, or split arcs and sinh
    maps near a zero) are those of :func:`_one`.  Pairs whose integrand is relu–relu,
    coincident ReLU or ``a = b`` ReLU put their nodes into the flat buffers ``E[stream]``
    (``first``, ``pairs``: each pair's elements and ``a·n + b``), evaluated by one
    vectorised loop per stream when full or at the end of the row (:func:`_flush`,
    :func:`_vector_sums`, :func:`atan2_upper`); erf integrands by a scalar loop.  Every
    value is a fixed sum in node order: the numbers do not depend on the other pairs, the
    rows or the threads.
    """
    n = C.shape[1]
    Ckk = C[bt, k, k]
    Ckl = C[bt, k, l]
    Cll = C[bt, l, l]
    L11 = math.sqrt(Ckk)
    L21 = Ckl / L11
    det2 = max(Ckk * Cll - Ckl * Ckl, 0.0)
    root = math.sqrt(Ckk * det2)
    L22 = math.sqrt(det2 / Ckk)
    hi = 0.5 * math.pi
    if k == l:
        lo, mult = 0.0, 2.0
    else:
        lo, mult = math.atan2(L22, L21) - 0.5 * math.pi, 1.0
    h = hi - lo
    centre = 0.5 * (lo + hi)
    halfarc = 0.5 * h
    qthr = _far_thresholds(halfarc, plain_rho, rho_split)
    j_trig = _trig_rule_index(2.0 * halfarc, trig_omega)
    width = xp.shape[1]
    cos_tab = np.empty(xp.shape)
    sin_tab = np.empty(xp.shape)
    have = np.zeros(xp.shape[0], dtype=np.bool_)
    c1 = np.empty(n)
    c2 = np.empty(n)
    S = np.empty(n)
    erf = np.empty(n, dtype=np.bool_)
    zr = np.empty(n)
    zi = np.empty(n)
    zj = np.empty(n, dtype=np.int64)
    for v in range(n):
        erf[v] = v >= p and kinds[2] == 3
        if v == k:
            c1[v], c2[v], S[v] = L11, 0.0, 0.0
        elif v == l:
            c1[v], c2[v], S[v] = L21, L22, 0.0
        else:
            c1[v] = C[bt, k, v] / L11
            c2[v] = _div(C[bt, l, v] * Ckk - Ckl * C[bt, k, v], root)
            S[v] = max(C[bt, v, v] - c1[v] * c1[v] - c2[v] * c2[v], 0.0)
        zr[v], zi[v], zj[v] = _field_zero(c1[v], c2[v], S[v] + (1.0 if erf[v] else 0.0), lo,
                                          hi, centre, halfarc, rho_split, plain_rho, qthr)
    inf = np.inf
    record = counts.shape[0] == n
    m = np.zeros(3, dtype=np.int64)      # elements per flat code (0: relu–relu, 1, 2)
    q = np.zeros(3, dtype=np.int64)      # pairs per flat code
    first[:, 0] = 0
    for a in range(n):
        a_pair = a == k or a == l
        for b in range(a, n):
            if wrow[a] * wrow[b] == 0.0:
                vals[a, b] = 0.0
                if record:
                    counts[a, b] = 0
                continue
            b_pair = b == k or b == l
            # (integrand code, flat stream or -1, plain rule, near zeros)
            r1 = r2 = r3 = 0.0
            i1 = i2 = i3 = inf
            Sab = sdet = 0.0
            if a_pair or b_pair:
                x, y = (a, b) if a_pair else (b, a)
                code = _COINCIDENT_ERF if erf[y] else _COINCIDENT_RELU
                stream = -1 if erf[y] else 1
                j = j_trig
                if not (a_pair and b_pair):
                    r2, i2 = zr[y], zi[y]
                    j = max(j, zj[y])
                ua, ub = x, y
            elif a == b and not erf[a]:
                code, stream, j = _SQUARE_RELU, 2, zj[a]
                r1, i1 = zr[a], zi[a]
                ua, ub = a, a
            else:
                if b < p:
                    code = kinds[0]
                elif a < p:
                    code = kinds[1]
                else:
                    code = kinds[2]
                stream = 0 if code == 0 else -1
                lim = math.sqrt(S[a] * S[b])
                Sab = min(lim, max(-lim, C[bt, a, b] - c1[a] * c1[b] - c2[a] * c2[b]))
                sdet = math.sqrt(max(S[a] * S[b] - Sab * Sab, 0.0))
                r3, i3, j3 = _pair_zero(c1[a], c2[a], c1[b], c2[b],
                                        S[a] + (1.0 if erf[a] else 0.0),
                                        S[b] + (1.0 if erf[b] else 0.0), Sab, lo, hi, centre,
                                        halfarc, rho_split, plain_rho, qthr)
                r1, i1, r2, i2 = zr[a], zi[a], zr[b], zi[b]
                j = max(j3, max(zj[a], zj[b]))
                ua, ub = a, b
            Saa = S[ua] if ua != k and ua != l else 0.0
            Sbb = S[ub]
            if code == _SQUARE_RELU:
                Sab = Saa
            if i1 < inf or i2 < inf or i3 < inf:
                # a near zero: split arc and sinh maps (nodes of this pair only)
                count = _arc_nodes(lo, hi, r1, i1, r2, i2, r3, i3, j, xp, wp, xs, ws, d_floor,
                                   arc[0], arc[1])
                tabled = False
            else:
                _node_table(j, lo, hi, xp, wp, cos_tab, sin_tab, have)
                count = _rule_size(wp, j)
                tabled = True
            if record:
                counts[a, b] = count
            if stream < 0:
                total = 0.0
                for i in range(count):
                    if tabled:
                        c, sn, wt = cos_tab[j, i], sin_tab[j, i], wp[j, i] * h
                    else:
                        c, sn, wt = math.cos(arc[0, i]), math.sin(arc[0, i]), arc[1, i]
                    total += wt * _inner(code, c1[ua] * c + c2[ua] * sn, c1[ub] * c + c2[ub] * sn,
                                         Saa, Sbb, Sab, sdet)
                vals[a, b] = mult * total * _INV_SQRT_2PI
                continue
            if m[stream] + count > E.shape[2]:
                _flush(stream, E, m, first, pairs, q, sums, vals, n, mult)
            e = m[stream]
            # (no array views here: each would cost a reference count)
            for i in range(count):
                if tabled:
                    c, sn, wt = cos_tab[j, i], sin_tab[j, i], wp[j, i] * h
                else:
                    c, sn, wt = math.cos(arc[0, i]), math.sin(arc[0, i]), arc[1, i]
                al = c1[ua] * c + c2[ua] * sn
                be = c1[ub] * c + c2[ub] * sn
                if stream == 0:
                    E[0, 0, e] = al
                    E[0, 1, e] = be
                    E[0, 2, e] = Saa
                    E[0, 3, e] = Sbb
                    E[0, 4, e] = Sab
                    E[0, 5, e] = sdet
                    E[0, 6, e] = wt
                elif stream == 1:
                    E[1, 0, e] = al
                    E[1, 1, e] = be
                    E[1, 2, e] = Sbb
                    E[1, 3, e] = wt
                else:
                    E[2, 0, e] = al
                    E[2, 1, e] = Saa
                    E[2, 2, e] = wt
                e += 1
            m[stream] = e
            pairs[stream, q[stream]] = a * n + b
            q[stream] += 1
            first[stream, q[stream]] = e
    for stream in range(3):
        if q[stream] > 0:
            _flush(stream, E, m, first, pairs, q, sums, vals, n, mult)


@njit(cache=True)
def _flush(stream, E, m, first, pairs, q, sums, vals, n, mult):
    """Evaluate the buffered pairs of one stream (:func:`_vector_sums`), write their values
    and empty the stream."""
    code = 0 if stream == 0 else (_COINCIDENT_RELU if stream == 1 else _SQUARE_RELU)
    _vector_sums(code, E[stream], m[stream], first[stream], q[stream], sums[stream])
    for t in range(q[stream]):
        ab = pairs[stream, t]
        vals[ab // n, ab % n] = mult * sums[stream, t] * _INV_SQRT_2PI
    m[stream] = 0
    q[stream] = 0
    first[stream, 0] = 0


@njit(cache=True)
def _row_sum(idx, kinds, C, w, p, pk, pl, xp, wp, plain_rho, trig_omega, xs, ws, rho_split,
             d_floor, vals, E, first, pairs, sums, arc):
    """``Σ_{a ≤ b} (2 − δ_ab) w_a w_b I_4(k, l, a, b)`` of row ``idx = β·P + q`` (a fixed order)."""
    n = C.shape[1]
    P = pk.shape[0]
    bt = idx // P
    _row_values(kinds, C, bt, pk[idx % P], pl[idx % P], p, w[bt], xp, wp, plain_rho,
                trig_omega, xs, ws, rho_split, d_floor, vals, E, first, pairs, sums, arc,
                np.empty((0, 0), dtype=np.int64))
    total = 0.0
    for a in range(n):
        for b in range(a, n):
            wab = w[bt, a] * w[bt, b]
            if wab == 0.0:
                continue
            if a != b:
                wab *= 2.0
            total += wab * vals[a, b]
    return total


@njit(cache=True, parallel=True)
def _pair_sums(kinds, C, w, p, pk, pl, xp, wp, plain_rho, trig_omega, xs, ws, rho_split,
               d_floor, chunks, out):
    # rows (batch element, k <= l) in `chunks` contiguous blocks, one work area per block;
    # each row's terms summed in a fixed order: the result does not depend on the threads
    n = C.shape[1]
    rows = out.shape[0]
    for c in prange(chunks):
        vals = np.empty((n, n))
        E, first, pairs, sums, arc = _scratch_jit(n, xp.shape[1], _max_arc_nodes(xp, xs))
        for idx in range(c * rows // chunks, (c + 1) * rows // chunks):
            out[idx] = _row_sum(idx, kinds, C, w, p, pk, pl, xp, wp, plain_rho, trig_omega,
                                xs, ws, rho_split, d_floor, vals, E, first, pairs, sums, arc)


@njit(cache=True)
def _pair_sums_serial(kinds, C, w, p, pk, pl, xp, wp, plain_rho, trig_omega, xs, ws,
                      rho_split, d_floor, chunks, out):
    n = C.shape[1]
    vals = np.empty((n, n))
    E, first, pairs, sums, arc = _scratch_jit(n, xp.shape[1], _max_arc_nodes(xp, xs))
    for idx in range(out.shape[0]):
        out[idx] = _row_sum(idx, kinds, C, w, p, pk, pl, xp, wp, plain_rho, trig_omega, xs,
                            ws, rho_split, d_floor, vals, E, first, pairs, sums, arc)


@njit(cache=True, parallel=True)
def _grid(kinds, C, p, pk, pl, xp, wp, plain_rho, trig_omega, xs, ws, rho_split, d_floor,
          out, counts):
    P = pk.shape[0]
    n = C.shape[1]
    ones = np.ones(n)
    for idx in prange(C.shape[0] * P):
        bt = idx // P
        E, first, pairs, sums, arc = _scratch_jit(n, xp.shape[1], _max_arc_nodes(xp, xs))
        _row_values(kinds, C, bt, pk[idx % P], pl[idx % P], p, ones, xp, wp, plain_rho,
                    trig_omega, xs, ws, rho_split, d_floor, out[bt, idx % P], E, first, pairs,
                    sums, arc, counts[bt, idx % P])


#: Below this many unique quadruples per call the sums run on one thread: waking the
#: thread pool cost ~5 ms per call on the shared 2-core machine (measured at p = 2, 4), and
#: ~10 ms at load 9.5, more than the work itself below ~10⁵ quadruples (0.2–0.4 µs each
#: since the index coincidences and vectorised loops; median of 9 calls at load 9.5,
#: parallel against serial: (4, 2) × 64 states 16 against 3.3 ms, (8, 2) × 32 states 32
#: against 24 ms, (16, 2) × 4 states 36 against 36 ms, (8, 2) × 64 states 52 against
#: 48 ms; at load 6 the last 48 against 56 ms).  20 000 when a quadruple cost ~3 µs.
#: Same numbers either way (same scalar code, same order).
PARALLEL_MIN_EVALUATIONS = 100_000


def relu_four_point_sums(C, w, p, student_teacher):
    r"""``S_kl = Σ_{a,b} w_a w_b I_4(k, l, a, b)`` for a ReLU student by the polar quadrature.

    Parameters
    ----------
    C : ndarray, shape (B, n, n)
        Combined covariances (a batch of ``B``), the first `p` fields students.
    w : ndarray, shape (B, n)
        Output weights ``(a, −b)``.
    p : int
        Number of student fields.
    student_teacher : tuple of str
        ``(σ*, )`` names: the teacher's activation, ``"relu"`` or ``"erf"``.

    Returns
    -------
    ndarray, shape (B, p, p)
        Symmetric.  Uses ``I_4(k,l,a,b) = I_4(l,k,a,b) = I_4(k,l,b,a)``: each of the
        ``p(p+1)/2 · n(n+1)/2`` unique quadruples is evaluated once; compiled loop,
        threads over the ``(batch, k ≤ l)`` elements, each summed in a fixed order.
    """
    kinds, C, pk, pl, rules = _sum_setup(C, p, student_teacher)
    w = np.ascontiguousarray(w, dtype=float)
    out = np.empty(C.shape[0] * pk.size)
    n = C.shape[1]
    parallel = out.size * n * (n + 1) // 2 >= PARALLEL_MIN_EVALUATIONS
    driver = _pair_sums if parallel else _pair_sums_serial
    chunks = min(out.size, 8 * numba.get_num_threads()) if parallel else 1
    driver(kinds, C, w, p, pk, pl, *rules, chunks, out)
    S = np.empty((C.shape[0], p, p))
    vals = out.reshape(C.shape[0], pk.size)
    S[:, pk, pl] = vals
    S[:, pl, pk] = vals
    return S


def relu_four_point_grid(C, p, student_teacher, nodes=False):
    r"""Every ``I_4(k, l, a, b)``, ``k ≤ l < p``, ``a ≤ b < n``, by the route of the sums.

    The values that :func:`relu_four_point_sums` weights and adds (index
    coincidences used, see :func:`_row_values`), for checks and benchmarks.

    Parameters
    ----------
    C : ndarray, shape (B, n, n)
        Combined covariances, the first `p` fields students.
    p : int
        Number of student fields.
    student_teacher : tuple of str
        ``(σ*, )``: the teacher's activation, ``"relu"`` or ``"erf"``.
    nodes : bool
        Also return the number of integrand evaluations of each entry.

    Returns
    -------
    values : ndarray, shape (B, p(p+1)/2, n, n)
        Row ``q`` is the pair ``numpy.triu_indices(p)[·][q]``; entries below the
        diagonal ``a > b`` are 0.
    counts : ndarray of int, same shape
        Only if `nodes`: integrand evaluations per entry (0 below the diagonal).
    """
    kinds, C, pk, pl, rules = _sum_setup(C, p, student_teacher)
    out = np.zeros((C.shape[0], pk.size, C.shape[1], C.shape[1]))
    counts = np.zeros(out.shape, dtype=np.int64)
    _grid(kinds, C, p, pk, pl, *rules, out, counts)
    return (out, counts) if nodes else out


def _sum_setup(C, p, student_teacher):
    """Integrand codes of the roles (ss, st, tt), contiguous C, the pairs k ≤ l, the rules."""
    (teacher,) = student_teacher
    kinds = np.array([ACTIVATION_PAIRS[("relu", "relu")], ACTIVATION_PAIRS[("relu", teacher)],
                      ACTIVATION_PAIRS[(teacher, teacher)]], dtype=np.int64)
    C = np.ascontiguousarray(C, dtype=float)
    pk, pl = (np.ascontiguousarray(x, dtype=np.int64) for x in np.triu_indices(p))
    return kinds, C, pk, pl, _sum_rules()


@functools.lru_cache(maxsize=1)
def _sum_rules():
    """The rules and constants of the sums' compiled loops, built once (leggauss cost
    2.4 ms per call, a fifth of a ReLU drift at (4, 2) over 64 states); read only."""
    xp, wp, plain_rho = _plain_rules()
    xs, ws = _rule(SINH_NODES)
    arrays = (xp, wp, plain_rho, _trig_limits(), xs, ws)
    for x in arrays:
        x.setflags(write=False)
    return arrays + (float(RHO_SPLIT), float(D_FLOOR))


def _rule(n):
    x, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * (x + 1.0), 0.5 * w


def _plain_rules():
    """Plain Gauss–Legendre rules with m = 4, 6, …, PLAIN_NODES nodes (zero padded) and
    the Bernstein parameter each needs: ρ^{−2m} ≤ PLAIN_TOL with ρ taken PLAIN_MARGIN
    times smaller than the nearest zero's (the integrand stays bounded there)."""
    sizes = list(range(4, PLAIN_NODES, 2)) + [PLAIN_NODES]
    xp = np.zeros((len(sizes), PLAIN_NODES))
    wp = np.zeros((len(sizes), PLAIN_NODES))
    need = np.empty(len(sizes))
    for j, m in enumerate(sizes):
        x, w = _rule(m)
        xp[j, :m], wp[j, :m] = x, w
        need[j] = PLAIN_MARGIN * PLAIN_TOL ** (-1.0 / (2 * m))
    need[-1] = 0.0     # the largest rule is the fallback
    return xp, wp, need


def _trig_limits():
    r"""Per plain rule (``m`` nodes), the largest normalised frequency ``Ω`` of a sinusoid
    ``cos(Ω t + θ)``, ``t ∈ [−1, 1]``, that it integrates to PLAIN_TOL, divided by
    PLAIN_MARGIN.

    The Gauss–Legendre remainder (Abramowitz & Stegun 25.4.30) on ``[−1, 1]`` is
    ``2^{2m+1}(m!)^4 / ((2m+1)((2m)!)^3) f^{(2m)}(ξ)`` and ``|f^{(2m)}| ≤ Ω^{2m}``; on an
    arc of half length ``h ≤ π/2`` the error is ``h`` times that.  The last rule is the
    fallback (``inf``).
    """
    sizes = list(range(4, PLAIN_NODES, 2)) + [PLAIN_NODES]
    out = np.empty(len(sizes))
    for j, m in enumerate(sizes):
        log_const = ((2 * m + 1) * math.log(2.0) + 4 * math.lgamma(m + 1)
                     - math.log(2 * m + 1) - 3 * math.lgamma(2 * m + 1))
        log_omega = (math.log(PLAIN_TOL / (0.5 * math.pi)) - log_const) / (2 * m)
        out[j] = math.exp(log_omega) / PLAIN_MARGIN
    out[-1] = np.inf
    return out


def relu_four_point(C_kk, C_kl, C_ll, C_ka, C_kb, C_la, C_lb, C_aa, C_ab, C_bb,
                    sigma_a: str = "relu", sigma_b: str = "relu"):
    r"""``I_4 = E[1{u_k>0} 1{u_l>0} σ_a(u_a) σ_b(u_b)]`` by the polar quadrature.

    Parameters
    ----------
    C_kk, C_kl, C_ll, C_ka, C_kb, C_la, C_lb, C_aa, C_ab, C_bb : array_like
        The ten covariance entries of ``(u_k, u_l, u_a, u_b)``; broadcast
        against each other.  ``k, l`` are ReLU student fields (``C_kk, C_ll >
        0``); any pattern of coincident or collinear fields is allowed (e.g.
        ``a = k``: ``C_ka = C_kk = C_aa``, ``C_la = C_kl``, ``C_ab = C_kb``).
    sigma_a, sigma_b : {"relu", "erf"}
        Activations of ``u_a`` and ``u_b`` (erf means ``erf(z/√2)``).

    Returns
    -------
    ndarray
        The broadcast shape of the inputs.

    Raises
    ------
    ValueError
        For an unknown activation, non-finite entries or a student variance
        that is not positive (``1{u > 0}`` of a zero field is undefined).
    """
    kind = ACTIVATION_PAIRS.get((sigma_a, sigma_b))
    if kind is None:
        raise ValueError(f"sigma_a and sigma_b must be 'relu' or 'erf', got {sigma_a!r}, "
                         f"{sigma_b!r}")
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in
                                   (C_kk, C_kl, C_ll, C_ka, C_kb, C_la, C_lb, C_aa, C_ab, C_bb)))
    shape = arrays[0].shape
    E = np.stack([a.reshape(-1) for a in arrays])
    if not np.isfinite(E).all():
        raise ValueError("covariance entries must be finite")
    if (E[0] <= 0).any() or (E[2] <= 0).any():
        raise ValueError("student variances C_kk and C_ll must be > 0 for a relu student")
    out = np.empty(E.shape[1])
    xp, wp, plain_rho = _plain_rules()
    xs, ws = _rule(SINH_NODES)
    _many(kind, E, xp, wp, plain_rho, xs, ws, float(RHO_SPLIT), float(D_FLOOR), out)
    return out.reshape(shape)


# ---- activation names and the kernel modules -----------------------------------------

#: The functions every kernel module provides (see :mod:`symquad.codegen.special_render`).
FUNCTIONS = ("I2_ss", "I2_st", "I2_tt", "J2", "I3_s", "I3_t", "I4_ss", "I4_st", "I4_tt")


@dataclass(frozen=True)
class SpecialKernels:
    """The 2-, 3- and 4-point kernels of one (student, teacher) activation pair.

    Attributes ``I2_ss … I4_tt`` (see :data:`FUNCTIONS` and
    :mod:`symquad.codegen.special_render` for the arguments) are numpy
    functions of covariance-entry arrays; closed forms come from the generated
    module, the ReLU-student ``I4`` without a closed form from
    :func:`relu_four_point`.  ``extras`` holds the merged / coincident forms
    the module defines (``I4_tt_kk``, ``I4_tt_aa``, ``I4_relu_kl``, …) and
    ``quadrature`` names the functions evaluated by quadrature.
    """

    student: object
    teacher: object
    module: object = field(repr=False)
    quadrature: tuple = ()

    def __getattr__(self, name):
        if name in FUNCTIONS:
            return _bound(self.module, name)
        if name.startswith(("I4_", "F4_")):
            return getattr(self.module, name)
        raise AttributeError(name)

    @property
    def folded(self) -> bool:
        """True when the module has the folded erf-student ``F4_*`` functions."""
        return hasattr(self.module, "F4_ss")

    @property
    def extras(self) -> dict:
        return {n: getattr(self.module, n) for n in dir(self.module)
                if n.startswith("I4_") and n not in FUNCTIONS}

    def __repr__(self):
        return (f"SpecialKernels(student={activation_tag(self.student)!r}, teacher={activation_tag(self.teacher)!r}"
                f", quadrature={self.quadrature})")


def _bound(module, name):
    fn = getattr(module, name, None)
    if fn is not None:
        return fn
    spec = module.QUADRATURE.get(name)
    if spec is not None:
        sa, sb = spec

        def quadrature(C_kk, C_kl, C_ll, C_ka, C_kb, C_la, C_lb, C_aa, C_ab, C_bb):
            return relu_four_point(C_kk, C_kl, C_ll, C_ka, C_kb, C_la, C_lb, C_aa, C_ab, C_bb,
                                   sigma_a=sa, sigma_b=sb)
        quadrature.__name__ = name
        quadrature.__doc__ = f"{name} by the polar quadrature (sigma_a={sa}, sigma_b={sb})"
        return quadrature
    reason = module.NOT_IMPLEMENTED[name]

    def not_implemented(*args):
        raise NotImplementedError(reason)
    return not_implemented


_SOURCES = ("symbolic/special.py", "codegen/special_render.py", "numeric/special.py")


def _version() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for rel in _SOURCES:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def special_kernels(student, teacher) -> SpecialKernels:
    """Kernels of the pair (``student``, ``teacher``): each ``"erf"``, ``"relu"`` or coefficients.

    The committed modules (``symquad/_generated/special_*.py``) are loaded
    with their checksum verified; any other pair is rendered once (SymPy) into
    the kernel cache (``$SYMQUAD_CACHE_DIR``), keyed by the pair and the
    sources of this stage, and written atomically.
    """
    student, teacher = activation_key(student), activation_key(teacher)
    name = special_module_name(student, teacher)
    required = ("I2_ss", "J2")
    committed = GENERATED_DIR / f"{name}.py"
    if committed.exists():
        module = load_module_file(committed, f"symquad._generated.{name}", required)
    else:
        path = cache_dir() / f"{name}_{_version()}.py"
        try:
            module = load_module_file(path, f"symquad_cached_{name}", required)
        except (OSError, KernelFileError):
            # lazy: sympy
            from ..codegen.special_render import render_special_module
            atomic_write(path, render_special_module(student, teacher))
            module = load_module_file(path, f"symquad_cached_{name}", required)
    return SpecialKernels(student, teacher, module, tuple(sorted(module.QUADRATURE)))
