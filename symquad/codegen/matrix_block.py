"""Render the block-form matrix kernel for uniform fixed readouts (the classic family).

For ``σ = c z² + c0``, ``σ* = c* z² + c0*`` with *uniform* fixed readouts
``a_k = α``, ``b_m = β`` and no constraint, ``A`` is a scalar on each block, so the
drift of :func:`symquad.symbolic.matrix_form.uniform_matrix_form` — the one
assembly of the moment kinds, expanded block by block — is a sum of scalar ×
word terms in ``Q, ρ, ρᵀ, T``.  Rendering it word by word (each product formed
once, a word and its transpose sharing one product, sums accumulated in place,
unbatched calls without batch axes, traces as Python floats) gives the fastest
kernel for the default model and everything of its family (any ``α``, ``β``,
``c``, ``c*``, weight decay, mini-batch, noise).  Other readouts, a trained
readout or the sphere use the general moment module (``quadratic_matrix.py``).
The two agree to rounding (tests/test_codegen_lean.py).
"""

from __future__ import annotations

import textwrap

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..symbolic.matrix_form import ACT_SYMBOLS, UNIFORM_READOUTS, uniform_matrix_form
from ..symbolic.symbols import P, P_STAR, PARAMS
from .printer import BatchedMatrixPrinter
from .render import _cse, _emit_assignments

__all__ = ["render_uniform_matrix_module", "UNIFORM_ARGS"]

#: Structural arguments of the uniform kernel, after the state and ``params``.
UNIFORM_ARGS = ("p", "p_star", "c", "c_star", "c0", "c0_star", "alpha", "beta")




_MATRIX_HELPERS = """
def _trace(X):
    \"\"\"tr(X) over the last two axes, kept as shape (..., 1, 1).\"\"\"
    return numpy.trace(X, axis1=-2, axis2=-1)[..., None, None]


def _inner(X, Y):
    \"\"\"Σ_ij X_ij Y_ij over the last two axes (= tr(X Yᵀ)), kept as shape (..., 1, 1).\"\"\"
    return numpy.sum(X * Y, axis=(-2, -1))[..., None, None]
"""

#: Letters of the matrix words and their transposes (Q and T are symmetric).
_TRANSPOSED = {"Q": "Q", "T": "T", "rho": "rhoT", "rhoT": "rho"}


def _letters(mat) -> tuple:
    """A product of ``Q, rho, rhoᵀ, T`` as a tuple of letters."""
    if isinstance(mat, sp.MatrixSymbol):
        return (mat.name,)
    if isinstance(mat, sp.Transpose) and isinstance(mat.arg, sp.MatrixSymbol):
        return (_TRANSPOSED[mat.arg.name],)
    if isinstance(mat, sp.MatPow) and mat.exp.is_Integer and mat.exp >= 1:
        return _letters(mat.base) * int(mat.exp)
    if isinstance(mat, sp.MatMul):
        return sum((_letters(a) for a in mat.args), ())
    raise NotImplementedError(f"matrix word {mat!r}")


def _transpose_word(word: tuple) -> tuple:
    return tuple(_TRANSPOSED[x] for x in reversed(word))


def _word_terms(expr, symmetric: bool) -> dict:
    """``{word: scalar coefficient}`` of a sum of (scalar × matrix word) terms.

    With ``symmetric`` a word and its transpose are merged into the smaller of
    the two: the caller then symmetrises, ``½(M + Mᵀ)``, which restores the
    sum exactly (the expression itself is symmetric).
    """
    terms = {}
    for term in (expr.args if isinstance(expr, sp.MatAdd) else (expr,)):
        coeff, mat = term.as_coeff_mmul()
        word = _letters(mat)
        if symmetric:
            word = min(word, _transpose_word(word))
        terms[word] = terms.get(word, 0) + coeff
    return terms


def _dims(word, p=64, k=2):
    """(rows, cols) of a word for the cost model (width p ≫ teacher width k)."""
    size = {"Q": (p, p), "rho": (p, k), "rhoT": (k, p), "T": (k, k)}
    return size[word[0]][0], size[word[-1]][1]


