"""Render the generated numpy kernel modules (pure functions of their input).

Every generated file is produced by :func:`render_all`, which both
``symquad regenerate`` and the drift test (``symquad regenerate --check``)
call, so what is committed and what is checked cannot diverge.  Output is
deterministic: canonical CSE (``sympy.cse(order="canonical")``), symbols
unpacked in sorted order, no timestamps or versions, a fixed banner.
"""

from __future__ import annotations

import textwrap

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..spec import Model
from ..symbolic.entries import derive_entries
from ..symbolic.matrix_form import ACT_SYMBOLS, KAPPA, matrix_moments, word_level
from ..symbolic.symbols import PARAMS, overlap_symbols, readout_symbols
from .printer import BatchedMatrixPrinter, ScalarPrinter

__all__ = ["BANNER", "CANONICAL_ENTRY_MODELS", "render_matrix_module", "render_entries_module",
           "entries_module_name"]


#: Models whose entry-by-entry kernels are committed (σ = z²).  Any other
#: model gets its entry kernels generated on demand into the kernel cache.
CANONICAL_ENTRY_MODELS = tuple(
    Model(p=p, p_star=k, lr=1.0) for p, k in ((1, 1), (2, 1), (2, 2), (3, 2), (3, 3)))



def _cse(exprs):
    return sp.cse(exprs, symbols=sp.numbered_symbols("x"), order="canonical")


def _emit_assignments(replacements, printer, indent="    "):
    lines = []
    for sym, value in replacements:
        lines.append(f"{indent}{sym} = {printer.doprint(value)}")
    return lines


# ---- matrix form: words of the combined covariance, A as a vector of weights ---------

def _word_code(word: tuple, rows: str, cols: str, lines: list, formed: dict) -> str:
    """Name of an array holding ``word[rows, cols]`` (letters ``C`` and ``A``), formed once.

    ``A`` is the diagonal ``diag(wA)``: right multiplication scales columns.
    Words start and end with ``C``; prefixes are shared between words.
    """
    key = (word, rows, cols)
    if key in formed:
        return formed[key]
    if word == ("C",):
        name = {(":p", ":"): "C_p", (":p", ":p"): "C_pp"}[(rows, cols)]
        formed[key] = name
        return name
    if cols == ":p" and (word, rows, ":") in formed:
        name = "_".join(word) + "_pp"
        lines.append(f"    {name} = {formed[(word, rows, ':')]}[..., :, :p]")
        formed[key] = name
        return name
    prefix = _word_code(word[:-2], rows, ":", lines, formed)     # ends with C
    name = "_".join(word) + ("_p" if cols == ":" else "_pp")
    right = "C" if cols == ":" else "C[..., :, :p]"
    lines.append(f"    {name} = ({prefix} * wA[..., None, :]) @ {right}")
    formed[key] = name
    return name


