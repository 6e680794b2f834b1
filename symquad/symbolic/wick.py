"""Entry-by-entry Gaussian expectations (Wick / Isserlis theorem).

For jointly Gaussian, centred fields ``z = (z_1..z_n)`` with covariance ``C``,
Gaussian integration by parts gives ``E[z_i f(z)] = Σ_j C_ij E[∂_j f(z)]``.
Applied to a monomial ``z^a = Π_j z_j^{a_j}`` with ``a_i > 0`` and
``a' = a − e_i``:

.. math::  E[z^a] = \\sum_j C_{ij}\\, a'_j\\, E[z^{a' - e_j}],

which is Isserlis' sum over pairings, computed without enumerating them.
Moments are memoised per exponent tuple, so all monomials of a polynomial
share their sub-moments.
"""

from __future__ import annotations

import sympy as sp

__all__ = ["GaussianFields", "RingGaussianFields", "to_ring"]


class GaussianFields:
    """Jointly Gaussian centred fields with a symbolic covariance matrix.

    Parameters
    ----------
    fields : sequence of Symbol
        The field symbols ``z_1..z_n``.
    covariance : sympy Matrix (n×n)
        Symmetric covariance ``C_ij = E[z_i z_j]`` (entries may be symbols).

    Examples
    --------
    >>> import sympy as sp
    >>> x, y, a, b, c = sp.symbols("x y a b c")
    >>> g = GaussianFields((x, y), sp.Matrix([[a, c], [c, b]]))
    >>> sp.expand(g.expectation(x**2 * y**2))
    a*b + 2*c**2
    """

    def __init__(self, fields, covariance):
        self.fields = tuple(fields)
        cov = sp.ImmutableMatrix(covariance)
        n = len(self.fields)
        if cov.shape != (n, n):
            raise ValueError(f"covariance must be {n}x{n} for {n} fields, got {cov.shape}")
        if cov != cov.T:
            raise ValueError("covariance must be symmetric")
        self.covariance = cov
        self._memo: dict[tuple, sp.Expr] = {(0,) * n: sp.Integer(1)}

    def moment(self, exponents) -> sp.Expr:
        """``E[Π_j z_j^{a_j}]`` for the exponent tuple ``a`` (expanded polynomial)."""
        key = tuple(int(e) for e in exponents)
        if len(key) != len(self.fields) or min(key, default=0) < 0:
            raise ValueError(
                f"exponents must be {len(self.fields)} non-negative integers, got {exponents}")
        return self._moment(key)

    def _moment(self, a: tuple) -> sp.Expr:
        cached = self._memo.get(a)
        if cached is not None:
            return cached
        if sum(a) % 2:
            result = sp.Integer(0)
        else:
            i = next(k for k, e in enumerate(a) if e)
            rest = list(a)
            rest[i] -= 1
            terms = []
            for j, e in enumerate(rest):
                if e and self.covariance[i, j] != 0:
                    lower = list(rest)
                    lower[j] -= 1
                    terms.append(self.covariance[i, j] * e * self._moment(tuple(lower)))
            result = sp.expand(sp.Add(*terms))
        self._memo[a] = result
        return result

    def expectation(self, expr) -> sp.Expr:
        """``E[expr]`` for a polynomial ``expr`` in the fields (other symbols are constants)."""
        expr = sp.sympify(expr)
        if not expr.free_symbols & set(self.fields):
            return sp.expand(expr)
        poly = sp.Poly(sp.expand(expr), *self.fields)
        return sp.expand(sp.Add(*[coeff * self._moment(monom) for monom, coeff in poly.terms()]))


class RingGaussianFields:
    """The same Isserlis recursion as :class:`GaussianFields`, in a sparse polynomial ring.

    For large polynomials with symbolic coefficients the expression-level
    ``expand`` of :class:`GaussianFields` dominates; here every quantity is an
    element of a :func:`sympy.polys.rings.ring` (dict-based sparse polynomials
    over ``QQ``), whose products and sums are much cheaper.

    Parameters
    ----------
    ring : PolyRing
        Contains the field generators and every symbol of the covariance and
        of the coefficients.
    fields : sequence of PolyElement
        The field generators ``z_1..z_n`` (generators of `ring`).
    covariance : sequence of sequences of PolyElement
        ``C_ij`` as ring elements (symmetric).
    """

    def __init__(self, ring, fields, covariance):
        self.ring = ring
        self.fields = tuple(fields)
        self.positions = tuple(ring.gens.index(f) for f in self.fields)
        n = len(self.fields)
        self.covariance = [[ring(covariance[i][j]) for j in range(n)] for i in range(n)]
        self._memo = {(0,) * n: ring.one}

    def moment(self, a: tuple):
        """``E[Π_j z_j^{a_j}]`` as a ring element (the recursion of :meth:`GaussianFields.moment`)."""
        cached = self._memo.get(a)
        if cached is not None:
            return cached
        if sum(a) % 2:
            result = self.ring.zero
        else:
            i = next(k for k, e in enumerate(a) if e)
            rest = list(a)
            rest[i] -= 1
            result = self.ring.zero
            for j, e in enumerate(rest):
                if e and self.covariance[i][j]:
                    lower = list(rest)
                    lower[j] -= 1
                    result += self.covariance[i][j] * e * self.moment(tuple(lower))
        self._memo[a] = result
        return result

    def expectation(self, element):
        """``E[element]`` for a ring element polynomial in the fields (other generators constant)."""
        pos = self.positions
        out = self.ring.zero
        groups: dict = {}
        for monom, coeff in element.terms():
            key = tuple(monom[p] for p in pos)
            rest = list(monom)
            for p in pos:
                rest[p] = 0
            groups.setdefault(key, []).append((tuple(rest), coeff))
        for key, terms in groups.items():
            moment = self.moment(key)
            if moment:
                out += moment * self.ring.from_dict(dict(terms))
        return out


def to_ring(expr, R, inverse, leaf):
    """A SymPy expression of sums, products, integer powers and rationals as an element of `R`.

    Negative powers are taken through ``inverse`` (``{base: ring element of 1/base}``);
    any other subexpression is a leaf, converted by ``leaf(expr)``.  Used by the
    diffusion matrix and the Jacobian, whose polynomials live in sparse rings.
    """
    if expr.is_Add:
        return sum((to_ring(t, R, inverse, leaf) for t in expr.args), R.zero)
    if expr.is_Mul:
        out = R.one
        for t in expr.args:
            out *= to_ring(t, R, inverse, leaf)
        return out
    if expr.is_Pow and expr.exp.is_Integer:
        if expr.exp < 0:
            return inverse[expr.base] ** int(-expr.exp)
        return to_ring(expr.base, R, inverse, leaf) ** int(expr.exp)
    if expr.is_Rational:
        return R(sp.QQ(int(expr.p), int(expr.q)))
    return leaf(expr)