def _product_plan(words) -> list:
    """``[(name, left, right)]``: each needed product formed once, sharing sub-products.

    Words are built shortest first; each is split where the two factors cost
    least, factors already formed costing nothing (so ``Q ρ`` of ``dρ`` is
    reused by ``Q ρ ρᵀ``, ``Q Q`` by ``Q Q Q``).
    """
    formed = {(x,): x for x in _TRANSPOSED}
    plan = []

    def cost(word):
        if word in formed:
            return 0, None
        best = None
        for i in range(1, len(word)):
            left, right = word[:i], word[i:]
            rows, inner = _dims(left)
            cols = _dims(right)[1]
            c = cost(left)[0] + cost(right)[0] + rows * inner * cols
            if best is None or c < best[0]:
                best = (c, i)
        return best

    def build(word):
        if word in formed:
            return formed[word]
        i = cost(word)[1]
        left, right = build(word[:i]), build(word[i:])
        name = "_".join(word)
        plan.append((name, left, right))
        formed[word] = name
        return name

    for word in sorted(words, key=lambda w: (len(w), w)):
        build(word)
    return plan


def _trace_symbols(exprs):
    """Replace every ``Trace(word)`` in `exprs` by a symbol ``tr_<word>``; return both."""
    traces = {}
    for e in exprs:
        for t in e.atoms(sp.Trace):
            word = _letters(t.arg)
            if len(word) > 2:
                raise NotImplementedError(f"trace of a product of {len(word)} matrices")
            traces[t] = (sp.Symbol("tr_" + "_".join(word)), word)
    subs = {t: sym for t, (sym, _) in traces.items()}
    return [e.xreplace(subs) for e in exprs], sorted(traces.values(), key=lambda v: v[0].name)


def _trace_lines(traces, batched):
    """Assignments of the trace symbols: ``tr X`` or ``tr(XY) = Σ X ∘ Yᵀ`` (no product formed)."""
    lines = []
    for sym, word in traces:
        if len(word) == 1:
            value = f"_trace({word[0]})" if batched else f"float(numpy.trace({word[0]}))"
        else:
            x, y = word
            yt = _TRANSPOSED[y]
            if batched:
                value = f"_inner({x}, {yt})"
            else:
                # vdot flattens: Σ_ij X_ij (Yᵀ)_ij = tr(X Y)
                value = f"float(numpy.vdot({x}, {yt}))"
        lines.append(f"    {sym.name} = {value}")
    return lines


def _matrix_body(exprs_terms, printer, batched):
    """Body of the rhs: traces, shared products, scalar coefficients, in-place sums."""
    (dq_terms, drho_terms) = exprs_terms
    coeffs = list(dq_terms.values()) + list(drho_terms.values())
    coeffs, traces = _trace_symbols(coeffs)
    rep, reduced = _cse(coeffs)
    transpose = "numpy.swapaxes(rho, -1, -2)" if batched else "rho.T"
    lines = [f"    rhoT = {transpose}"]
    lines += _trace_lines(traces, batched)
    lines += _emit_assignments(rep, printer)
    plan = _product_plan(list(dq_terms) + list(drho_terms))
    lines += [f"    {name} = {left} @ {right}" for name, left, right in plan]
    name_of = {(x,): x for x in _TRANSPOSED}
    name_of.update({tuple(n.split("_")): n for n, _, _ in plan})
    n_dq = len(dq_terms)
    terms = [("dQ", i, name_of[w], v) for i, (w, v) in enumerate(zip(dq_terms, reduced[:n_dq]))]
    terms += [("drho", i, name_of[w], v)
              for i, (w, v) in enumerate(zip(drho_terms, reduced[n_dq:]))]
    # 2-d path: a product not used by a later term is scaled in place (no
    # temporary); never the inputs Q, rho, T, and never with batch axes (the
    # coefficients there may broadcast the product to a larger shape)
    last_use = {name: n for n, (_, _, name, _) in enumerate(terms)}
    if batched:
        # one expression per output: broadcasts whatever batch axes each input has
        for target in ("dQ", "drho"):
            parts = [f"({printer.doprint(v)})*{name}" for t, _, name, v in terms if t == target]
            lines.append(f"    {target} = " + " + ".join(parts))
        terms = []
    for n, (target, i, name, value) in enumerate(terms):
        coeff = printer.doprint(value)
        if name not in _TRANSPOSED and last_use[name] == n:
            lines.append(f"    {name} *= {coeff}")
            lines.append(f"    {target} = {name}" if i == 0 else f"    {target} += {name}")
        else:
            lines.append(f"    {target} {'=' if i == 0 else '+='} ({coeff})*{name}")
    lines.append("    # words were merged with their transposes: ½(M + Mᵀ) restores the sum")
    if batched:
        lines.append("    dQ = 0.5 * (dQ + numpy.swapaxes(dQ, -1, -2))")
    else:
        lines.append("    dQ += dQ.T")
        lines.append("    dQ *= 0.5")
    lines.append("    return dQ, drho, None")
    return lines


