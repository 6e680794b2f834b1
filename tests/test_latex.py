"""LaTeX output: it compiles, and what it displays is what was derived."""

import shutil
import subprocess
import sys

import pytest
import sympy as sp

import symquad as sq
from symquad.codegen.regenerate import GENERATED_DIR
from symquad.symbolic.matrix_form import derive_matrix_form, display_form
from symquad.symbolic.symbols import P, P_STAR


def test_display_form_is_the_derived_form():
    m = sq.Model(p=3, p_star=2, lr=0.1)
    definitions, risk, dQ, drho = display_form(m)
    eqs = derive_matrix_form(m)
    back = dict(definitions)
    assert sp.simplify(risk.xreplace(back) - eqs.risk) == 0
    eq = sq.derive(m)
    Q, rho, T = eq.entry_symbols
    Qm, Rm, Tm = eq.symbols
    # compare on explicit matrices of entry symbols
    subs = {Qm: sp.Matrix(Q), Rm: sp.Matrix(rho), Tm: sp.Matrix(T), P: 3, P_STAR: 2}
    for shown, derived in ((dQ, eqs.dQ), (drho, eqs.drho)):
        a = sp.Matrix(shown.xreplace(back).subs(subs).doit())
        b = sp.Matrix(derived.subs(subs).doit())
        assert (a - b).applyfunc(sp.expand) == sp.zeros(*a.shape)


def test_latex_mentions_every_equation():
    text = sq.derive(sq.Model(p=2, p_star=1, lr=0.1)).latex()
    for piece in (r"\varepsilon", r"\frac{dQ}{dt}", r"\frac{d\rho}{dt}", r"\tau_{1}", r"\Delta"):
        assert piece in text
    entries = sq.derive(sq.Model(p=2, p_star=1, lr=0.1), form="entries").latex()
    assert entries.count(r"\frac{d}{d t}") == 3 + 2
    assert "+ -" not in text


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
@pytest.mark.parametrize("name", sorted(p.name for p in GENERATED_DIR.glob("*.tex")))
def test_committed_latex_compiles(name, tmp_path):
    (tmp_path / name).write_text((GENERATED_DIR / name).read_text())
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", name],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    assert (tmp_path / name.replace(".tex", ".pdf")).exists()


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_cli_equations_standalone_compiles(tmp_path):
    out = subprocess.run([sys.executable, "-m", "symquad", "equations", "--p", "2", "--p-star",
                          "2", "--form", "entries", "--standalone"],
                         capture_output=True, text=True, check=True)
    (tmp_path / "eq.tex").write_text(out.stdout)
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "eq.tex"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:]


def test_cli_equations_rejects_bad_input():
    out = subprocess.run([sys.executable, "-m", "symquad", "equations", "--p", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "p must be an integer >= 1" in out.stderr and out.stdout == ""
