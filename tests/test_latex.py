"""LaTeX output: it compiles without overfull lines, and what it displays is what was derived."""

import re
import shutil
import subprocess
import tracemalloc

import pytest
import sympy as sp

import symquad as sq
from symquad.codegen.regenerate import GENERATED_DIR
from symquad.symbolic import latex as L
from symquad.symbolic.matrix_form import derive_matrix_form, display_form
from symquad.symbolic.symbols import ETA, NOISE, P, P_STAR, overlap_symbols

HAVE_PDFLATEX = shutil.which("pdflatex") is not None
needs_pdflatex = pytest.mark.skipif(
    not HAVE_PDFLATEX, reason="pdflatex not installed: these tests compile the --standalone "
    "LaTeX output; install it with `apt-get install texlive-latex-base texlive-latex-recommended` "
    "(Debian/Ubuntu) to run them")


@pytest.mark.parametrize("loss", ["square", "correlation"])
def test_display_form_is_the_derived_form(loss):
    """The display (traces named m_n, and the error signal's own traces for the correlation
    loss) is the derived matrix form, on explicit matrices."""
    m = sq.Model(p=3, p_star=2, lr=0.1, loss=loss)
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
    for piece in (r"\varepsilon", r"\frac{dQ}{dt}", r"\frac{d\rho}{dt}", r"m_{1}", r"\Delta",
                  r"\rho \rho^\top"):
        assert piece in text
    entries = sq.derive(sq.Model(p=2, p_star=1, lr=0.1), form="entries").latex()
    assert len(re.findall(r"\\frac\{d(Q|\\rho)_\{\d+\}\}\{dt\}", entries)) == 3 + 2
    assert "+ -" not in text


FORMS = [(sq.Model(p=3, p_star=2, lr=0.1), "matrix"),
         (sq.Model(p=3, p_star=2, lr=0.1, activation="z**3 - 3*z"), "tensor"),
         (sq.Model(p=2, p_star=1, lr=0.1), "entries"),
         (sq.Model(p=3, p_star=2, lr=0.1, loss="correlation"), "matrix"),
         (sq.Model(p=3, p_star=2, lr=0.1, activation="z**3 - 3*z", loss="correlation"),
          "tensor")]


@pytest.mark.parametrize("model,form", FORMS)
def test_notation_pastes(model, form):
    """Transposes print as ^\top, no helper symbol is a tau (the docs' clock), no SymPy repr."""
    text = sq.derive(model, form=form).latex()
    assert r"\tau" not in text and "^{T}" not in text and "Model(" not in text
    assert "\\left(a,b \\right)" not in text and "{C}_" not in text
    if form != "entries":
        assert r"^\top" in text


def test_invariants_latex_uses_no_tau(capsys):
    from symquad.cli import main as cli_main
    assert cli_main(["invariants", "--p", "3", "--p-star", "2", "--only", "conservation"]) == 0
    text = capsys.readouterr().out
    assert r"\tau" not in text and r"\theta_{1}" in text and "Model(" not in text


# --- reading the printed polynomials back (a second route for what is displayed) ------
def _tex_to_sympy(tex, symbols):
    r"""SymPy expression of the restricted LaTeX the printer writes for polynomials.

    Handles ``\frac{a}{b}``, ``x^{n}``, juxtaposition as multiplication, ``\bigl(``,
    ``\Bigr)``, and the names in `symbols` (LaTeX name -> Symbol).  Independent of
    the printer: it only rewrites text.
    """
    text = re.sub(r"\\[Bb]ig[lr]?(?=[()])", "", tex).replace(r"\left", "")
    text = text.replace(r"\right", "").replace(r"\quad", " ").replace("&", " ")
    text = text.replace(r"\\", " ").replace(r"\,", " ")
    table = {}
    for k, (name, sym) in enumerate(sorted(symbols.items(), key=lambda kv: -len(kv[0]))):
        key = f"S{k}X"
        table[key] = sym
        text = text.replace(name, f" {key} ")
    text = re.sub(r"\^\{([^{}]*)\}", r"**(\1)", text)
    while r"\frac" in text:
        text, n = re.subn(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r" ((\1)/(\2)) ", text)
        assert n, text
    assert "\\" not in text, text
    tokens = re.findall(r"\*\*|[A-Za-z0-9]+|[()+\-*/]", text)
    out, prev = [], None
    for tok in tokens:   # juxtaposition -> explicit multiplication
        operand_start = tok == "(" or tok[0].isalnum()
        operand_end = prev is not None and (prev == ")" or prev[0].isalnum())
        if operand_start and operand_end:
            out.append("*")
        out.append(tok)
        prev = tok
    return sp.sympify(" ".join(out), locals=table)


def _top_level_terms(tex):
    """Number of terms of a displayed sum: signs outside every bracket and brace."""
    depth, count, prev = 0, 0, "("
    for c in tex.replace(r"\quad", "").replace("&", ""):
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c in "+-" and depth == 0 and prev != "^":
            count += 1
        if not c.isspace():
            prev = c
    return count + (not tex.lstrip().startswith("-"))


