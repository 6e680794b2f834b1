"""LaTeX rendering of derived equations (deterministic: same input, same text)."""

from __future__ import annotations

import sympy as sp

from .symbols import latex_names

__all__ = ["equations_latex", "document"]

_PREAMBLE = r"""\documentclass{article}
\usepackage{amsmath,amssymb}
\usepackage[margin=1.5cm,landscape]{geometry}
\allowdisplaybreaks
\begin{document}
"""


def document(body: str, title: str | None = None) -> str:
    """Wrap ``body`` in a minimal compilable article."""
    head = f"\\section*{{{title}}}\n" if title else ""
    return _PREAMBLE + head + body + "\n\\end{document}\n"


def _tex(expr, names) -> str:
    text = sp.latex(expr, symbol_names=names, mat_symbol_style="plain",
                    mul_symbol=None, long_frac_ratio=3)
    # MatAdd prints a negative term as "+ -"; fold it into a minus sign
    return text.replace("+ -", "- ")


def _tex_long(expr, names, per_line: int = 4) -> str:
    """LaTeX of a sum broken into aligned lines of ``per_line`` terms (for ``align*``)."""
    terms = sp.Add.make_args(sp.expand(expr)) if not isinstance(expr, sp.MatrixExpr) \
        else sp.MatAdd.make_args(expr)
    if len(terms) <= per_line:
        return _tex(expr, names)
    ordered = sorted(terms, key=sp.default_sort_key)
    pieces = [_tex(t, names) for t in ordered]
    lines = []
    for start in range(0, len(pieces), per_line):
        chunk = " + ".join(pieces[start:start + per_line]).replace("+ -", "- ")
        if start and not chunk.startswith("-"):
            chunk = "+ " + chunk
        lines.append(chunk)
    return " \\\\\n&\\quad ".join(lines)


def _model_line(model) -> str:
    sigma = sp.latex(sp.sympify(model.activation_str, locals={"z": sp.Symbol("z")}))
    eta = (r"\eta = \mathrm{lr}" if model.lr_scaling == "fixed"
           else r"\eta = \mathrm{lr}\cdot p")
    extra = "".join(f"; {name}={model._field_text(name)}" for name in model.changed_fields())
    return (f"% model: p={model.p}, p*={model.p_star}, sigma(z)={model.activation_str}, "
            f"lr={model.lr!r} ({model.lr_scaling}), noise={model.noise!r}{extra}\n"
            f"\\noindent Model: $\\sigma(z) = {sigma}$, $p = {model.p}$, "
            f"$p^* = {model.p_star}$, ${eta}$, label-noise variance $\\Delta$. "
            "Time $t$ = steps$/N$.\n")


_TENSOR_INTRO = (
    "% tensor form: width-independent sums over field indices\n"
    "\\noindent Fields $u = (\\lambda_1, \\dots, \\lambda_p, \\nu_1, \\dots, \\nu_{p^*})$, "
    "$n = p + p^*$, covariance $C = \\begin{pmatrix} Q & \\rho \\\\ \\rho^T & T "
    "\\end{pmatrix}$ ($C_{aa}$: variances), output weights $w_a = a_a$ (the student readout) "
    "for students ($a \\le p$) and $w_a = -b_{a-p}$ (the teacher readout) for teachers. "
    "Students $k, l \\le p$; teacher $m$ is "
    "field $p + m$. The functions below are $I_2(a,b) = E[\\sigma(u_a)\\sigma(u_b)]$, "
    "$J_2(k,l) = E[\\sigma'(u_k)\\sigma'(u_l)]$, $I_3(k,j,a) = E[\\sigma'(u_k)\\,u_j\\,"
    "\\sigma(u_a)]$, $I_4(k,l,a,b) = E[\\sigma'(u_k)\\sigma'(u_l)\\sigma(u_a)\\sigma(u_b)]$ "
    "of the covariance of the fields they name; they hold for coincident indices too.\n")


def _tensor_lines(eq, names):
    """``align*`` lines of the tensor form: each I-function once, then ε and the ODEs."""
    lines = [f"{_tex(fn, names)} &= {_tex_long(value, names, per_line=4)}"
             for fn, value in eq.definitions.items()]
    Qkl, rkm = sp.Symbol("Q_{kl}"), sp.Symbol(r"\rho_{km}")
    lines.append(r"\varepsilon &= " + _tex(eq.risk, names))
    lines.append(f"{_tex(sp.Derivative(Qkl, sp.Symbol('t')), names)} &= {_tex(eq.dQ, names)}")
    lines.append(f"{_tex(sp.Derivative(rkm, sp.Symbol('t')), names)} &= {_tex(eq.drho, names)}")
    if eq.da is not None:
        ak = sp.Symbol("a_{k}")
        lines.append(f"{_tex(sp.Derivative(ak, sp.Symbol('t')), names)} &= {_tex(eq.da, names)}")
    return _TENSOR_INTRO, lines


def equations_latex(eq, standalone: bool = False) -> str:
    """LaTeX for the risk and the ODEs of an :class:`~symquad.symbolic.derive.Equations`."""
    model = eq.model
    names = latex_names(model.p, model.p_star)
    lines = [r"\varepsilon &= " + _tex_long(eq.risk, names)]
    if eq.form == "matrix":
        from .matrix_form import display_form
        definitions, risk, dQ, drho = display_form(model)
        for tau in definitions:
            names[tau] = rf"\tau_{{{tau.name.split('_')[1]}}}"
        lines = [f"{_tex(tau, names)} &= {_tex(value, names)}"
                 for tau, value in definitions.items()]
        lines.append(r"\varepsilon &= " + _tex(risk, names))
        lines.append(r"\frac{dQ}{dt} &= " + _tex_long(dQ, names, per_line=3))
        lines.append(r"\frac{d\rho}{dt} &= " + _tex(drho, names))
        if eq.da is not None:
            lines.append(r"\frac{da}{dt} &= " + _tex(eq.da, names))
        intro = ("% matrix form: Q (p x p), rho (p x p*), T (p* x p*); "
                 "width-independent\n")
    elif eq.form == "tensor":
        intro, lines = _tensor_lines(eq, names)
    else:
        intro = "% entry-by-entry form\n"
        Q, rho, _ = eq.symbols
        for i in range(model.p):
            for j in range(i, model.p):
                lhs = _tex(sp.Derivative(Q[i, j], sp.Symbol("t")), names)
                lines.append(f"{lhs} &= " + _tex_long(eq.dQ[i, j], names))
        for i in range(model.p):
            for m in range(model.p_star):
                lhs = _tex(sp.Derivative(rho[i, m], sp.Symbol("t")), names)
                lines.append(f"{lhs} &= " + _tex_long(eq.drho[i, m], names))
        if eq.da is not None:
            from .symbols import readout_symbols
            for i, a in enumerate(readout_symbols(model.p, model.p_star)[0]):
                lhs = _tex(sp.Derivative(a, sp.Symbol("t")), names)
                lines.append(f"{lhs} &= " + _tex_long(eq.da[i, 0], names))
    body = intro + _model_line(model) + "\\begin{align*}\n" + " \\\\\n".join(lines) \
        + "\n\\end{align*}\n"
    if standalone:
        return document(body, title=f"symquad equations ({eq.form} form)")
    return body
