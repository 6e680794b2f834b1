"""The entry-by-entry Wick engine against independent routes."""

import itertools

import numpy as np
import pytest
import sympy as sp
from sympy import stats

from symquad.symbolic.wick import GaussianFields


def _cholesky_fields(n):
    """Fields z = L g with g independent N(0,1) and symbolic lower-triangular L."""
    L = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"l{i}{j}") if j <= i else 0)
    return L, L * L.T


def _independent_moment(poly_in_g, gs):
    """E over independent standard normals: E[g^k] = (k-1)!! for even k, else 0."""
    poly = sp.Poly(sp.expand(poly_in_g), *gs)
    total = 0
    for monom, coeff in poly.terms():
        term = coeff
        for k in monom:
            term *= 0 if k % 2 else sp.factorial2(k - 1)
        total += term
    return sp.expand(total)


def test_against_sympy_stats_low_degree():
    L, C = _cholesky_fields(2)
    g = [stats.Normal(f"g{i}", 0, 1) for i in range(2)]
    z_rv = L * sp.Matrix(g)
    x, y = sp.symbols("x y")
    engine = GaussianFields((x, y), C)
    for a, b in [(2, 0), (1, 1), (2, 2), (3, 1), (1, 3), (4, 0)]:
        via_stats = sp.expand(stats.E(sp.expand(z_rv[0] ** a * z_rv[1] ** b)))
        assert sp.expand(engine.moment((a, b)) - via_stats) == 0, (a, b)


@pytest.mark.parametrize("n, max_degree", [(3, 6), (4, 4)])
def test_against_independent_normal_expansion(n, max_degree):
    L, C = _cholesky_fields(n)
    gs = sp.symbols(f"g0:{n}")
    z = L * sp.Matrix(gs)
    fields = sp.symbols(f"z0:{n}")
    engine = GaussianFields(fields, C)
    for a in itertools.product(range(max_degree + 1), repeat=n):
        if sum(a) > max_degree or sum(a) % 2:
            continue
        expected = _independent_moment(sp.Mul(*[z[i] ** a[i] for i in range(n)]), gs)
        assert sp.expand(engine.moment(a) - expected) == 0, a


def test_odd_moments_vanish_and_expectation_of_polynomial():
    x, y, a, b, c, k = sp.symbols("x y a b c k")
    engine = GaussianFields((x, y), sp.Matrix([[a, c], [c, b]]))
    assert engine.moment((3, 0)) == 0 and engine.moment((2, 1)) == 0
    expr = k * x**2 * y**2 - 3 * x * y + 7
    assert sp.expand(engine.expectation(expr) - (k * (a * b + 2 * c**2) - 3 * c + 7)) == 0


def test_against_monte_carlo():
    rng = np.random.default_rng(42)
    x, y, w = sp.symbols("x y w")
    cov = np.array([[1.0, 0.4, -0.3], [0.4, 0.8, 0.2], [-0.3, 0.2, 1.2]])
    engine = GaussianFields((x, y, w), sp.Matrix(cov.tolist()))
    samples = rng.multivariate_normal(np.zeros(3), cov, size=2_000_000)
    for a in [(2, 2, 0), (1, 1, 2), (3, 1, 2), (2, 2, 2)]:
        values = np.prod(samples ** np.array(a), axis=1)
        mean, se = values.mean(), values.std(ddof=1) / np.sqrt(values.size)
        assert se < 0.02 * max(1.0, abs(mean))  # the estimator is precise enough
        assert abs(float(engine.moment(a)) - mean) < 5 * se, a


def test_bad_input():
    x, y = sp.symbols("x y")
    with pytest.raises(ValueError, match="symmetric"):
        GaussianFields((x, y), sp.Matrix([[1, 2], [3, 1]]))
    with pytest.raises(ValueError, match="2x2"):
        GaussianFields((x, y), sp.eye(3))
    with pytest.raises(ValueError, match="non-negative"):
        GaussianFields((x, y), sp.eye(2)).moment((1, -1))