def _risk_body(risk, printer, batched):
    (risk,), traces = _trace_symbols([risk])
    rep, (value,) = _cse([risk])
    lines = _trace_lines(traces, batched)
    lines += _emit_assignments(rep, printer)
    tail = "[..., 0, 0]" if batched else ""
    lines.append(f"    return ({printer.doprint(value)}){tail}")
    return lines




def render_uniform_matrix_module() -> str:
    """The block-form kernel module for uniform fixed readouts (see the module docstring)."""
    eqs = uniform_matrix_form()
    printer = BatchedMatrixPrinter()
    terms = (_word_terms(eqs.dQ, symmetric=True), _word_terms(eqs.drho, symmetric=False))
    params = ", ".join(s.name for s in PARAMS)
    args = ", ".join(UNIFORM_ARGS)
    doc = textwrap.dedent('''\
        """Block-form matrix kernels for σ = c z² + c0, σ* = c* z² + c0*, uniform fixed readouts.

        Derived by symquad.symbolic.matrix_form.uniform_matrix_form (the moment
        kinds combined by the one assembly of the drift, expanded block by block
        for readouts a_k = alpha, b_m = beta) and rendered by
        symquad.codegen.matrix_block; width independent, cost O((p + p*)^3):
        dQ/dt and dρ/dt are sums of scalar × matrix-word terms, each product
        formed once.

        Argument layout (every array may carry the same leading batch dimensions;
        2-d arguments take a path without batch axes):
            Q      (..., p, p)    student-student overlaps  W Wᵀ/N
            rho    (..., p, p*)   student-teacher overlaps  W W*ᵀ/N
            T      (..., p*, p*)  teacher-teacher overlaps  W* W*ᵀ/N
            params tuple          PARAMS, in this order (symquad.Model.kernel_params)
            p, p_star             widths
            c, c_star, c0, c0_star  coefficients of σ and σ*
            alpha, beta           the uniform readouts a_k and b_m
        Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", _MATRIX_HELPERS, "",
           "PARAMS = " + repr(tuple(s.name for s in PARAMS)),
           "UNIFORM_ARGS = " + repr(UNIFORM_ARGS), "", "",
           f"def risk(Q, rho, T, {args}):",
           '    """Population risk ε = ½ E[(ŷ − y_clean)²]; shape (...,)."""',
           "    if Q.ndim == 2 and rho.ndim == 2 and T.ndim == 2:",
           f"        return _risk_single(Q, rho, T, {args})",
           f"    return _risk_batched(Q, rho, T, {args})",
           "", "",
           f"def rhs(Q, rho, T, params, {args}):",
           '    """ODE right-hand side: (dQ/dt, dρ/dt, None) with the shapes of Q and rho."""',
           "    if (Q.ndim == 2 and rho.ndim == 2 and T.ndim == 2 and Q.dtype.kind == \'f\'",
           "            and rho.dtype.kind == \'f\'):",
           f"        return _rhs_single(Q, rho, T, params, {args})",
           f"    return _rhs_batched(Q, rho, T, params, {args})"]
    for batched, suffix, what in ((False, "single", "2-d arguments"),
                                  (True, "batched", "arguments with batch axes")):
        out += ["", "", f"def _risk_{suffix}(Q, rho, T, {args}):",
                f'    """:func:`risk` for {what}."""']
        out += _risk_body(eqs.risk, printer, batched)
        out += ["", "", f"def _rhs_{suffix}(Q, rho, T, params, {args}):",
                f'    """:func:`rhs` for {what}."""',
                f"    {params} = params"]
        out += _matrix_body(terms, printer, batched)
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)
