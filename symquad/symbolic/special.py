r"""Closed forms of the 2-, 3- and 4-point functions for erf, ReLU and mixed activations.

The tensor route (:mod:`symquad.symbolic.tensor`) needs, for centred jointly
Gaussian fields ``u`` with covariance ``C``,

* ``I_2(a,b) = E[σ_a(u_a) σ_b(u_b)]``,
* ``J_2(k,l) = E[σ'(u_k) σ'(u_l)]``,
* ``I_3(k,j,a) = E[σ'(u_k)\, u_j\, σ_a(u_a)]``,
* ``I_4(k,l,a,b) = E[σ'(u_k) σ'(u_l) σ_a(u_a) σ_b(u_b)]``,

``k, l`` student fields (activation ``σ``), ``a, b`` any field (``σ`` or the
teacher's ``σ*``).  This module derives them, with SymPy, for the activations

* ``"erf"``: ``σ(z) = erf(z/√2)`` (the convention of Saad & Solla 1995 and
  Goldt et al. 2019; ``erf(z/√2) = 2Φ(z) − 1``, ``σ'(z) = √(2/π) e^{−z²/2}``),
* ``"relu"``: ``σ(z) = max(z, 0)`` (``σ' = 1{z > 0}``, ``σ'' = δ``),
* a polynomial, given as its coefficient tuple ``(c_0, …, c_d)``,

and for every pair of them.  Everything is derived from four standard facts,
each proved here once:

**Price's theorem.**  For ``u ~ N(0, C)`` and ``F`` of polynomial growth
(derivatives in the distributional sense), with ``C_ab = C_ba`` one variable,

.. math::  \frac{∂ E[F(u)]}{∂ C_{ab}} = E[∂_a ∂_b F],\qquad
           \frac{∂ E[F(u)]}{∂ C_{aa}} = \tfrac12 E[∂_a^2 F].

*Proof.*  The density ``p_C(x) ∝ det(C)^{-1/2} e^{−xᵀC^{-1}x/2}`` solves
``∂p/∂C_ab = ∂_a∂_b p`` (``a ≠ b``) and ``∂p/∂C_aa = ½∂_a² p`` (both sides
are the Fourier transforms of ``−k_a k_b e^{−kᵀCk/2}`` and
``−½k_a² e^{−kᵀCk/2}``); integrating by parts twice moves the derivatives
onto ``F``.  ∎  (Non-singular ``C``; the closed forms below extend to the
boundary of the cone by continuity, which is checked numerically.)

**Stein's lemma.**  ``E[u_j F(u)] = Σ_i C_{ji} E[∂_i F(u)]`` for every
centred Gaussian vector (singular or not) and ``F`` absolutely continuous of
polynomial growth.  *Proof.*  Write ``u = Lz``, ``z ~ N(0, I)``, ``C = LLᵀ``;
one-dimensional integration by parts gives ``E[z_r G(z)] = E[∂_{z_r} G]``, so
``E[u_j F] = Σ_r L_{jr} E[Σ_i L_{ir} ∂_i F] = Σ_i C_{ji} E[∂_i F]``.  ∎

**Gaussian folding.**  For a subset ``F`` of the coordinates and ``G`` of the
others,

.. math::  E\big[e^{−\frac12 \sum_{i∈F} u_i^2}\, G(u_R)\big]
           = \det(I + C_{FF})^{−1/2}\, E_{u_R ∼ N(0, C')}[G],\qquad
           C' = C_{RR} − C_{RF}(I + C_{FF})^{-1}C_{FR},

for every positive semi-definite ``C`` (singular included).  *Proof.*  With
``u = Lz`` and ``B = S_Fᵀ L`` (the rows of ``L`` in ``F``), the weight is
``e^{−zᵀBᵀBz/2}``; completing the square, ``z`` becomes ``N(0, (I + BᵀB)^{-1})``
with normalisation ``det(I + BᵀB)^{-1/2} = det(I + BBᵀ)^{-1/2} = det(I +
C_{FF})^{-1/2}``, and by Woodbury ``L(I + BᵀB)^{-1}Lᵀ = C − C_{·F}(I +
C_{FF})^{-1}C_{F·}``.  ∎  Since ``erf'(z/√2)·(d/dz)`` is the Gaussian weight
``√(2/π) e^{−z²/2}``, every ``σ' = erf'`` vertex folds away.

**Finite Price expansion.**  If ``g`` is a polynomial of degree ``d``,
``E[f(x) g(y)] = Σ_{m ≤ d} C_{xy}^m/m!\, φ^f_m(C_{xx}) φ^g_m(C_{yy})`` with the
vertex functions ``φ^f_m(D) = E[f^{(m)}(x)]``, ``x ~ N(0, D)``, for any ``f`` of
polynomial growth.  *Proof.*  By Price's theorem the ``(d+1)``-th ``C_xy``-
derivative of the left side is ``E[f^{(d+1)} g^{(d+1)}] = 0``, so it is a
polynomial in ``C_xy`` of degree ``d`` whose Taylor coefficients at
``C_xy = 0`` (independent fields) are ``E[f^{(m)}]E[g^{(m)}]/m!``.  ∎  More
generally (the multigraph expansion of :mod:`symquad.symbolic.tensor` with a
non-polynomial *core*): ``E[∏_v f_v(u_v)]`` where the non-polynomial vertices
form a core ``K`` equals the finite sum over edge multiplicities of the edges
that touch a polynomial vertex of ``∏ C_e^{m_e}/m_e! ∏_{v∉K} φ^{f_v}_{d_v}
× E_{C_KK}[∏_{v∈K} f_v^{(d_v)}]`` (the operator ``exp(½∂ᵀC∂)`` splits into the
commuting core part and the finite edge part).

**Vertex functions** come from the mean shift: ``φ^f_m(D) = ∂_μ^m E[f(x +
μ)]|_{μ=0}`` with ``E[erf((x+μ)/√2)] = erf(μ/√(2(1+D)))`` (fold with an
independent standard normal: ``erf((x+μ)/√2) = 2P(Z < x + μ) − 1``) and
``E[relu(x+μ)] = μΦ(μ/√D) + √D φ(μ/√D)``.

What closes (see :func:`closure_table`):

* ``I_2``: every pair.  erf–erf: ``(2/π) asin(C_ab/√((1+C_aa)(1+C_bb)))``
  (Price in ``C_ab`` + fold); relu–relu: the arc-cosine kernel (Price in
  ``C_ab`` + Sheppard's orthant ``¼ + asin(ρ)/(2π)``); erf–relu:
  ``C_ab/√(2π(1+C_aa))`` (the fold of ``erf'`` leaves ``E[1{u_b > 0}] = ½``);
  anything with a polynomial: the finite Price expansion.
* ``J_2 = ∂I_2/∂C_kl`` and ``I_3(k,j,a) = 2C_kj ∂I_2(k,a)/∂C_kk + C_ja
  ∂I_2(k,a)/∂C_ka`` (Stein on ``u_j``, then Price): every pair.
* ``I_4`` with an erf student: every teacher — folding both ``σ'`` leaves
  ``(2/π) Λ^{-1/2} I_2^{σ_a σ_b}(C')`` with ``Λ = det(I + C_{kl})``.
* ``I_4`` with a polynomial student: every teacher — the core is the
  non-polynomial teacher fields, whose derivative 2-point functions
  ``E[f^{(m)} g^{(n)}]`` follow from ``I_2`` and ``E[f' g]`` by Price.
* ``I_4`` with a ReLU student: closed when both ``σ_a, σ_b`` are polynomials
  (core ``{k, l}``, two step functions).  When both are ReLU or both erf it
  contains a four-variate orthant probability ``P(v_1..v_4 > 0)`` (for erf,
  of the fields shifted by independent normals), which has no elementary
  form: Price in the cross covariances reduces its derivatives to trivariate
  orthants, but the integration constant is the orthant itself.  It is given
  as a one-dimensional quadrature (:mod:`symquad.numeric.special`), and the
  coincident-index cases, which involve at most three distinct fields, close
  (:func:`relu_four_point_coincident`).

Coincident indices.  The tensor route evaluates the functions on the full
index range, so ``a = k`` etc. give singular covariances (``C_ka = C_kk =
C_aa``).  Every closed form here for erf is a continuous function on the whole
positive semi-definite cone (the fold keeps ``1 + C`` away from zero), so
coincident indices need no special case.  The ReLU ``I_2, J_2, I_3`` are
continuous too (they contain ``√(C_aaC_bb − C_ab²)`` and ``asin`` of
correlations, clamped to their ranges in the kernels).  For a polynomial
student with ReLU teachers the teacher core ``E[relu^{(m)} relu^{(n)}]``
diverges at ``a = b`` (``E[δ(x)δ(x)]``): there the merged vertex
``relu²`` is used (:func:`four_point_merged_teacher`).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb, factorial

import sympy as sp

from ..spec import NAMED_ACTIVATIONS, activation_key

__all__ = [
    "NAMED_ACTIVATIONS", "activation_key", "activation_label", "MU", "VARIANCE",
    "cov_symbols", "canonical_arguments", "INDEX_ORDER", "mean_shift", "vertex_function", "orthant_2", "orthant_3",
    "gaussian_fold", "atan2_form", "two_point", "two_point_odd", "two_point_derivative",
    "noise_two_point", "three_point", "four_point", "four_point_merged_teacher",
    "four_point_merged_student",
    "relu_four_point_coincident", "closure_table", "NotClosedError",
    "RELU_COINCIDENT_PATTERNS", "FOLD_SYMBOLS", "fold_definitions", "four_point_folded",
]

#: Mean shift ``μ`` and variance ``D`` of a single vertex field.
MU = sp.Symbol("mu", real=True)
VARIANCE = sp.Symbol("D", positive=True)


class NotClosedError(ValueError):
    """Raised for a function that has no closed form for the given activations."""


# ---- activations ---------------------------------------------------------------------

def activation_label(act) -> str:
    """Readable name: ``"erf(z/√2)"``, ``"relu(z)"`` or the polynomial."""
    act = activation_key(act)
    if act == "erf":
        return "erf(z/√2)"
    if act == "relu":
        return "relu(z)"
    z = sp.Symbol("z")
    return str(sum(sp.Rational(c.numerator, c.denominator) * z**i for i, c in enumerate(act)))


def _is_poly(act) -> bool:
    return isinstance(act, tuple)


def _poly_degree(act) -> int:
    return len(act) - 1


def _rational(c: Fraction) -> sp.Rational:
    return sp.Rational(c.numerator, c.denominator)


#: Canonical order of the index names in symbol names (``C_kl``, never ``C_lk``).
INDEX_ORDER = "kljab"


def _pair_name(v: str, w: str) -> str:
    if v in INDEX_ORDER and w in INDEX_ORDER and INDEX_ORDER.index(w) < INDEX_ORDER.index(v):
        v, w = w, v
    return f"C_{v}{w}"


def cov_symbols(*names: str) -> dict:
    """``{(v, w): Symbol("C_vw")}`` for every pair of the given vertex names.

    Variances are positive, covariances real; both orders of a pair map to the
    same symbol, named in the order ``k, l, j, a, b`` (:data:`INDEX_ORDER`).
    """
    out = {}
    for i, v in enumerate(names):
        for w in names[i:]:
            name = _pair_name(v, w)
            s = sp.Symbol(name, positive=True) if v == w else sp.Symbol(name, real=True)
            out[(v, w)] = out[(w, v)] = s
    return out


def canonical_arguments(expr) -> tuple:
    """Names of the covariance symbols of ``expr``, ordered as ``C_kk, C_kl, C_ll, C_kj, …``.

    The order is row-major over the vertices ``k, l, j, a, b`` (upper triangle),
    the order of the kernels' arguments.
    """
    order = {}
    for i, v in enumerate(INDEX_ORDER):
        for w in INDEX_ORDER[i:]:
            order[f"C_{v}{w}"] = len(order)
    names = [s.name for s in expr.free_symbols]
    unknown = [n for n in names if n not in order]
    if unknown:
        raise ValueError(f"not covariance symbols of k, l, j, a, b: {unknown}")
    return tuple(sorted(names, key=order.__getitem__))


# ---- one-point building blocks -------------------------------------------------------

def _std_cdf(z):
    return (1 + sp.erf(z / sp.sqrt(2))) / 2


def _std_pdf(z):
    return sp.exp(-z**2 / 2) / sp.sqrt(2 * sp.pi)


@lru_cache(maxsize=None)
def mean_shift(act, D=VARIANCE) -> sp.Expr:
    r"""``E[σ(x + μ)]`` for ``x ~ N(0, D)``, as an expression in :data:`MU` and ``D``.

    * erf: ``erf(μ/√(2(1+D)))`` — with ``Z ~ N(0,1)`` independent of ``x``,
      ``erf((x+μ)/√2) = 2P(Z < x + μ | x) − 1`` and ``Z − x ~ N(0, 1 + D)``;
    * relu: ``μΦ(μ/√D) + √D φ(μ/√D)`` (the mean of a rectified normal);
    * polynomial: ``Σ_i c_i Σ_j binom(i, j) μ^{i−j} E[x^j]`` with
      ``E[x^{2r}] = (2r−1)!! D^r``.
    """
    return _mean_shift(activation_key(act), D)


def _mean_shift(act, D):
    if act == "erf":
        return sp.erf(MU / sp.sqrt(2 * (1 + D)))
    if act == "relu":
        s = sp.sqrt(D)
        return MU * _std_cdf(MU / s) + s * _std_pdf(MU / s)
    out = sp.Integer(0)
    for i, c in enumerate(act):
        for j in range(0, i + 1, 2):
            out += _rational(c) * comb(i, j) * MU**(i - j) * sp.factorial2(j - 1) * D**(j // 2)
    return sp.expand(out)


@lru_cache(maxsize=None)
def vertex_function(act, order: int, D=VARIANCE) -> sp.Expr:
    r"""``φ_order(D) = E[σ^{(order)}(x)]``, ``x ~ N(0, D)``: ``∂_μ^order E[σ(x+μ)]`` at ``μ = 0``.

    erf: ``φ_{2r+1} = √(2/π) (−1)^r (2r−1)!! (1+D)^{−r−1/2}``, even orders 0;
    relu: ``φ_0 = √(D/2π)``, ``φ_1 = ½``, ``φ_m = E[δ^{(m−2)}(x)] =
    He_{m−2}(0) D^{−(m−1)/2}/√(2π)`` for ``m ≥ 2``.
    """
    if order < 0:
        raise ValueError(f"order must be >= 0, got {order}")
    return _vertex(activation_key(act), order, D)


@lru_cache(maxsize=None)
def _vertex(act, order, D):
    """:func:`vertex_function` for a canonical activation (polynomials of any degree)."""
    if isinstance(act, tuple) and order >= len(act):
        return sp.Integer(0)
    return sp.simplify(sp.diff(_mean_shift(act, D), MU, order).subs(MU, 0))


def _manifestly_positive(d) -> bool:
    """True for products of positive numbers, positive symbols and square roots."""
    if d.is_positive:
        return True
    if isinstance(d, sp.Mul):
        return all(_manifestly_positive(f) for f in d.args)
    if isinstance(d, sp.Pow) and d.exp == sp.Rational(1, 2):
        return True
    return False


def atan2_form(expr):
    r"""Rewrite ``asin(n/d)`` (``d > 0`` manifestly) as ``atan2(n, √(d² − n²))``.

    Equal on the positive semi-definite cone.  At a singular covariance (e.g.
    ``a = b``: ``C_aaC_bb − C_ab² = 0``) the float value of ``asin`` of a rounded
    ratio is off by ``√ε`` (its slope is infinite at 1) while the companion
    ``√(C_aaC_bb − C_ab²)`` of the arc-cosine kernels is exactly 0; with
    ``atan2`` both use the same square root and stay consistent to rounding.
    """
    def rewrite(a):
        n, d = sp.fraction(sp.together(a.args[0]))
        if not _manifestly_positive(d):
            return a
        return sp.atan2(n, sp.sqrt(sp.expand(d**2 - n**2)))
    return expr.replace(lambda e: isinstance(e, sp.asin), rewrite)


# ---- orthants (Sheppard) -------------------------------------------------------------

_X = sp.Dummy("x", real=True)


def _price_integral(integrand, var, upper):
    """``∫_0^upper integrand d var`` via an antiderivative that is checked by differentiation."""
    anti = sp.integrate(integrand, var, manual=True)
    if isinstance(anti, sp.Integral) or sp.simplify(sp.diff(anti, var) - integrand) != 0:
        raise AssertionError(f"antiderivative of {integrand} not found")  # pragma: no cover
    return anti.subs(var, upper) - anti.subs(var, 0)


@lru_cache(maxsize=None)
def orthant_2():
    r"""Sheppard: ``P(x > 0, y > 0) = ¼ + asin(C_xy/√(C_xxC_yy))/(2π)``.

    Derived by Price: ``∂P/∂C_xy = E[δ(x)δ(y)] = 1/(2π√(C_xxC_yy − C_xy²))``
    (the density at the origin) and ``P = ¼`` at ``C_xy = 0``.

    Returns ``(expression, (C_xx, C_xy, C_yy))``.
    """
    s = cov_symbols("x", "y")
    A, c, B = s[("x", "x")], s[("x", "y")], s[("y", "y")]
    density0 = 1 / (2 * sp.pi * sp.sqrt(A * B - _X**2))
    return sp.Rational(1, 4) + _price_integral(density0, _X, c), (A, c, B)


@lru_cache(maxsize=None)
def orthant_3():
    r"""``P(x > 0, y > 0, z > 0) = 1/8 + (asin ρ_xy + asin ρ_xz + asin ρ_yz)/(4π)``.

    Derived by Price along the path that scales the three covariances by
    ``t``: ``∂P/∂C_xy = E[δ(x)δ(y)1{z>0}] = φ_2(0, 0)·½`` (the conditional law
    of ``z`` given ``x = y = 0`` is centred), so each pair contributes its
    bivariate term; ``P = 1/8`` at ``t = 0``.

    Returns ``(expression, symbols dict of cov_symbols("x", "y", "z"))``.
    """
    s = cov_symbols("x", "y", "z")
    out = sp.Rational(1, 8)
    for v, w in (("x", "y"), ("x", "z"), ("y", "z")):
        A, c, B = s[(v, v)], s[(v, w)], s[(w, w)]
        half_density = 1 / (4 * sp.pi * sp.sqrt(A * B - _X**2))
        out += _price_integral(half_density, _X, c)
    return out, s


# ---- Gaussian folding ----------------------------------------------------------------

def gaussian_fold(C: sp.Matrix, folded):
    r"""Fold the weights ``e^{−u_i²/2}``, ``i ∈ folded``, out of a Gaussian expectation.

    Returns ``(det(I + C_FF)^{−1/2}, C')`` with ``C' = C_RR − C_RF (I + C_FF)^{-1}
    C_FR`` over the remaining indices (in their order); see the module
    docstring for the proof.
    """
    n = C.shape[0]
    rest = [i for i in range(n) if i not in folded]
    CFF = C.extract(list(folded), list(folded))
    M = sp.eye(len(folded)) + CFF
    Minv = M.adjugate() / M.det()
    CRF = C.extract(rest, list(folded))
    Cp = C.extract(rest, rest) - CRF * Minv * CRF.T
    return 1 / sp.sqrt(M.det()), Cp.applyfunc(sp.cancel)


# ---- two-point functions -------------------------------------------------------------

def _pair_symbols():
    s = cov_symbols("a", "b")
    return s[("a", "a")], s[("a", "b")], s[("b", "b")]


def _derivative_product_expectation(f, g, A, c, B):
    """``E[f'(x) g'(y)]`` for non-polynomial ``f, g`` (fold the erf' vertices, orthant the steps)."""
    C = sp.Matrix([[A, c], [c, B]])
    gauss = [i for i, act in enumerate((f, g)) if act == "erf"]
    pref = sp.Integer(1)
    steps = [i for i in range(2) if i not in gauss]
    if gauss:
        pref, Cp = gaussian_fold(C, gauss)
        pref *= sp.sqrt(2 / sp.pi)**len(gauss)
    if len(steps) == 2:
        P2, (xx, xy, yy) = orthant_2()
        return P2.subs({xx: A, xy: c, yy: B}, simultaneous=True)
    if len(steps) == 1:
        return pref / 2  # one centred step after folding: P(u > 0) = 1/2
    return pref


@lru_cache(maxsize=None)
def two_point(f, g) -> sp.Expr:
    r"""``I_2 = E[f(u_a) g(u_b)]`` in ``C_aa, C_ab, C_bb``.

    With a polynomial: the finite Price expansion.  Otherwise Price in
    ``C_ab``: ``I_2 = φ^f_0 φ^g_0 + ∫_0^{C_ab} E[f'g'] dC``, with ``E[f'g']``
    from the fold (erf') and Sheppard (steps).
    """
    f, g = activation_key(f), activation_key(g)
    A, c, B = _pair_symbols()
    if _is_poly(f) or _is_poly(g):
        top = min(_poly_degree(x) for x in (f, g) if _is_poly(x))
        return sp.simplify(sum(c**m / factorial(m) * _vertex(f, m, A) * _vertex(g, m, B)
                               for m in range(top + 1)))
    base = _vertex(f, 0, A) * _vertex(g, 0, B)
    integrand = _derivative_product_expectation(f, g, A, _X, B)
    return sp.simplify(base + _price_integral(integrand, _X, c))


@lru_cache(maxsize=None)
def two_point_odd(f, g) -> sp.Expr:
    r"""``E[f'(u_a) g(u_b)]`` in ``C_aa, C_ab, C_bb`` (the odd base of the derivative 2-point functions).

    * erf ``f``: fold ``u_a``: ``√(2/π)(1+C_aa)^{-1/2} φ^g_0(C_bb − C_ab²/(1+C_aa))``;
    * relu ``f`` (``f' = 1{u > 0}``): Price in ``C_ab``, ``∂/∂C_ab = E[δ(u_a)
      g'(u_b)] = (2πC_aa)^{-1/2} φ^g_1(C_bb − C_ab²/C_aa)`` (``u_b`` given
      ``u_a = 0`` is ``N(0, C_bb − C_ab²/C_aa)``), from ``½φ^g_0(C_bb)`` at 0;
    * polynomial ``f`` or ``g``: the finite expansion ``Σ C^m/m! φ^f_{m+1} φ^g_m``.
    """
    f, g = activation_key(f), activation_key(g)
    A, c, B = _pair_symbols()
    if _is_poly(f) or _is_poly(g):
        top = _poly_degree(g) if _is_poly(g) else _poly_degree(f) - 1
        return sp.simplify(sum(c**m / factorial(m) * _vertex(f, m + 1, A) * _vertex(g, m, B)
                               for m in range(top + 1)))
    if f == "erf":
        return sp.simplify(sp.sqrt(2 / sp.pi) / sp.sqrt(1 + A)
                           * _vertex(g, 0, B - c**2 / (1 + A)))
    integrand = _vertex(g, 1, B - _X**2 / A) / sp.sqrt(2 * sp.pi * A)
    base = _vertex(g, 0, B) / 2
    return sp.simplify(base + _price_integral(integrand, _X, c))


@lru_cache(maxsize=None)
def two_point_derivative(f, g, m: int, n: int) -> sp.Expr:
    r"""``E[f^{(m)}(u_a) g^{(n)}(u_b)]`` in ``C_aa, C_ab, C_bb``.

    By Price, ``∂/∂C_ab`` adds one derivative to each field and ``2∂/∂C_aa``
    two to ``u_a``; so for ``m ≥ n``: ``2^r ∂_{C_aa}^r ∂_{C_ab}^n`` of
    :func:`two_point` (``m − n = 2r``) or of :func:`two_point_odd`
    (``m − n = 2r + 1``); ``m < n`` by symmetry.
    """
    f, g = activation_key(f), activation_key(g)
    if m < 0 or n < 0:
        raise ValueError("derivative orders must be >= 0")
    A, c, B = _pair_symbols()
    if m < n:
        swapped = two_point_derivative(g, f, n, m)
        return swapped.subs({A: B, B: A}, simultaneous=True)
    r, odd = divmod(m - n, 2)
    base = two_point_odd(f, g) if odd else two_point(f, g)
    return sp.simplify(2**r * sp.diff(base, A, r, c, n) if (r or n) else base)


@lru_cache(maxsize=None)
def noise_two_point(f) -> sp.Expr:
    r"""``J_2 = E[f'(u_k) f'(u_l)] = ∂I_2/∂C_kl`` in ``C_kk, C_kl, C_ll`` (Price)."""
    A, c, B = _pair_symbols()
    s = cov_symbols("k", "l")
    expr = sp.diff(two_point(f, f), c)
    return sp.simplify(expr.subs({A: s[("k", "k")], c: s[("k", "l")], B: s[("l", "l")]},
                                 simultaneous=True))


@lru_cache(maxsize=None)
def three_point(f, g) -> sp.Expr:
    r"""``I_3 = E[f'(u_k) u_j g(u_a)]`` in ``C_kk, C_kj, C_ka, C_ja, C_aa``.

    Stein on ``u_j``: ``I_3 = C_kj E[f''(u_k) g(u_a)] + C_ja E[f'(u_k) g'(u_a)]``,
    and by Price ``E[f''g] = 2∂I_2/∂C_kk``, ``E[f'g'] = ∂I_2/∂C_ka`` with
    ``I_2 = E[f(u_k) g(u_a)]``.  Stein holds for singular covariances, so
    ``j = k``, ``j = a`` need nothing special.
    """
    A, c, B = _pair_symbols()
    s = cov_symbols("k", "j", "a")
    I2 = two_point(f, g)
    expr = 2 * s[("k", "j")] * sp.diff(I2, A) + s[("j", "a")] * sp.diff(I2, c)
    return sp.simplify(expr.subs({A: s[("k", "k")], c: s[("k", "a")], B: s[("a", "a")]},
                                 simultaneous=True))


# ---- four-point functions ------------------------------------------------------------

_FOUR = ("k", "l", "a", "b")


def _four_cov():
    s = cov_symbols(*_FOUR)
    return s, sp.Matrix(4, 4, lambda i, j: s[(_FOUR[i], _FOUR[j])])


def _edge_expansion(vertex_acts, poly_vertices, core_vertices, core_function, s):
    """Finite multigraph sum of ``E[∏_v f_v(u_v)]`` with a non-polynomial core.

    ``vertex_acts[v]`` is the function at vertex ``v`` (a coefficient tuple
    for polynomial vertices); ``core_function(degrees)`` returns the core's
    ``E[∏_{v∈K} f_v^{(d_v)}]``.  Edges run over pairs with at least one
    polynomial end, with multiplicities bounded by the polynomial degrees.
    """
    names = list(vertex_acts)
    pairs = [(v, w) for i, v in enumerate(names) for w in names[i + 1:]
             if not (v in core_vertices and w in core_vertices)]
    caps = {v: (_poly_degree(vertex_acts[v]) if v in poly_vertices else 10**6) for v in names}
    out = []

    def rec(i, degrees, factor):
        if i == len(pairs):
            term = factor
            for v in poly_vertices:
                term *= _vertex(vertex_acts[v], degrees[v], s[(v, v)])
                if term == 0:
                    return
            term *= core_function(tuple(degrees[v] for v in core_vertices))
            out.append(term)
            return
        v, w = pairs[i]
        top = min(caps[v] - degrees[v], caps[w] - degrees[w])
        for m in range(top + 1):
            degrees[v] += m
            degrees[w] += m
            rec(i + 1, degrees, factor * s[(v, w)]**m / factorial(m))
            degrees[v] -= m
            degrees[w] -= m

    rec(0, {v: 0 for v in names}, sp.Integer(1))
    return sp.Add(*out)


def _cancel_atan2_scale(expr, scale):
    """``atan2(y, x) → atan2(y·scale, x·scale)`` simplified (``scale > 0``: same angle)."""
    def rewrite(a):
        y, x = a.args
        return sp.atan2(sp.simplify(y * scale), sp.simplify(x * scale))
    return expr.replace(lambda e: isinstance(e, sp.atan2) and e.has(scale), rewrite)


def _derivative_poly(act):
    """Coefficients of ``σ'`` for a polynomial ``σ``."""
    return tuple(Fraction(i) * act[i] for i in range(1, len(act))) or (Fraction(0),)


@lru_cache(maxsize=None)
def four_point(f, g, h, expand: bool = True) -> sp.Expr:
    r"""``I_4 = E[f'(u_k) f'(u_l) g(u_a) h(u_b)]`` in the ten entries ``C_kk … C_bb``.

    With ``expand=False`` the finite expansions (polynomial vertices) are
    returned as their sum of multigraph terms, unexpanded (for display).

    * ``f = erf``: fold ``u_k, u_l``: ``(2/π) det(I + C_kl)^{-1/2}
      I_2^{gh}(C'_aa, C'_ab, C'_bb)`` (any ``g, h``; continuous on the whole
      cone, so coincident indices need nothing special);
    * ``f`` polynomial: the finite expansion with the non-polynomial teacher
      fields as core (derivative 2-point functions :func:`two_point_derivative`;
      at ``a = b`` with ReLU use :func:`four_point_merged_teacher`);
    * ``f = relu`` and ``g, h`` polynomials: core ``{k, l}`` with the step
      derivatives ``E[relu^{(i+1)}(u_k) relu^{(j+1)}(u_l)]`` (at ``k = l`` use
      :func:`relu_four_point_coincident`).

    Raises
    ------
    NotClosedError
        For a ReLU student with a non-polynomial ``g`` or ``h`` (a four-variate
        orthant probability; see :func:`closure_table`).
    """
    f, g, h = (activation_key(x) for x in (f, g, h))
    s, C = _four_cov()
    if f == "erf":
        expr = four_point_folded(g, h)
        return expr.xreplace(dict(zip(FOLD_SYMBOLS, fold_definitions())))
    if _is_poly(f):
        fp = _derivative_poly(f)
        acts = {"k": fp, "l": fp, "a": g, "b": h}
        core = [v for v in ("a", "b") if not _is_poly(acts[v])]
        poly = [v for v in _FOUR if v not in core]
        out = _edge_expansion(acts, poly, core, _core_function(acts, core, s), s)
        return sp.expand(out) if expand else out
    # relu student
    if not (_is_poly(g) and _is_poly(h)):
        raise NotClosedError(
            f"I4 for a relu student with sigma_a={activation_label(g)!r}, "
            f"sigma_b={activation_label(h)!r} contains a four-variate Gaussian orthant "
            "probability and has no elementary closed form; use the quadrature kernel "
            "symquad.numeric.special.relu_four_point")
    acts = {"k": "relu'", "l": "relu'", "a": g, "b": h}
    A, c, B = _pair_symbols()

    def core(degrees):
        i, j = degrees
        D = two_point_derivative("relu", "relu", i + 1, j + 1)
        return D.subs({A: s[("k", "k")], c: s[("k", "l")], B: s[("l", "l")]}, simultaneous=True)

    out = _edge_expansion(acts, ["a", "b"], ["k", "l"], core, s)
    return sp.expand(out) if expand else out


#: Symbols of the folded erf-student four-point function: ``Λ = det(I + C_{kl})`` and
#: ``N = Λ C'`` (``C'`` the covariance of ``u_a, u_b`` after folding ``u_k, u_l``).
FOLD_SYMBOLS = (sp.Symbol("Lambda", positive=True), sp.Symbol("N_aa", positive=True),
                sp.Symbol("N_ab", real=True), sp.Symbol("N_bb", positive=True))


@lru_cache(maxsize=None)
def fold_definitions():
    r"""``(Λ, N_aa, N_ab, N_bb)`` in the ten entries ``C_kk … C_bb``.

    Folding the two erf' vertices ``u_k, u_l`` (:func:`gaussian_fold`) leaves
    ``u_a, u_b`` with covariance ``C' = C_RR − C_RF (I + C_FF)^{-1} C_FR``;
    with ``M = I + C_{kl}`` and ``(I + C_FF)^{-1} = adj(M)/Λ``, ``Λ = det M =
    (1 + C_kk)(1 + C_ll) − C_kl²``, it is ``C' = N/Λ`` with the polynomial
    ``N = Λ C_RR − x adj(M) xᵀ``, ``x_v = (C_kv, C_lv)``: for every pair of
    fields ``N_ab = Λ C_ab − x_a · adj(M) x_b`` (Saad & Solla's ``Λ_0``, and
    ``Λ + N_aa`` their ``Λ_1``).
    """
    s, C = _four_cov()
    M = sp.eye(2) + C.extract([0, 1], [0, 1])
    CRF = C.extract([2, 3], [0, 1])
    N = (C.extract([2, 3], [2, 3]) * M.det() - CRF * M.adjugate() * CRF.T).applyfunc(sp.expand)
    return sp.expand(M.det()), N[0, 0], N[0, 1], N[1, 1]


@lru_cache(maxsize=None)
def four_point_folded(g, h) -> sp.Expr:
    r"""``I_4`` of an erf student in the folded symbols ``Λ, N_aa, N_ab, N_bb`` (:data:`FOLD_SYMBOLS`).

    Folding ``σ'(u_k) σ'(u_l) = (2/π) e^{−(u_k² + u_l²)/2}`` gives
    ``I_4 = (2/π) Λ^{-1/2} I_2^{gh}(N_aa/Λ, N_ab/Λ, N_bb/Λ)`` (any ``g, h``),
    e.g. ``(4/(π²√Λ)) asin(N_ab/√((Λ+N_aa)(Λ+N_bb)))`` for erf–erf;
    :func:`fold_definitions` gives the symbols in the covariance entries.  The
    kernels evaluate this form: ``Λ`` once per student pair and ``N`` by a
    rank-two update of ``C`` per pair, so the four-point sum costs a few
    operations per ``(k, l, a, b)``.
    """
    g, h = activation_key(g), activation_key(h)
    Lam, Naa, Nab, Nbb = FOLD_SYMBOLS
    A, c, B = _pair_symbols()
    inner = two_point(g, h)
    if "relu" in (g, h):
        inner = atan2_form(inner)
    inner = inner.subs({A: Naa / Lam, c: Nab / Lam, B: Nbb / Lam}, simultaneous=True)
    if inner.has(sp.atan2, sp.asin):
        inner = _cancel_atan2_scale(sp.simplify(inner), Lam)
        inner = inner.replace(lambda e: isinstance(e, sp.asin),
                              lambda e: sp.asin(sp.simplify(e.args[0])))
        inner = inner.replace(
            lambda e: isinstance(e, sp.Pow) and e.exp in (sp.Rational(1, 2), -sp.Rational(1, 2)),
            lambda e: sp.Pow(sp.factor(e.base), e.exp))
    return (2 / sp.pi) * inner / sp.sqrt(Lam)


def _core_function(acts, core, s):
    A, c, B = _pair_symbols()
    if not core:
        return lambda degrees: sp.Integer(1)
    if len(core) == 1:
        (v,) = core
        return lambda degrees: _vertex(acts[v], degrees[0], s[(v, v)])

    def two(degrees):
        D = two_point_derivative(acts["a"], acts["b"], degrees[0], degrees[1])
        return D.subs({A: s[("a", "a")], c: s[("a", "b")], B: s[("b", "b")]}, simultaneous=True)
    return two


@lru_cache(maxsize=None)
def _product_mean_shift(f, g, D=VARIANCE):
    """``E[f(x+μ) g(x+μ)]`` for the merged vertex ``f·g`` (``f, g`` erf or relu)."""
    if f == g == "relu":
        s = sp.sqrt(D)
        # E[relu(x+μ)²] = (μ² + D) Φ(μ/√D) + μ √D φ(μ/√D)
        return (MU**2 + D) * _std_cdf(MU / s) + MU * s * _std_pdf(MU / s)
    raise NotClosedError(f"merged vertex {f}*{g} is not needed")  # pragma: no cover


@lru_cache(maxsize=None)
def four_point_merged_teacher(f, g) -> sp.Expr:
    r"""``I_4(k, l, a, a) = E[f'(u_k) f'(u_l) g(u_a)²]`` for a polynomial student, in ``C_kk … C_aa``.

    The merged vertex ``g²`` (``g = relu``: ``relu² = z²1{z>0}``, with
    ``E[relu(x+μ)²] = (μ² + D)Φ(μ/√D) + μ√Dφ(μ/√D)``) has vertex functions
    ``∂_μ^m`` of that at 0, and the expansion has a one-vertex core.  Needed
    because ``E[relu^{(m)}(x) relu^{(n)}(y)]`` diverges as ``y → x``.
    """
    f, g = activation_key(f), activation_key(g)
    if not _is_poly(f) or g != "relu":
        raise ValueError("four_point_merged_teacher is for a polynomial student and relu teacher")
    s = cov_symbols("k", "l", "a")
    fp = _derivative_poly(f)
    acts = {"k": fp, "l": fp, "a": ("relu2",)}

    def core(degrees):
        (m,) = degrees
        return sp.simplify(sp.diff(_product_mean_shift("relu", "relu", s[("a", "a")]), MU, m)
                           .subs(MU, 0))

    return sp.expand(_edge_expansion(acts, ["k", "l"], ["a"], core, s))


@lru_cache(maxsize=None)
def four_point_merged_student(f, g, h) -> sp.Expr:
    r"""``I_4(k, k, a, b) = E[1{u_k>0} g(u_a) h(u_b)]`` for a ReLU student and polynomial ``g, h``.

    In ``C_kk, C_ka, C_kb, C_aa, C_ab, C_bb``.  ``1{u>0}² = 1{u>0}``: one core
    vertex with ``E[(1{x>0})^{(d)}] = φ^{relu}_{d+1}(C_kk)``.  Needed because the
    two-vertex core of :func:`four_point` contains ``det(C_kl)^{-1/2}``.
    """
    f, g, h = (activation_key(x) for x in (f, g, h))
    if f != "relu" or not (_is_poly(g) and _is_poly(h)):
        raise ValueError("four_point_merged_student is for a relu student and polynomial "
                         "sigma_a, sigma_b")
    s = cov_symbols("k", "a", "b")
    acts = {"k": "step", "a": g, "b": h}
    return sp.expand(_edge_expansion(
        acts, ["a", "b"], ["k"],
        lambda degrees: _vertex("relu", degrees[0] + 1, s[("k", "k")]), s))


# ---- ReLU student: coincident indices ------------------------------------------------

#: Coincidence patterns of ``I_4(k,l,a,b)`` for a ReLU student and ReLU ``σ_a, σ_b``
#: with at most three distinct fields, and the function they reduce to.
RELU_COINCIDENT_PATTERNS = {
    "k=l": "E[1{u_k>0} relu(u_a) relu(u_b)]",
    "a=k": "E[1{u_l>0} relu(u_k) relu(u_b)]",
    "a=b": "E[1{u_k>0} 1{u_l>0} relu(u_a)^2]",
}


@lru_cache(maxsize=None)
def _step_relu_relu():
    r"""``S(x; y, z) = E[1{x>0} relu(y) relu(z)]`` in ``cov_symbols("x","y","z")``.

    Stein on ``y``: ``E[y·z1{x,y,z>0}] = C_xy E[δ(x) z1{y,z>0}] + C_yy E[δ(y)
    z1{x,z>0}] + C_yz P_3`` (``∂_y(y1{y>0}) ... `` leaves ``z``'s step through
    ``∂_z``: ``∂_z(z1{z>0}) = 1{z>0}``), and the bivariate first moment
    ``E[z1{v>0,z>0}] = (√S_zz + S_vz/√S_vv)/(2√(2π))`` of the conditional law.
    """
    P3, s = orthant_3()
    xx, xy, xz, yy, yz, zz = (s[p] for p in (("x", "x"), ("x", "y"), ("x", "z"), ("y", "y"),
                                               ("y", "z"), ("z", "z")))

    def first_moment(Svv, Svz, Szz):
        # E[z 1{v>0} 1{z>0}] for a centred pair (v, z) (Stein on z)
        return (sp.sqrt(Szz) + Svz / sp.sqrt(Svv)) / (2 * sp.sqrt(2 * sp.pi))

    def cond(i, j, given):  # conditional covariance given one field = 0
        return s[(i, j)] - s[(i, given)] * s[(j, given)] / s[(given, given)]

    term_x = xy / sp.sqrt(2 * sp.pi * xx) * first_moment(cond("y", "y", "x"), cond("y", "z", "x"),
                                                         cond("z", "z", "x"))
    term_y = yy / sp.sqrt(2 * sp.pi * yy) * first_moment(cond("x", "x", "y"), cond("x", "z", "y"),
                                                         cond("z", "z", "y"))
    return term_x + term_y + yz * P3, s


@lru_cache(maxsize=None)
def _step_step_relu_squared():
    r"""``E[1{x>0}1{y>0} relu(z)²]`` in ``cov_symbols("x","y","z")``.

    Stein on ``z`` in ``E[z·z1{x,y,z>0}]``: ``C_zx E[δ(x) z1{y,z>0}] + C_zy
    E[δ(y) z1{x,z>0}] + C_zz P_3`` (``∂_z(z 1{z>0}) = 1{z>0}``).
    """
    P3, s = orthant_3()

    def first_moment(Svv, Svz, Szz):
        return (sp.sqrt(Szz) + Svz / sp.sqrt(Svv)) / (2 * sp.sqrt(2 * sp.pi))

    def cond(i, j, given):
        return s[(i, j)] - s[(i, given)] * s[(j, given)] / s[(given, given)]

    out = s[("z", "z")] * P3
    for v, w in (("x", "y"), ("y", "x")):
        out += s[("z", v)] / sp.sqrt(2 * sp.pi * s[(v, v)]) * first_moment(
            cond(w, w, v), cond(w, "z", v), cond("z", "z", v))
    return out, s


@lru_cache(maxsize=None)
def relu_four_point_coincident(pattern: str) -> sp.Expr:
    r"""Closed ``I_4`` of a ReLU student with ReLU ``σ_a, σ_b`` on a coincidence pattern.

    Parameters
    ----------
    pattern : str
        One of :data:`RELU_COINCIDENT_PATTERNS`: ``"k=l"`` (``1{u_k>0}² = 1{u_k>0}``),
        ``"a=k"`` (``1{u_k>0} relu(u_k) = relu(u_k)``) or ``"a=b"``.

    Returns
    -------
    Expr
        In the covariance symbols of the distinct fields: ``(k, a, b)``,
        ``(l, k, b)`` or ``(k, l, a)`` respectively, named ``C_kk`` etc.
        Valid where those three fields have a non-singular covariance (the
        conditional variances appear in denominators); the quadrature kernel
        covers every case.
    """
    if pattern == "k=l":
        expr, s = _step_relu_relu()
        names = ("k", "a", "b")
    elif pattern == "a=k":
        expr, s = _step_relu_relu()
        names = ("l", "k", "b")
    elif pattern == "a=b":
        expr, s = _step_step_relu_squared()
        names = ("k", "l", "a")
    else:
        raise ValueError(f"pattern must be one of {tuple(RELU_COINCIDENT_PATTERNS)}, got {pattern!r}")
    target = cov_symbols(*names)
    xyz = ("x", "y", "z")
    sub = {s[(xyz[i], xyz[j])]: target[(names[i], names[j])] for i in range(3) for j in range(i, 3)}
    return expr.xreplace(sub)


# ---- what closes ---------------------------------------------------------------------

def closure_table():
    """``{(function, student, sigma_a, sigma_b): status}`` for the kinds erf, relu, poly.

    Status strings: ``"closed"``; ``"closed (merged vertex at a=b)"`` (polynomial
    student, ReLU teacher: :func:`four_point_merged_teacher` at ``a = b``);
    ``"closed (k=l merged)"``; ``"quadrature"`` (no elementary form: a
    four-variate orthant; kernel :func:`symquad.numeric.special.relu_four_point`);
    ``"closes, quadrature kernel"`` (ReLU student, one ReLU and one erf field:
    only first moments of a truncated four-variate normal, which reduce to
    trivariate orthants, but the kernel is the quadrature);
    ``"closes, not implemented"`` (ReLU student with one polynomial and one
    non-polynomial field: a three-field core whose derivatives reduce to
    trivariate orthants; neither form is implemented).
    """
    kinds = ("erf", "relu", "poly")
    out = {}
    for f in kinds:
        out[("J2", f, None, None)] = "closed"
        for g in kinds:
            out[("I2", f, g, None)] = "closed"
            out[("I3", f, g, None)] = "closed"
            for h in kinds:
                if f == "erf":
                    status = "closed"
                elif f == "poly":
                    status = "closed (merged vertex at a=b)" if "relu" in (g, h) else "closed"
                elif g == "poly" and h == "poly":
                    status = "closed (k=l merged)"
                elif "poly" in (g, h):
                    status = "closes, not implemented"
                elif g != h:
                    status = "closes, quadrature kernel"
                else:
                    status = "quadrature"
                out[("I4", f, g, h)] = status
    return out
