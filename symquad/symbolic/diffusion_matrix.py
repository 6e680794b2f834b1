r"""Matrix-form moment kinds of the diffusion for ``σ = c z² + c0``, ``σ* = c* z² + c0*``.

A kind of :mod:`symquad.symbolic.diffusion`,
``M_{dxs} = E[∏_{d} σ'(λ_i) ∏_{x} u_j ∏_{s} σ(λ_k)\, δ^{d+s}]``, has local
factors read off the student's polynomial (``σ'(x) = 2c x``,
``σ(x) = c x² + c0``; symbols, nothing typed per kind): expanding their
product gives monomials ``∏_v x_v^{e_v}``, i.e. Gaussian moments with open
legs ``E[z_{x_1} … z_{x_L} δ^r]`` (``L = Σ e_v ≤ 4`` here).  With
``δ = zᵀAz + κ − √Δ ξ`` (:mod:`symquad.symbolic.matrix_form`) the label noise
is integrated out exactly and :func:`symquad.symbolic.quadforms.expect_legs`
reduces ``E[z_{x_1}…z_{x_L} (zᵀAz)^f]`` to perfect matchings of the legs with
a word ``W_J = (CA)^J C`` per pair, times traces ``tr((AC)^j)``.  The result
(:func:`kind_recipes`) is a list of ``(coefficient, pairing)`` per kind, where
a pairing names the *vertices* of each pair — so a kind is read at any index
arrays of its vertices, ``Σ coeff · ∏ W_J[x_u, x_v]``, for ``O(1)`` per entry
of ``D`` after ``O(n³)`` for the words.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from .diffusion import parse_kind, used_kinds
from .matrix_form import ACT_SYMBOLS, _noise_expectation
from .quadforms import expect_legs

__all__ = ["kind_recipes", "kind_recipe", "MAX_WORD", "used_kinds"]

#: Longest word ``(CA)^J C`` a kind needs (legs ≤ 4 with ``δ^r``, ``r ≤ 4``).
MAX_WORD = 4


@lru_cache(maxsize=None)
def kind_recipe(name: str) -> tuple:
    """``((coefficient, pairing), ...)`` of kind `name` (see the module docstring).

    ``pairing`` is ``((u, v, J), ...)`` over vertex positions ``u <= v`` (the
    kind's arguments in order); coefficients are polynomials in ``c, c*, c0,
    c0*, κ, Δ`` and trace placeholders.
    """
    nd, nx, ns = parse_kind(name)
    c, _, c0, _ = ACT_SYMBOLS
    xs = sp.symbols(f"x0:{nd + nx + ns}")
    x = sp.Symbol("x")
    sigma = c * x**2 + c0
    local = ([sp.diff(sigma, x)] * nd) + ([x] * nx) + ([sigma] * ns)
    product = sp.expand(sp.Mul(*[f.subs(x, xv) for f, xv in zip(local, xs)]))
    r = nd + ns
    noise = _noise_expectation(r)
    acc: dict = {}
    for mono, coeff in sp.Poly(product, *xs).terms():
        legs = [v for v, e in enumerate(mono) for _ in range(e)]
        for forms, cf in noise.items():
            for pairs, cl in expect_legs(len(legs), forms).items():
                key = tuple(sorted((min(legs[a], legs[b]), max(legs[a], legs[b]), J)
                                   for a, b, J in pairs))
                acc[key] = acc.get(key, 0) + coeff * cf * cl
    out = [(sp.expand(v), k) for k, v in sorted(acc.items()) if sp.expand(v) != 0]
    if any(J > MAX_WORD for _, k in out for _, _, J in k):  # pragma: no cover - algebra guard
        raise AssertionError(f"{name} needs words beyond (CA)^{MAX_WORD} C")
    return tuple(out)


def kind_recipes() -> dict:
    """``{kind: recipe}`` for every kind of :func:`used_kinds`."""
    return {name: kind_recipe(name) for name in used_kinds()}
