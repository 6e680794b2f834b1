"""Matrix-form and entry-by-entry derivations agree exactly (two independent routes)."""

import pytest
import sympy as sp

from symquad import Model, derive
from symquad.symbolic.quadforms import expect_forms, expect_outer
from symquad.symbolic.symbols import NOISE

PAIRS = [(p, k) for p in (1, 2, 3) for k in (1, 2, 3)]
#: The default run: p < p*, p = p*, p > p* (at most 5 s each on the 2-core machine); the
#: larger pairs (up to 16 s each, SymPy expansion) run with ``-m slow``.
QUICK = {(1, 1), (1, 2), (2, 1), (2, 2)}


def _is_zero(x):
    return sp.expand(x) == 0


@pytest.mark.parametrize("p, p_star", [pair if pair in QUICK else
                                        pytest.param(*pair, marks=pytest.mark.slow)
                                        for pair in PAIRS])
def test_matrix_form_equals_entries(p, p_star):
    m = Model(p=p, p_star=p_star, lr=0.1)
    matrix = derive(m, form="matrix").explicit()
    entries = derive(m, form="entries").explicit()
    for noise in (NOISE, 0):  # with symbolic label noise Δ, and without
        for a, b in zip(matrix, entries):
            diff = sp.Matrix([a - b]) if not isinstance(a, sp.MatrixBase) else a - b
            assert all(_is_zero(e.subs(NOISE, noise)) for e in diff), (p, p_star, noise)


def test_general_quadratic_coefficient_agrees():
    m = Model(p=2, p_star=2, lr=0.1, activation="3*z**2/2 - 4")
    for a, b in zip(derive(m, form="matrix").explicit(), derive(m, form="entries").explicit()):
        diff = sp.Matrix([a - b]) if not isinstance(a, sp.MatrixBase) else a - b
        assert all(_is_zero(e) for e in diff)


def test_quadratic_form_identities():
    # Known closed forms (cumulants of a Gaussian quadratic form):
    # E[s] = tr(AC), Var s = 2 tr((AC)^2), third cumulant 8 tr((AC)^3).
    t1, t2, t3 = (sp.Symbol(f"tr({'AC' * n})") for n in (1, 2, 3))
    assert expect_forms([("A",)]) == t1
    assert sp.expand(expect_forms([("A",)] * 2) - (t1**2 + 2 * t2)) == 0
    assert sp.expand(expect_forms([("A",)] * 3) - (t1**3 + 3 * t1 * 2 * t2 + 8 * t3)) == 0
    # Stein: E[s zzᵀ] = tr(AC) C + 2 CAC
    assert expect_outer([("A",)]) == {("C",): t1, ("C", "A", "C"): 2}


def test_matrix_route_rejects_non_quadratic():
    with pytest.raises(ValueError, match="matrix-form route needs"):
        derive(Model(p=2, p_star=1, lr=0.1, activation="z**3"), form="matrix")
    with pytest.raises(ValueError, match="form must be one of"):
        derive(Model(p=2, p_star=1, lr=0.1), form="both")


def test_model_change_changes_the_equations():
    base = derive(Model(p=2, p_star=1, lr=0.1), form="entries")
    cubic = derive(Model(p=2, p_star=1, lr=0.1, activation="z**2 + z**3"), form="entries")
    assert sp.expand(base.risk - cubic.risk) != 0
    assert not _is_zero((base.drho - cubic.drho)[0])