def _rhs_of(body, lhs):
    """The right-hand side of the displayed equation `lhs` (all its lines)."""
    blocks = re.findall(r"\\begin\{align\*\}\n(.*?)\n\\end\{align\*\}", body, re.S)
    rows = [row for b in blocks for row in re.split(r" \\\\\n(?!&\\quad)", b)]
    for row in rows:
        if row.startswith(lhs + " &= "):
            return row[len(lhs) + 4:]
    raise AssertionError(f"no row {lhs!r}")


def test_displayed_entry_equations_read_back_to_the_derived_ones():
    m = sq.Model(p=2, p_star=2, lr=0.1)
    eq = sq.derive(m, form="entries")
    body = eq.latex()
    Q, rho, T = overlap_symbols(2, 2)
    names = {r"\eta": ETA, r"\Delta": NOISE}
    for mat, head in ((Q, "Q"), (rho, r"\rho"), (T, "T")):
        for i in range(mat.rows):
            for j in range(mat.cols):
                names[f"{head}_{{{i + 1}{j + 1}}}"] = mat[i, j]
    assert sp.expand(_tex_to_sympy(_rhs_of(body, r"\varepsilon"), names) - eq.risk) == 0
    for i in range(2):
        for j in range(i, 2):
            shown = _tex_to_sympy(_rhs_of(body, rf"\frac{{dQ_{{{i + 1}{j + 1}}}}}{{dt}}"), names)
            assert sp.expand(shown - eq.dQ[i, j]) == 0
        for k in range(2):
            shown = _tex_to_sympy(_rhs_of(body, rf"\frac{{d\rho_{{{i + 1}{k + 1}}}}}{{dt}}"),
                                  names)
            assert sp.expand(shown - eq.drho[i, k]) == 0


@pytest.mark.parametrize("activation", ["z**3 - 3*z", "z**4 - z", "2*z**3 + z**2/3"])
def test_displayed_npoint_functions_are_factored_and_read_back(activation):
    eq = sq.derive(sq.Model(p=3, p_star=2, lr=0.1, activation=activation), form="tensor")
    body = eq.latex()
    C, _ = eq.symbols
    for fn, value in eq.definitions.items():
        idx = {str(i): i for i in fn.args}
        names = {f"C_{{{x}{y}}}": C[sx, sy] for x, sx in idx.items() for y, sy in idx.items()}
        lhs = L.to_latex(fn)
        shown = _rhs_of(body, lhs)
        assert sp.expand(_tex_to_sympy(shown, names) - value) == 0, lhs
        # one term per monomial in the covariances of distinct fields: fewer terms than expanded
        n_shown = _top_level_terms(shown)
        off = {s for s in value.free_symbols if isinstance(s, sp.Indexed)
               and len(set(s.indices)) > 1}
        assert n_shown == len(sp.Poly(value, *sorted(off, key=str)).terms())


def test_matrix_display_reads_back_on_explicit_matrices():
    """The grouped and factored matrix display equals the derived matrix form."""
    m = sq.Model(p=3, p_star=2, lr=0.1)
    body = sq.derive(m).latex()
    definitions, _, _, _ = display_form(m)
    eqs = derive_matrix_form(m)
    # on diagonal numeric matrices every word commutes, so the display is a polynomial
    # in the diagonal entries that can be read back and compared
    q, r, t = sp.symbols("q1:4"), sp.symbols("r1:3"), sp.symbols("t1:3")
    Qn, Tn = sp.diag(*q), sp.diag(*t)
    Rn = sp.Matrix([[r[0], 0], [0, r[1]], [0, 0]])
    p_, k_ = 3, 2
    m1 = sum(q) / p_ - sum(t) / k_
    m2 = sum(x ** 2 for x in q) / p_ ** 2 - 2 * sum(x ** 2 for x in r) / (p_ * k_) \
        + sum(x ** 2 for x in t) / k_ ** 2
    shown = _rhs_of(body, r"\frac{dQ}{dt}")
    # the diagonal entry (1,1) of each word on these matrices
    word_values = {r"Q^{3}": Qn ** 3, r"Q^{2}": Qn ** 2, r"Q \rho \rho^\top": Qn * Rn * Rn.T,
                   r"\rho \rho^\top Q": Rn * Rn.T * Qn, r"\rho T \rho^\top": Rn * Tn * Rn.T,
                   r"\rho \rho^\top": Rn * Rn.T}
    for entry in range(3):
        text = shown
        names = {r"\eta": ETA, r"\Delta": NOISE, "m_{1}": m1, "m_{2}": m2, "p^{*2}": k_ ** 2,
                 "p^{*}": k_}
        for k, (word, M) in enumerate(sorted(word_values.items(), key=lambda kv: -len(kv[0]))):
            text = text.replace(word, f" W{k}W ")
            names[f"W{k}W"] = M[entry, entry]
        text = re.sub(r"(?<![A-Za-z\\])Q(?![_{A-Za-z])", " W9W ", text)
        names["W9W"] = Qn[entry, entry]
        names["p"] = p_
        got = _tex_to_sympy(text, names)
        want = eqs.dQ.subs({P: p_, P_STAR: k_}).subs(
            {sp.MatrixSymbol("Q", p_, p_): Qn, sp.MatrixSymbol("rho", p_, k_): Rn,
             sp.MatrixSymbol("T", k_, k_): Tn})
        want = sp.Matrix(want.doit())[entry, entry]
        assert sp.expand(got - want) == 0, entry
    assert "m_{1}" in body and all(f"m_{{{n}}} &= " in body for n in (1, 2))