def _trace_code(word: tuple) -> str:
    """``tr(word)`` of a canonical trace word (``A C``, ``A C A C``, …) as numpy code."""
    if word == ("A", "C"):
        return "(wA * numpy.diagonal(C, axis1=-2, axis2=-1)).sum(-1)"
    if len(word) % 4 == 0 and word == ("A", "C") * (len(word) // 2):
        half = len(word) // 2
        # tr((AC)^{2h}) = Σ (CA)^h ∘ ((CA)^h)ᵀ with CA = C·diag(wA)
        power = "CA" if half == 2 else None
        if power is None:  # pragma: no cover - longer traces do not occur for quadratic σ
            raise NotImplementedError(f"trace of {word}")
        return "(CA * numpy.swapaxes(CA, -1, -2)).sum((-2, -1))"
    raise NotImplementedError(f"trace of {word}")  # pragma: no cover


def _matrix_moment_lines(printer) -> list:
    """Body of the matrix module's ``moments``: traces, words, then G, Gt, B, R."""
    words = word_level()
    recipes = matrix_moments()
    lines = ["    C, p = _engine.combine(Q, rho, T)",
             "    a = numpy.asarray(a, dtype=float)",
             "    b = numpy.asarray(b, dtype=float)",
             "    wA = _engine.weights(c * a, c_star * b)",
             "    kappa = c0 * a.sum(-1) - c0_star * b.sum(-1)",
             "    CA = C * wA[..., None, :]",
             "    C_p = C[..., :p, :]",
             "    C_pp = C[..., :p, :p]"]
    traces = sorted({s for key in ("outer1", "outer2", "scalar1") for c in
                     ([words[key]] if key == "scalar1" else words[key].values())
                     for s in sp.sympify(c).free_symbols if s.name.startswith("tr(")},
                    key=lambda s: s.name)
    tr_names = {}
    for t in traces:
        name = "tr_" + t.name[3:-1]
        tr_names[t] = sp.Symbol(name)
        lines.append(f"    {name} = {_trace_code(tuple(t.name[3:-1]))}")
    formed = {}
    scalars = {}

    def matrix_sum(key, cols, factor):
        """factor * Σ coeff·word[rows :p, cols] with batch-broadcast scalar coefficients."""
        parts = []
        for word, coeff in sorted(words[key].items(), key=lambda kv: len(kv[0])):
            name = _word_code(word, ":p", cols, lines, formed)
            value = sp.expand(factor * coeff).xreplace(tr_names)
            parts.append((value, name))
        return parts

    c, c_star, c0, c0_star = ACT_SYMBOLS
    kinds = {"G": ("outer1", ":"), "B": ("outer2", ":p")}
    out = {}
    for kind, (key, cols) in kinds.items():
        (coeff, _, _, _), = recipes[kind]
        out[kind] = matrix_sum(key, cols, coeff)
    # every scalar coefficient: (...,) arrays, broadcast as (..., 1, 1)
    flat = [v for kind in out for v, _ in out[kind]]
    r_coeffs = recipes["R"]
    r_diag = [(sp.expand(coeff * cw).xreplace(tr_names), w) for coeff, what, _, _ in r_coeffs
              if what == "outer" for w, cw in words["outer1"].items()]
    r_scalar = [sp.expand(coeff * words["scalar1"]).xreplace(tr_names)
                for coeff, what, _, _ in r_coeffs if what == "scalar"]
    reps, reduced = sp.cse(flat + [v for v, _ in r_diag] + r_scalar,
                           symbols=sp.numbered_symbols("s"), order="canonical")
    lines += [f"    {sym} = {printer.doprint(val)}" for sym, val in reps]
    pos = 0
    coefficients = {}
    for kind in ("G", "B"):
        terms = []
        for _, name in out[kind]:
            coefficients.setdefault(kind, []).append(printer.doprint(reduced[pos]))
            terms.append(f"_col({printer.doprint(reduced[pos])}) * {name}")
            pos += 1
        lines.append(f"    {kind} = " + " + ".join(terms))
    # legs: the covariances of further Gaussian variables with the fields replace the last C
    # of each word of G (the field u_j enters E[σ'(λ_k) u_j δ] linearly, through C_·j)
    leg_terms = []
    for coeff, (word, _) in zip(coefficients["G"], sorted(words["outer1"].items(),
                                                          key=lambda kv: len(kv[0]))):
        if word == ("C",):
            leg = "legs[..., :p, :]"
        else:
            prefix = _word_code(word[:-2], ":p", ":", lines, formed)
            leg = f"(({prefix} * wA[..., None, :]) @ legs)"
        leg_terms.append(f"_col({coeff}) * {leg}")
    lines += ["    if legs is not None:",
              "        G, Gt = " + " + ".join(leg_terms) + ", None",
              "    else:",
              "        Gt = G[..., :, p:]",
              "        G = G[..., :, :p]",
              "    if not readout:", "        return G, Gt, B, None"]
    diag_terms = []
    for _, word in r_diag:
        name = _word_code(word, ":p", ":p", lines, formed)
        diag_terms.append(f"_vec({printer.doprint(reduced[pos])}) * "
                          f"numpy.diagonal({name}, axis1=-2, axis2=-1)")
        pos += 1
    scalar_terms = [f"_vec({printer.doprint(reduced[pos + i])})"
                    for i in range(len(r_scalar))]
    lines.append("    R = " + " + ".join(diag_terms + scalar_terms))
    lines.append("    return G, Gt, B, R")
    return lines


def _matrix_risk_lines(printer) -> list:
    risk = word_level()["risk"]
    traces = sorted((s for s in risk.free_symbols if s.name.startswith("tr(")),
                    key=lambda s: s.name)
    lines = ["    C, p = _engine.combine(Q, rho, T)",
             "    a = numpy.asarray(a, dtype=numpy.longdouble)",
             "    b = numpy.asarray(b, dtype=numpy.longdouble)",
             "    C = C.astype(numpy.longdouble)",
             "    wA = _engine.weights(c * a, c_star * b, numpy.longdouble)",
             "    kappa = c0 * a.sum(-1) - c0_star * b.sum(-1)",
             "    CA = C * wA[..., None, :]"]
    names = {}
    for t in traces:
        names[t] = sp.Symbol("tr_" + t.name[3:-1])
        lines.append(f"    {names[t]} = {_trace_code(tuple(t.name[3:-1]))}")
    lines.append(f"    return numpy.asarray({printer.doprint(risk.xreplace(names))}, dtype=float)")
    return lines


def render_matrix_module() -> str:
    """The width-independent moment kernel module for quadratic activations.

    The moment kinds ``G, Gt, B, R`` of :mod:`symquad.symbolic.moments` as words
    of the combined covariance ``C`` with the diagonal ``A = diag(c a, −c* b)``
    (:mod:`symquad.symbolic.matrix_form`); each word's student rows are formed
    once, prefixes shared; the risk in extended precision (the student and
    teacher terms cancel near zero risk).
    """
    printer = ScalarPrinter()
    doc = textwrap.dedent('''\
        """Matrix-form moment kernels for σ(z) = c z² + c0, σ*(z) = c* z² + c0*, any width.

        Derived by symquad.symbolic.matrix_form (Wick contraction of quadratic
        forms, E[δ^m z zᵀ] as words in C and A = diag(c a, −c* b)); cost
        O((p + p*)^3) per call.  The moments are combined into the ODE by the
        generated assembly (symquad._generated.assembly).

        Argument layout (every array may carry the same leading batch dimensions):
            Q      (..., p, p)    student-student overlaps  W Wᵀ/N
            rho    (..., p, p*)   student-teacher overlaps  W W*ᵀ/N
            T      (..., p*, p*)  teacher-teacher overlaps  W* W*ᵀ/N
            a      (..., p)       student readout
            b      (..., p*)      teacher readout
            Delta  float          label-noise variance Δ
            c, c_star, c0, c0_star  float   coefficients of σ and σ*
        Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import tensor_engine as _engine",
           "", "ACTIVATION_ARGS = ('c', 'c_star', 'c0', 'c0_star')", "", "",
           "def _col(x):",
           '    """A scalar per batch element as shape (..., 1, 1)."""',
           "    return numpy.asarray(x, dtype=float)[..., None, None]", "", "",
           "def _vec(x):",
           '    """A scalar per batch element as shape (..., 1)."""',
           "    return numpy.asarray(x, dtype=float)[..., None]", "", "",
           "def moments(Q, rho, T, a, b, Delta, readout, c, c_star, c0, c0_star, legs=None):",
           '    """Moment kinds (G, Gt, B, R) at (Q, rho, T); R is None unless readout.',
           "",
           "    With legs (..., n, m), the covariances of further Gaussian variables with the",
           "    fields, G is E[σ'(λ_k) μ_j δ] (..., p, m) of those legs and Gt is None.",
           '    """']
    out += _matrix_moment_lines(printer)
    out += ["", "", "def risk(Q, rho, T, a, b, c, c_star, c0, c0_star):",
            '    """Population risk ε = ½ E[(ŷ − y_clean)²] (extended precision); shape (...,)."""']
    out += _matrix_risk_lines(printer)
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)


def entries_module_name(model: Model) -> str:
    """Module name of a committed entry-kernel module (quadratic models only)."""
    return f"entries_p{model.p}_k{model.p_star}"


def _unpack(symbols, name_of):
    lines = []
    for s in sorted(symbols, key=lambda s: s.name):
        lines.append(f"    {s.name} = {name_of(s)}")
    return lines


def render_entries_module(model: Model) -> str:
    """Entry-by-entry kernel module of ``model``'s structure (any polynomial activations).

    Readouts and every learning parameter are arguments: the module serves all
    models with the same widths, activations, constraint and trained/fixed
    readout (:attr:`symquad.Model.structure_key`).
    """
    risk, dQ, drho, da = derive_entries(model)
    p, k = model.p, model.p_star
    Qs, Rs, Ts = overlap_symbols(p, k)
    a_syms, b_syms = readout_symbols(p, k)
    where = {}
    for mat, arg in ((Qs, "Q"), (Rs, "rho"), (Ts, "T")):
        for i in range(mat.rows):
            for j in range(mat.cols):
                where.setdefault(mat[i, j], f"{arg}[..., {i}, {j}]")
    for syms, arg in ((a_syms, "a"), (b_syms, "b")):
        for i, sym in enumerate(syms):
            where[sym] = f"{arg}[..., {i}]"
    printer = ScalarPrinter()
    upper = [(i, j) for i in range(p) for j in range(i, p)]
    flat = [dQ[i, j] for i, j in upper] + [drho[i, m] for i in range(p) for m in range(k)]
    if da is not None:
        flat += [da[i, 0] for i in range(p)]
    rep_r, (risk_r,) = _cse([risk])
    rep_f, red_f = _cse(flat)
    act = f"activation={model.activation_str!r}"
    if not model.is_default("teacher_activation"):
        act += f", teacher_activation={model.teacher_activation_str!r}"
    if model.constraint != "none":
        act += f", constraint={model.constraint!r}"
    readout = "trained" if model.readout_trained else "fixed"
    doc = textwrap.dedent(f'''\
        """Entry-by-entry kernels of Model(p={p}, p_star={k}, {act}), {readout} readout.

        Derived by symquad.symbolic.entries (Wick/Isserlis expectations of the
        drift of symquad.symbolic.update, entry by entry); the readouts and the
        learning parameters are arguments.

        Argument layout (leading batch dimensions allowed):
            Q      (..., {p}, {p})   student-student overlaps  W Wᵀ/N
            rho    (..., {p}, {k})   student-teacher overlaps  W W*ᵀ/N
            T      (..., {k}, {k})   teacher-teacher overlaps  W* W*ᵀ/N
            a      (..., {p})      student readout
            b      (..., {k})      teacher readout
            params tuple       PARAMS, in this order (symquad.Model.kernel_params)
        Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "", f"P = {p}", f"P_STAR = {k}",
           f"ACTIVATION = {model.activation_str!r}",
           f"TEACHER_ACTIVATION = {model.teacher_activation_str!r}",
           f"CONSTRAINT = {model.constraint!r}",
           f"TRAINED_READOUT = {model.readout_trained!r}",
           "PARAMS = " + repr(tuple(x.name for x in PARAMS)), "", "",
           "def risk(Q, rho, T, a, b):",
           '    """Population risk ε = ½ E[(ŷ − y_clean)²]; shape (...,)."""']
    out += _unpack(risk.free_symbols, where.__getitem__)
    out += _emit_assignments(rep_r, printer)
    out.append(f"    return numpy.asarray({printer.doprint(risk_r)}, dtype=float)")
    used = set().union(*(e.free_symbols for e in flat)) - set(PARAMS)
    out += ["", "", "def rhs(Q, rho, T, a, b, params):",
            '    """ODE right-hand side: (dQ/dt, dρ/dt, da/dt) (da None for a fixed readout)."""',
            "    Q = numpy.asarray(Q, dtype=float)",
            "    rho = numpy.asarray(rho, dtype=float)",
            "    T = numpy.asarray(T, dtype=float)",
            "    a = numpy.asarray(a, dtype=float)",
            "    b = numpy.asarray(b, dtype=float)",
            "    " + ", ".join(x.name for x in PARAMS) + " = params"]
    out += _unpack(used, where.__getitem__)
    out += _emit_assignments(rep_f, printer)
    out.append("    zero = numpy.zeros(numpy.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], "
               "T.shape[:-2], a.shape[:-1], b.shape[:-1]))")
    out.append("    dQ = numpy.empty(zero.shape + (P, P))")
    out.append("    drho = numpy.empty(zero.shape + (P, P_STAR))")
    for n, (i, j) in enumerate(upper):
        val = printer.doprint(red_f[n])
        out.append(f"    dQ[..., {i}, {j}] = zero + ({val})")
        if i != j:
            out.append(f"    dQ[..., {j}, {i}] = dQ[..., {i}, {j}]")
    base = len(upper)
    for n, (i, m) in enumerate((i, m) for i in range(p) for m in range(k)):
        out.append(f"    drho[..., {i}, {m}] = zero + ({printer.doprint(red_f[base + n])})")
    if da is None:
        out.append("    return dQ, drho, None")
    else:
        base += p * k
        out.append("    da = numpy.empty(zero.shape + (P,))")
        for i in range(p):
            out.append(f"    da[..., {i}] = zero + ({printer.doprint(red_f[base + i])})")
        out.append("    return dQ, drho, da")
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)