def test_tex_width_estimate_is_monotone_and_sensible():
    assert L.tex_width("Q_{11}") < L.tex_width("Q_{11} Q_{22}") < L.tex_width("Q_{11} Q_{22} + 1")
    assert L.tex_width(r"\frac{1}{p^{2}}") < L.tex_width("1 p^{2}")
    assert 4 < L.tex_width("x") < 8


def test_long_sums_are_broken_into_lines():
    x = sp.symbols("x1:60")
    body = L.align_rows([("y", L.display_rhs(sum(x)))])
    lines = body.split("\\\\\n")
    assert len(lines) > 2
    assert all(L.tex_width(line.replace("&\\quad", "").replace("&=", "=")
                           .replace("\\begin{align*}", "").replace("\\end{align*}", ""))
               <= L.LINE_WIDTH_PT for line in lines)


# --- width independence (issue 18: `symquad equations --p 1000` built p^2 symbols) ----
def test_printing_at_large_width_builds_no_width_dependent_objects():
    overlap_symbols.cache_clear()
    tracemalloc.start()
    text = sq.derive(sq.Model(p=1000, p_star=2, lr=0.1)).latex()
    tensor = sq.derive(sq.Model(p=1000, p_star=3, lr=0.1, activation="z**3")).latex()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50e6          # p = 1000 entry symbols alone took 1.1 GB
    assert overlap_symbols.cache_info().currsize == 0
    small = sq.derive(sq.Model(p=4, p_star=2, lr=0.1)).latex()
    assert text.replace("p = 1000", "p = 4").replace("p=1000", "p=4") == small
    assert "p=1000" in tensor


def test_entry_symbols_check_the_size_first():
    with pytest.raises(ValueError, match=r"p=1000, p_star=2 .* entry symbols"):
        overlap_symbols(1000, 2)
    with pytest.raises(ValueError, match="width independent"):
        sq.derive(sq.Model(p=1000, p_star=2, lr=0.1)).entry_symbols
    with pytest.raises(ValueError, match=r"explicit\(\) at p=60"):
        sq.derive(sq.Model(p=60, p_star=2, lr=0.1)).explicit()


def _compile(tmp_path, name, text):
    """Compile `text` with pdflatex; return its log (asserting it compiled)."""
    (tmp_path / name).write_text(text)
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", name],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    assert (tmp_path / name.replace(".tex", ".pdf")).exists()
    return (tmp_path / name.replace(".tex", ".log")).read_text(errors="replace")


def _assert_no_overfull(log):
    bad = [line for line in log.splitlines() if "Overfull \\hbox" in line]
    assert not bad, bad


@needs_pdflatex
@pytest.mark.parametrize("name", sorted(p.name for p in GENERATED_DIR.glob("*.tex")))
def test_committed_latex_compiles_without_overfull_lines(name, tmp_path):
    _assert_no_overfull(_compile(tmp_path, name, (GENERATED_DIR / name).read_text()))


@needs_pdflatex
@pytest.mark.parametrize("args", [
    ["equations"], ["equations", "--p", "2", "--p-star", "2", "--form", "entries"],
    ["equations", "--activation", "z**4 - z"],
    ["invariants"], pytest.param(["invariants", "--p", "4", "--p-star", "3"],
                                 marks=pytest.mark.slow),
    ["invariants", "--p", "2", "--p-star", "3"]])
def test_cli_standalone_documents_compile_without_overfull_lines(args, tmp_path, capsys):
    # the command in this process (its derivations shared with the other tests; the
    # `python -m symquad` process boundary is tested in tests/test_entry_points.py): an
    # interpreter start and SymPy's import less per document, 5.9 -> 3.3 s of CPU for the five
    from symquad.cli import main
    assert main([*args, "--standalone"]) == 0
    _assert_no_overfull(_compile(tmp_path, "doc.tex", capsys.readouterr().out))


@needs_pdflatex
def test_overfull_check_can_fail(tmp_path):
    """The log check sees an overfull display (the failure it guards against)."""
    wide = L.document("\\begin{align*}\nx &= " + " + ".join(f"y_{{{i}}}" for i in range(120))
                      + "\n\\end{align*}")
    log = _compile(tmp_path, "wide.tex", wide)
    with pytest.raises(AssertionError):
        _assert_no_overfull(log)


def test_cli_equations_rejects_bad_input(capsys):
    # in this process: the exit status and both streams (the `python -m symquad` process
    # boundary is tested in tests/test_entry_points.py)
    from symquad.cli import main
    status = main(["equations", "--p", "0"])
    out = capsys.readouterr()
    assert status == 2 and "p must be an integer in [1, 4096]" in out.err and out.out == ""
