r"""LaTeX rendering of derived equations (deterministic: same input, same text).

The output is meant to be pasted into a paper:

* notation: ``\rho^\top`` for transposes, ``\operatorname{tr}(Q^2)``, ``C_{ab}``,
  ``\sum_{a,b=1}^{n}``, ``\frac{dQ_{kl}}{dt}``; the traces of the matrix form are
  named ``m_n = \operatorname{tr}((AC)^n)`` (``τ`` is the ``steps·η/(pN)`` clock
  of docs/model.md);
* order: every right-hand side is collected in powers of the step size ``η``
  (the gradient-flow part, then the ``η²`` part), each group with its common
  factor taken out; terms are sorted by degree, then ``Q`` before ``ρ`` before
  ``T`` and by index;
* the four-point functions of the tensor form are factored: one term per
  monomial in the off-diagonal covariances, times a factored polynomial in
  the variances;
* long right-hand sides are broken into lines that fit a 453 pt text width
  (A4, 2.5 cm margins; narrower than most journal pages' full width), measured
  with :func:`tex_width`.

Printing is width independent: it names only the symbols that occur in the
expressions, so ``symquad equations --p 1000`` costs what ``--p 4`` does.
"""

from __future__ import annotations

import re

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.latex import LatexPrinter

from .blocks import CB, FS, MGB, MGTB, QBf, QTf, RHOBf, TR_SIGMA
from .moments import MB, MG, MR
from .symbols import ETA, NOISE, P, P_STAR, XI, latex_names_for
from .update import UNITS, Af
from .._describe import describe_model
from .symbols import readout_symbols
from ..spec import activation_label, error_signal_weight
from .matrix_form import display_form

__all__ = ["equations_latex", "document", "tex_width", "display_rhs", "align_rows",
           "LINE_WIDTH_PT", "TEXT_WIDTH_PT", "to_latex"]

#: Text width of :func:`document` (A4 portrait, 2.5 cm margins, 10 pt), in TeX points.
TEXT_WIDTH_PT = 453.0
#: Width a displayed line may take (a margin for the estimate of :func:`tex_width`).
LINE_WIDTH_PT = 410.0

_PREAMBLE = r"""\documentclass{article}
\usepackage{amsmath,amssymb}
\usepackage[a4paper,margin=2.5cm]{geometry}
\allowdisplaybreaks
\begin{document}
"""


def document(body: str, title: str | None = None) -> str:
    """Wrap ``body`` in a minimal compilable article (A4, 2.5 cm margins)."""
    head = f"\\section*{{{title}}}\n" if title else ""
    return _PREAMBLE + head + body + "\n\\end{document}\n"


# ---------------------------------------------------------------------------
# the printer
# ---------------------------------------------------------------------------
class _Printer(LatexPrinter):
    r"""SymPy's LaTeX printer with the notation of a paper (``^\top``, ``C_{ab}``, ...)."""

    def _print_Transpose(self, expr):
        arg = expr.arg
        base = self._print(arg)
        if not isinstance(arg, (sp.MatrixSymbol, sp.Symbol)):
            base = rf"\left({base}\right)"
        return base + r"^\top"

    def _print_Indexed(self, expr):
        label = self._print(expr.base.label)
        idx = [self._print(i) for i in expr.indices]
        sep = "" if all(len(i) == 1 for i in idx) else ","
        return f"{label}_{{{sep.join(idx)}}}"

    def _print_Trace(self, expr):
        return rf"\operatorname{{tr}}({self._print(expr.arg)})"

    def _print_DiagonalOf(self, expr):
        # the diagonal of a matrix as a column (a trained readout's drift)
        return rf"\operatorname{{diag}}\left({self._print(expr.arg)}\right)"

    def _print_MatMul(self, expr):
        # runs of one factor print as a power: Q Q -> Q^{2}
        coeff, factors = expr.as_coeff_mmul()
        merged = []
        for f in factors.args if isinstance(factors, sp.MatMul) else (factors,):
            if merged and merged[-1][0] == f:
                merged[-1][1] += 1
            else:
                merged.append([f, 1])
        if any(n > 1 for _, n in merged):
            parts = [self._print(f) if n == 1 else f"{self._print(f)}^{{{n}}}"
                     for f, n in merged]
            head = "" if coeff == 1 else ("-" if coeff == -1 else self._print(coeff) + " ")
            return head + " ".join(parts)
        return super()._print_MatMul(expr)

    def _print_Sum(self, expr):
        limits = expr.limits
        ranges = {(lo, hi) for _, lo, hi in limits}
        if len(ranges) != 1:
            return super()._print_Sum(expr)
        (lo, hi), = ranges
        names = ",".join(self._print(v) for v, _, _ in limits)
        body = self._print(expr.function)
        if isinstance(expr.function, sp.Add):
            body = rf"\left({body}\right)"
        return rf"\sum_{{{names}={self._print(lo)}}}^{{{self._print(hi)}}} {body}"

    def _print_Derivative(self, expr):
        if len(expr.variable_count) == 1 and expr.variable_count[0][1] == 1:
            var = self._print(expr.variable_count[0][0])
            return rf"\frac{{d{self._print(expr.expr)}}}{{d{var}}}"
        return super()._print_Derivative(expr)

    def _print_Pow(self, expr):
        # p^{*} squared prints as p^{*2}, not \left(p^{*}\right)^{2}
        base, exp = expr.as_base_exp()
        if isinstance(base, sp.Symbol) and exp.is_Integer and exp > 1:
            name = self._print(base)
            m = re.fullmatch(r"(.+)\^\{(.+)\}", name)
            if m:
                return f"{m.group(1)}^{{{m.group(2)}{exp}}}"
        return super()._print_Pow(expr)

    def _print_Function(self, expr, exp=None):
        if isinstance(expr, AppliedUndef):
            name = self._deal_with_super_sub(expr.func.__name__)
            args = ",".join(self._print(a).replace(" ", "") for a in expr.args)
            text = f"{name}({args})"
            return text if exp is None else f"{text}^{{{exp}}}"
        return super()._print_Function(expr, exp)


def _clean(text: str) -> str:
    """Fold ``+ -`` into a minus and collapse the double spaces SymPy leaves."""
    text = text.replace("+ -", "- ")
    return re.sub(r" {2,}", " ", text)


def to_latex(expr, names: dict | None = None) -> str:
    """LaTeX of one expression with symquad's notation (no line breaking)."""
    if names is None:
        names = latex_names_for(expr.free_symbols) if hasattr(expr, "free_symbols") else {}
    printer = _Printer({"symbol_names": names, "mat_symbol_style": "plain",
                        "mul_symbol": None, "long_frac_ratio": 3, "mat_delim": "("})
    return _clean(printer.doprint(expr))


# ---------------------------------------------------------------------------
# width of a piece of math, in points (for line breaking)
# ---------------------------------------------------------------------------
_GLYPH = 5.6          # an average italic letter or digit at 10 pt
_BINARY = 12.2        # "+" or "-" with its medium spaces
_RELATION = 13.4      # "=" with its thick spaces
_COMMAND_WIDTH = {
    "quad": 10.0, "qquad": 20.0, ",": 1.7, ":": 2.2, ";": 2.8, "!": -1.7, " ": 3.3,
    "cdot": _BINARY, "times": _BINARY, "leq": _RELATION, "geq": _RELATION, "neq": _RELATION,
    "le": _RELATION, "ge": _RELATION, "approx": _RELATION, "equiv": _RELATION,
    "iff": 30.0, "to": _RELATION, "ldots": 13.0, "dots": 13.0, "cdots": 13.0,
    "sum": 14.4, "prod": 14.4, "top": 7.8, "infty": 10.0, "partial": 5.7, "varepsilon": 4.7,
    "left": 0.0, "right": 0.0, "big": 0.0, "Big": 0.0, "bigg": 0.0, "Bigg": 0.0,
    "displaystyle": 0.0, "textstyle": 0.0, "nonumber": 0.0, "notag": 0.0,
}
_SCRIPT = 0.72        # script size relative to text size


class _Measure:
    """A small recursive reader of LaTeX math that adds up glyph widths (an estimate)."""

    def __init__(self, text):
        self.s, self.i = text, 0

    def _peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def _command(self):
        j = self.i + 1
        if j < len(self.s) and not self.s[j].isalpha():
            self.i = j + 1
            return self.s[j]
        k = j
        while k < len(self.s) and self.s[k].isalpha():
            k += 1
        self.i = k
        return self.s[j:k]

    def _group(self):
        """Width of the next argument: a ``{...}`` group or a single token."""
        while self._peek() == " ":
            self.i += 1
        if self._peek() == "{":
            self.i += 1
            w = self.sequence("}")
            self.i += 1
            return w
        return self.atom()

    def _delimiter(self):
        while self._peek() == " ":
            self.i += 1
        if self._peek() == "\\":
            name = self._command()
            return 0.0 if name in (".",) else 5.5
        c = self._peek()
        self.i += 1
        return 0.0 if c == "." else 6.0

    def atom(self):
        c = self._peek()
        if not c:
            return 0.0
        if c == "\\":
            name = self._command()
            if name in ("frac", "dfrac", "binom"):
                a, b = self._group(), self._group()
                return max(a, b) + (9.0 if name == "binom" else 2.8)
            if name == "tfrac":
                a, b = self._group(), self._group()
                return _SCRIPT * max(a, b) + 2.0
            if name in ("left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr",
                        "Bigl", "Bigr"):
                return self._delimiter()
            if name in ("operatorname", "mathrm", "text", "mathit", "mathbf", "mathcal",
                        "mathbb", "boldsymbol"):
                w = self._group()
                return w + (1.7 if name == "operatorname" else 0.0)
            if name in ("sum", "prod"):
                return self._big_operator(_COMMAND_WIDTH[name])
            if name == "substack":
                return max(_Measure(line).sequence() for line in self._raw_group().split(r"\\"))
            if name in ("hat", "bar", "tilde", "dot", "ddot", "vec", "widehat", "overline"):
                return self._group()
            if name == "begin":
                return self._environment()
            if name == "\\":
                return 0.0
            return _COMMAND_WIDTH.get(name, 5.9)
        self.i += 1
        if c == "{":
            w = self.sequence("}")
            self.i += 1
            return w
        if c in "^_":
            return _SCRIPT * self._group()
        if c in " \n\t&":
            return 0.0
        if c in "+-":
            return _BINARY
        if c in "=<>":
            return _RELATION
        if c in "()[]|":
            return 3.9
        if c in ",;":
            return 4.5
        if c in "'":
            return 2.8
        if c.isdigit():
            return 5.0
        if c.isupper():
            return 7.6
        return 5.3

    def _raw_group(self):
        while self._peek() == " ":
            self.i += 1
        if self._peek() != "{":
            return ""
        depth, start = 0, self.i
        while self.i < len(self.s):
            if self.s[self.i] == "{":
                depth += 1
            elif self.s[self.i] == "}":
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return self.s[start + 1:self.i - 1]
            self.i += 1
        return self.s[start + 1:]

    def _big_operator(self, width):
        lower = upper = 0.0
        while self._peek() in ("_", "^"):
            c = self._peek()
            self.i += 1
            w = _SCRIPT * self._group()
            lower, upper = (w, upper) if c == "_" else (lower, w)
        return max(width, lower, upper) + 1.7

    def _environment(self):
        name = self._raw_group()
        end = self.s.find(rf"\end{{{name}}}", self.i)
        body = self.s[self.i:end if end >= 0 else len(self.s)]
        self.i = (end + len(rf"\end{{{name}}}")) if end >= 0 else len(self.s)
        rows = [r.split("&") for r in body.split(r"\\")]
        ncol = max(len(r) for r in rows)
        cols = [max(_Measure(r[j]).sequence() if j < len(r) else 0.0 for r in rows)
                for j in range(ncol)]
        return sum(cols) + 10.0 * ncol + 8.0

    def sequence(self, stop=""):
        w = 0.0
        while self.i < len(self.s) and self._peek() != stop:
            w += self.atom()
        return w


def tex_width(tex: str) -> float:
    """Estimated width of displayed LaTeX math in points (10 pt Computer Modern).

    A heuristic (fractions count their wider part, scripts 72 %, binary
    operators and relations their spacing) used to break long lines; the
    compile test of the committed documents checks that nothing overflows.
    """
    return _Measure(tex).sequence()


# ---------------------------------------------------------------------------
# ordering, grouping and factoring
# ---------------------------------------------------------------------------
_PARAMETERS = (ETA, NOISE, P, P_STAR, XI)
_KIND = {"Q": 0, "rho": 1, "T": 2}
_NUMBERED = re.compile(r"^([A-Za-z]+)_?(\d*)$")


def _index_rank(index, order):
    return (0, order.index(index), "") if index in order else (1, 0, str(index))


def _rank(s, order=()):
    """Sort key of a factor: entries Q < ρ < T by index, covariances by their indices' order."""
    if isinstance(s, sp.Indexed):
        return (2, str(s.base.label), tuple(_index_rank(i, order) for i in s.indices), ())
    if isinstance(s, sp.Trace):
        return (2, "tr", tuple(_matrix_rank(m) for m in s.arg.atoms(sp.MatrixSymbol)), ())
    if isinstance(s, sp.Symbol):
        parts = s.name.split("_")
        if len(parts) == 3 and parts[0] in _KIND and parts[1].isdigit() and parts[2].isdigit():
            return (0, "", ((_KIND[parts[0]], int(parts[1]), ""),),
                    ((int(parts[2]), 0, ""),))
        m = _NUMBERED.match(s.name)
        if m:
            return (1, m.group(1), ((int(m.group(2) or 0), 0, ""),), ())
    return (3, sp.srepr(s), (), ())


def _matrix_rank(m):
    return (_KIND.get(str(m), 3), 0, str(m))


def _split_term(term):
    """``(coefficient, [(base, exponent)], rest)`` of a product; ``rest`` holds matrix factors."""
    coeff, rest = term.as_coeff_Mul()
    bases, matrices = [], []
    for f in sp.Mul.make_args(rest):
        if getattr(f, "is_Matrix", False) or isinstance(f, sp.MatrixExpr):
            matrices.append(f)
            continue
        base, exp = f.as_base_exp()
        bases.append((base, exp))
    return coeff, bases, matrices


def _is_variable(base):
    return not (base in _PARAMETERS or base.is_number)


def _term_key(term, order=()):
    _, bases, _ = _split_term(term)
    variables = sorted((_rank(b, order), -int(e) if e.is_Integer else 0)
                       for b, e in bases if _is_variable(b))
    degree = sum(int(e) for b, e in bases if _is_variable(b) and e.is_Integer)
    return (degree, variables, sp.default_sort_key(term))


def _monomial_tex(coeff, bases, names, order=()):
    """A signed term ``± c x^a y^b`` with the rational coefficient in front."""
    sign = "-" if coeff < 0 else "+"
    mag = abs(coeff)
    small = [(b, e) for b, e in bases if isinstance(b, sp.Symbol) and e.is_Integer]
    big = sorted(((b, e) for b, e in bases if (b, e) not in small),
                 key=lambda be: _rank(be[0], order))
    if big or any(e < 0 for _, e in small) or not mag.is_Rational:
        # a scalar head (\frac{4 \eta}{p}) and the structured factors after it
        head = to_latex(sp.Mul(mag, *[b ** e for b, e in small]), names)
        tail = [to_latex(b ** e, names) for b, e in big]
        if head == "1" and tail:
            head = ""
        return sign, " ".join(([head] if head else []) + tail)
    factors = sorted(bases, key=lambda be: (not _is_variable(be[0]), _rank(be[0], order)))
    params = [be for be in factors if not _is_variable(be[0])]
    variables = [be for be in factors if _is_variable(be[0])]
    tex_of = []
    for b, e in params + variables:
        t = to_latex(b, names)
        if isinstance(b, sp.Add):
            t = rf"\left({t}\right)"
        tex_of.append(t if e == 1 else f"{t}^{{{e}}}")
    if mag.is_Integer:
        head = "" if (mag == 1 and tex_of) else str(mag)
    else:
        head = rf"\frac{{{mag.p}}}{{{mag.q}}}"
    return sign, " ".join(([head] if head else []) + tex_of)


def _signed(sign, body, first):
    if first:
        return body if sign == "+" else f"-{body}" if body.startswith("\\") else f"- {body}"
    return f"{sign} {body}"


def _sum_pieces(expr, names, order=()):
    """Signed LaTeX pieces of a sum, sorted (degree, then Q < ρ < T by index)."""
    terms = sorted(sp.Add.make_args(expr), key=lambda t: _term_key(t, order))
    pieces = []
    for term in terms:
        coeff, bases, matrices = _split_term(term)
        if matrices:
            sign = "-" if coeff < 0 else "+"
            body = to_latex(sp.Mul(abs(coeff), *[b ** e for b, e in bases]) *
                            sp.MatMul(*matrices) if bases or abs(coeff) != 1
                            else sp.MatMul(*matrices), names)
        else:
            sign, body = _monomial_tex(coeff, bases, names, order)
        pieces.append((sign, body))
    return pieces


def _eta_groups(expr, group_by=ETA):
    """``[(power, coefficient)]`` of `expr` collected in powers of `group_by`, ascending."""
    expanded = sp.expand(expr)
    groups = {}
    for term in sp.Add.make_args(expanded):
        power = 0
        for f in sp.Mul.make_args(term):
            b, e = f.as_base_exp()
            if b == group_by and e.is_Integer:
                power += int(e)
        groups.setdefault(power, []).append(term / group_by ** power if power else term)
    return [(k, sp.Add(*groups[k])) for k in sorted(groups)]


def _common_factor(expr):
    """``(common, rest)`` with ``expr = common·rest``: content and shared symbols out."""
    factored = sp.factor_terms(expr)
    common, rest = sp.Integer(1), []
    for f in sp.Mul.make_args(factored):
        if isinstance(f, sp.Add):
            rest.append(f)
        else:
            common *= f
    rest = sp.Mul(*rest) if rest else sp.Integer(1)
    if rest == 1 or not isinstance(rest, sp.Add):
        return sp.Integer(1), expr
    return common, rest


def _matrix_terms(expr):
    """``[(scalar coefficient, matrix word)]`` of a matrix sum, like words merged."""
    words = {}
    for term in sp.MatAdd.make_args(expr) if isinstance(expr, sp.MatAdd) else (expr,):
        if isinstance(term, sp.ZeroMatrix):
            continue
        coeff, word = term.as_coeff_mmul() if isinstance(term, sp.MatMul) else (1, term)
        if isinstance(word, sp.MatMul):
            scalars = [a for a in word.args if not getattr(a, "is_Matrix", False)]
            mats = [a for a in word.args if getattr(a, "is_Matrix", False)]
            coeff = sp.Mul(coeff, *scalars)
            word = sp.MatMul(*mats) if len(mats) > 1 else mats[0]
        words[word] = words.get(word, sp.Integer(0)) + sp.sympify(coeff)
    return list(words.items())


def _word_key(word):
    """Words by length, then ``Q`` before ``ρ`` before ``ρᵀ`` before ``T``, powers first."""
    factors = word.args if isinstance(word, sp.MatMul) else (word,)
    key = []
    for f in factors:
        base, power = (f.base, int(f.exp)) if isinstance(f, sp.MatPow) else (f, 1)
        transposed = isinstance(base, sp.Transpose)
        base = base.arg if transposed else base
        key.append((_KIND.get(str(base), 3) + (0.5 if transposed else 0), -power, str(base)))
    return (sum(-k[1] for k in key), key)


def display_rhs(expr, names=None, order=(), group_by=ETA):
    """Signed pieces ``["- 3 Q_{11}^{2}", "+ ..."]`` of a right-hand side, ready to break.

    The expression is collected in powers of `group_by` (η); a group of more
    than one term is written ``± common·η^k \\Big( ... \\Big)`` with its common
    factor taken out, so that a line may break inside it.  Matrix expressions
    (a sum of scalar × matrix word) are grouped the same way, words sorted by
    length.
    """
    if names is None:
        names = latex_names_for(getattr(expr, "free_symbols", ()))
    if isinstance(expr, sp.MatrixExpr):
        return _display_matrix(expr, names, group_by)
    pieces = []
    for power, coeff in _eta_groups(expr, group_by):
        head = group_by ** power
        if not isinstance(coeff, sp.Add):      # one term: printed whole, no brackets
            (sign, body), = _sum_pieces(head * coeff, names, order)
            pieces.append(_signed(sign, body, not pieces))
            continue
        common, rest = _common_factor(coeff)
        inner = _sum_pieces(rest if common != 1 else coeff, names, order)
        pieces.extend(_wrap(head * common, inner, names, first=not pieces))
    return pieces or ["0"]


def _wrap(factor, inner, names, first):
    """Pieces of ``factor · (inner sum)``; one signed string per inner term."""
    if factor == 1:
        return [_signed(s, b, first and i == 0) for i, (s, b) in enumerate(inner)]
    sign = "-" if factor.could_extract_minus_sign() else "+"
    head = to_latex(-factor if sign == "-" else factor, names)
    if len(inner) == 1:
        s, b = inner[0]
        s = "+" if s == sign else "-"
        joined = head if b == "1" else f"{head} {b}"
        return [_signed(s, joined, first)]
    # \big or \Big: unpaired sizes, so that a line may break inside the brackets
    # \bigl( ... \bigr): unpaired sizes (a line may break inside the brackets) that are
    # opening/closing atoms, so a leading minus stays unary
    size = r"\Big" if any(tall in b for _, b in inner for tall in (r"\frac", r"\sum")) \
        else r"\big"
    out = [GROUP_START + _signed(sign, f"{head} {size}l(" + _signed(*inner[0], True), first)]
    out += [_signed(s, b, False) for s, b in inner[1:]]
    out[-1] += f" {size}r)"
    return out


def _display_matrix(expr, names, group_by):
    by_power = {}
    for word, coeff in _matrix_terms(expr):
        for power, part in _eta_groups(coeff, group_by):
            by_power.setdefault(power, []).append((word, part))
    pieces = []
    for power in sorted(by_power):
        items = sorted(by_power[power], key=lambda wc: _word_key(wc[0]))
        # common factor of the group: from the coefficients with the words as symbols
        marks = [sp.Dummy() for _ in items]
        common, _ = _common_factor(sp.Add(*[c * m for (_, c), m in zip(items, marks)]))
        inner = []
        for word, coeff in items:
            c = sp.cancel(coeff / common) if common != 1 else coeff
            sign = "-" if c.could_extract_minus_sign() else "+"
            c = -c if sign == "-" else c
            wtex = to_latex(word, names)
            if c == 1:
                inner.append((sign, wtex))
                continue
            ctex = to_latex(c, names)
            if isinstance(c, sp.Add):
                ctex = rf"\left({ctex}\right)"
            inner.append((sign, f"{ctex} {wtex}"))
        pieces.extend(_wrap(group_by ** power * common, inner, names, first=not pieces))
    return pieces or ["0"]


def factored_pieces(expr, function, names=None):
    r"""Signed pieces of an n-point function, one per off-diagonal monomial, factored.

    ``expr`` is a polynomial in covariance entries ``C_{ij}`` (``Indexed``); the
    off-diagonal entries ``C_{ij}, i ≠ j`` are the monomial variables and
    their coefficients, polynomials in the variances ``C_{ii}``, are factored,
    e.g. ``81 (C_{aa} - 1)(C_{bb} - 1)(C_{kk} - 1)(C_{ll} - 1) C_{ab}``.  Terms
    come by degree, then by the position of the indices in `function`'s
    arguments.
    """
    if names is None:
        names = latex_names_for(expr.free_symbols)
    order = tuple(function.args)
    entries = [s for s in expr.free_symbols if isinstance(s, sp.Indexed)]
    off = sorted((s for s in entries if len(set(s.indices)) > 1),
                 key=lambda s: _rank(s, order))
    if not off:
        return [_signed(s, b, i == 0) for i, (s, b) in
                enumerate(_sum_pieces(sp.factor(expr), names, order))]
    poly = sp.Poly(sp.expand(expr), *off)
    terms = sorted(poly.terms(), key=lambda t: (sum(t[0]), [-e for e in t[0]]))
    pieces = []
    for exps, coeff in terms:
        monomial = [(o, e) for o, e in zip(off, exps) if e]
        content, factors = sp.factor_list(coeff)
        factors = sorted(factors, key=lambda fe: _term_key(fe[0], order))
        sign = "-" if content < 0 else "+"
        content = abs(content)
        parts = []
        for f, e in factors:
            ft = " ".join(f"{s} {b}" if i else (b if s == "+" else f"-{b}") for i, (s, b) in
                          enumerate(_sum_pieces_desc(f, names, order)))
            ft = rf"({ft})" if isinstance(f, sp.Add) else ft
            parts.append(ft if e == 1 else f"{ft}^{{{e}}}")
        for o, e in monomial:
            t = to_latex(o, names)
            parts.append(t if e == 1 else f"{t}^{{{e}}}")
        if content != 1 or not parts:
            head = str(content) if content.is_Integer else \
                rf"\frac{{{content.p}}}{{{content.q}}}"
            parts.insert(0, head)
        pieces.append(_signed(sign, " ".join(parts), not pieces))
    return pieces


def _sum_pieces_desc(expr, names, order):
    """Pieces of a factor polynomial, highest degree first (``C_{aa} - 1``)."""
    terms = sorted(sp.Add.make_args(expr), key=lambda t: _term_key(t, order))
    terms = sorted(terms, key=lambda t: -_term_key(t, order)[0])
    return [_monomial_tex(*_split_term(t)[:2], names, order) for t in terms]


# ---------------------------------------------------------------------------
# breaking and aligning
# ---------------------------------------------------------------------------
#: Marks the first piece of a group (``± c η^k \Big(``): a preferred place to break.
GROUP_START = "\x01"


def _pack(pieces, first_budget, budget):
    """Greedy lines of at most `budget` points; a group that does not fit on the
    current line starts a new one when the line is already half full."""
    widths = [tex_width(p.lstrip(GROUP_START)) for p in pieces]
    group_width, run = [0.0] * len(pieces), 0.0
    for i in range(len(pieces) - 1, -1, -1):       # width from piece i to the next group
        ends = i + 1 == len(pieces) or pieces[i + 1].startswith(GROUP_START)
        run = widths[i] + (0.0 if ends else run)
        group_width[i] = run
    lines, current, used = [], [], 0.0
    for piece, w, gw in zip(pieces, widths, group_width):
        limit = first_budget if not lines else budget
        starts = piece.startswith(GROUP_START)
        if current and (used + w > limit or (starts and used + gw > limit
                                              and used > 0.5 * limit)):
            lines.append(" ".join(current))
            current, used = [], 0.0
        current.append(piece.lstrip(GROUP_START))
        used += w
    if current:
        lines.append(" ".join(current))
    return lines


#: Lines per ``align*`` environment: TeX holds a whole alignment in memory, and
#: the entry form at p = 11 (5000 lines) exceeds pdflatex's main memory in one.
MAX_ALIGN_LINES = 120


def align_rows(rows, width=LINE_WIDTH_PT) -> str:
    r"""``align*`` environments for ``[(lhs, pieces)]``, long right-hand sides broken.

    ``pieces`` is a list of signed LaTeX pieces (from :func:`display_rhs`) or a
    single string.  The widest left-hand side sets the alignment column; a
    continuation line is indented by ``\quad``.  A new environment starts
    (between two equations) every :data:`MAX_ALIGN_LINES` lines.
    """
    lhs_width = max((tex_width(lhs) for lhs, _ in rows), default=0.0)
    first_budget = width - lhs_width - _RELATION
    budget = first_budget - _COMMAND_WIDTH["quad"]
    blocks, current, count = [], [], 0
    for lhs, pieces in rows:
        if isinstance(pieces, str):
            pieces = [pieces]
        lines = _pack(pieces, first_budget, budget)
        if current and count + len(lines) > MAX_ALIGN_LINES:
            blocks.append(current)
            current, count = [], 0
        current.append(f"{lhs} &= " + " \\\\\n&\\quad ".join(lines))
        count += len(lines)
    if current:
        blocks.append(current)
    return "\n".join("\\begin{align*}\n" + " \\\\\n".join(b) + "\n\\end{align*}"
                     for b in blocks) + "\n"


# ---------------------------------------------------------------------------
# the documents
# ---------------------------------------------------------------------------
def _model_line(model) -> str:

    eta = (r"\eta = \mathrm{lr}" if model.lr_scaling == "fixed"
           else r"\eta = \mathrm{lr}\cdot p")
    fields = ", ".join(f"${part}$" for part in
                       describe_model(model, tex=True, exclude=("lr", "noise")).split(",\\ "))
    text = (f"% model: {describe_model(model, exclude=('lr', 'noise'))}\n"
            f"\\noindent Model: {fields}; step size ${eta}$ and label-noise variance "
            "$\\Delta$ are symbols. Time $t$ = steps$/N$.\n")
    if not model.schedule.is_constant:
        text += (f"% learning-rate schedule: {model.lr_schedule}\n"
                 "\\noindent Learning-rate schedule: every $\\eta$ below is "
                 f"${model.schedule.latex()}$.\n")
    return text


_TENSOR_INTRO = (
    "% tensor form: width-independent sums over field indices\n"
    "\\noindent Fields $u = (\\lambda_1, \\dots, \\lambda_p, \\nu_1, \\dots, \\nu_{p^*})$, "
    "$n = p + p^*$, covariance $C = \\begin{pmatrix} Q & \\rho \\\\ \\rho^\\top & T "
    "\\end{pmatrix}$ ($C_{aa}$: variances), output weights $w_a = a_a$ (the student readout) "
    "for students ($a \\le p$) and $w_a = -b_{a-p}$ (the teacher readout) for teachers. "
    "Students $k, l \\le p$; teacher $m$ is "
    "field $p + m$. The functions below are $I_2(a,b) = E[\\sigma(u_a)\\sigma(u_b)]$, "
    "$J_2(k,l) = E[\\sigma'(u_k)\\sigma'(u_l)]$, $I_3(k,j,a) = E[\\sigma'(u_k)\\,u_j\\,"
    "\\sigma(u_a)]$, $I_4(k,l,a,b) = E[\\sigma'(u_k)\\sigma'(u_l)\\sigma(u_a)\\sigma(u_b)]$ "
    "of the covariance of the fields they name, one term per monomial in the "
    "covariances of distinct fields; they hold for coincident indices too.\n")

_MATRIX_INTRO = (
    "% matrix form: Q (p x p), rho (p x p*), T (p* x p*); width-independent\n"
    "\\noindent Overlaps $Q$ ($p\\times p$), $\\rho$ ($p\\times p^*$), $T$ "
    "($p^*\\times p^*$); $C = \\begin{pmatrix} Q & \\rho \\\\ \\rho^\\top & T "
    "\\end{pmatrix}$, $A = \\operatorname{diag}(c\\,a, -c^*\\,b)$ with $c$, $c^*$ the "
    "$z^2$ coefficients of $\\sigma$, $\\sigma^*$ and $a$, $b$ the readouts ($1/p$, $1/p^*$ "
    "by default; $D_a = \\operatorname{diag}(a)$, $D_b = \\operatorname{diag}(b)$ when they "
    "are not uniform), and $m_n = \\operatorname{tr}((AC)^n)$: $m_1 = "
    "E[\\hat y - y_{\\mathrm{clean}}] - \\kappa$, $2 m_2$ the variance of the error.\n")


def _names(*exprs):
    symbols = set()
    for e in exprs:
        if e is not None:
            symbols |= getattr(e, "free_symbols", set())
    return latex_names_for(symbols)


def _closed_pieces(expr, names):
    """Signed pieces of a closed form (one per top-level term), for line breaking.

    A product with a sum among its factors is distributed at the top level only
    (arguments of sqrt/asin are left as they are), so that it can break.
    """
    terms = sorted(sp.Add.make_args(sp.expand(expr, deep=False)), key=sp.default_sort_key)
    pieces = []
    for term in terms:
        sign = "-" if term.could_extract_minus_sign() else "+"
        body = to_latex(-term if sign == "-" else term, names)
        pieces.append(_signed(sign, body, not pieces))
    return pieces


def _tensor_rows(eq):
    names = _names(eq.risk, eq.dQ, eq.drho, eq.da, *eq.definitions.values())
    if eq.model.is_polynomial:
        rows = [(to_latex(fn, names), factored_pieces(value, fn, names))
                for fn, value in eq.definitions.items()]
    else:
        rows = [(to_latex(fn, names), _closed_pieces(value, names))
                for fn, value in eq.definitions.items()]
    Qkl, rkm, t = sp.Symbol("Q_{kl}"), sp.Symbol(r"\rho_{km}"), sp.Symbol("t")
    rows.append((r"\varepsilon", display_rhs(eq.risk, names)))
    rows.append((to_latex(sp.Derivative(Qkl, t), names), display_rhs(eq.dQ, names)))
    rows.append((to_latex(sp.Derivative(rkm, t), names), display_rhs(eq.drho, names)))
    if eq.da is not None:
        rows.append((to_latex(sp.Derivative(sp.Symbol("a_{k}"), t), names),
                     display_rhs(eq.da, names)))
    return rows


def _matrix_rows(eq):

    definitions, risk, dQ, drho = display_form(eq.model)
    names = _names(risk, dQ, drho, eq.da, *definitions.values())
    for trace in definitions:      # the traces tr((AC)^n) are named m_n (not τ: the clock)
        head, order = trace.name.rsplit("_", 1)
        # taue_n: a trace of the error signal's A_e (a loss other than the square loss)
        names[trace] = (rf"\tilde{{m}}_{{{order}}}" if head == "taue"
                        else f"m_{{{order}}}")
    rows = [(to_latex(trace, names), display_rhs(value, names, group_by=sp.Dummy()))
            for trace, value in definitions.items()]
    rows.append((r"\varepsilon", display_rhs(risk, names)))
    rows.append((r"\frac{dQ}{dt}", display_rhs(dQ, names)))
    rows.append((r"\frac{d\rho}{dt}", display_rhs(drho, names)))
    if eq.da is not None:
        rows.append((r"\frac{da}{dt}", display_rhs(eq.da, names)))
    return rows


def _entry_rows(eq):
    model = eq.model
    Q, rho, _ = eq.symbols
    names = _names(eq.risk, eq.dQ, eq.drho, eq.da)
    t = sp.Symbol("t")
    rows = [(r"\varepsilon", display_rhs(eq.risk, names))]
    for i in range(model.p):
        for j in range(i, model.p):
            rows.append((to_latex(sp.Derivative(Q[i, j], t), names),
                         display_rhs(eq.dQ[i, j], names)))
    for i in range(model.p):
        for m in range(model.p_star):
            rows.append((to_latex(sp.Derivative(rho[i, m], t), names),
                         display_rhs(eq.drho[i, m], names)))
    if eq.da is not None:
        for i, a in enumerate(readout_symbols(model.p, model.p_star)[0]):
            rows.append((to_latex(sp.Derivative(a, t), names), display_rhs(eq.da[i, 0], names)))
    return rows


def _special_intro(model) -> str:
    """What the closed forms of an erf/ReLU model mean (conventions, roles, quadrature)."""
    labels = {f: activation_label(getattr(model, f), tex=True)
              for f in ("activation", "teacher_activation")}
    text = (r"% closed forms of the 2-, 3- and 4-point functions (symquad.symbolic.special)" "\n"
            r"\noindent Activations $\sigma(z) = " + labels["activation"] + r"$, "
            r"$\sigma^*(z) = " + labels["teacher_activation"] + "$")
    if "erf" in (model.activation, model.teacher_activation):
        text += (r" (erf is always $\operatorname{erf}(z/\sqrt{2}) = 2\Phi(z) - 1$, the "
                 r"convention of Saad \& Solla)")
    text += (r". The functions below are their closed forms in the entries of the "
             r"covariance of the fields they name; they hold for coincident indices too.")
    if model.activation != model.teacher_activation:
        text += (r" In the sums, $I_2(a,b)$, $I_3(k,j,a)$ and $I_4(k,l,a,b)$ stand for the "
                 r"variant of the roles of the summed fields: $I_2^{ss}$ when $a, b \le p$ "
                 r"(students), $I_2^{st}$ when $a \le p < b$, $I_2^{tt}$ when $a, b > p$; "
                 r"$I_3^{s}$, $I_3^{t}$ by the role of $a$; $I_4^{ss}$, $I_4^{st}$, $I_4^{tt}$ "
                 r"(symmetric in $a, b$).")
    if model.activation == "erf":
        text += (r" The erf student's $I_4$ is folded: $\Lambda(k,l) = \det(I + C_{kl})$ and "
                 r"$N(k,l,a,b)/\Lambda(k,l)$ is the covariance of $u_a, u_b$ after integrating "
                 r"out $u_k, u_l$ against $\sigma'(u_k)\sigma'(u_l)$.")
    if model.activation == "relu":
        text += (r" A ReLU student's $I_4$ with non-polynomial teachers contains a four-variate "
                 r"orthant probability and is evaluated by a one-dimensional quadrature.")
    return text + "\n"


#: The tensor intro without the polynomial-only sentence (for erf/ReLU pairs).
_SPECIAL_TENSOR_INTRO = _TENSOR_INTRO.replace(
    " of the covariance of the fields they name, one term per monomial in the "
    "covariances of distinct fields; they hold for coincident indices too.\n", ".\n")


def _loss_line(model, form: str) -> str:
    """What the weights of the width-independent forms mean for the model's loss.

    Empty for the square loss (error signal ``ŷ − y``: the forms' ``A`` and ``w``) and
    for the entry form.  Otherwise the error signal is ``e = c ŷ − y``
    (:func:`symquad.spec.error_signal_weight`): the drift's moments weight the students
    by ``c``, and the risk stays the square-loss error.
    """
    c = error_signal_weight(model)
    if c == 1 or form == "entries":
        return ""
    signal = "-y" if c == 0 else rf"{c}\,\hat y - y"
    if form == "matrix":
        what = (r"the drift's traces $\tilde{m}_n = \operatorname{tr}((A_e C)^n)$ and words "
                rf"use $A_e = \operatorname{{diag}}({c}\,c\,a, -c^*\,b)$ and "
                rf"$\kappa_e = {c}\,c_0 \textstyle\sum_k a_k - c_0^* \sum_m b_m$")
    elif c == 0:
        what = r"the drift's sums over $a, b$ run over the teacher fields $a, b > p$ only"
    else:
        what = rf"the drift's sums weight a student field $a \le p$ by ${c}\,w_a$"
    return (f"% loss: {model.loss} (error signal e = dl/dyhat = {c} yhat - y)\n"
            rf"\noindent Loss: {model.loss}, error signal $e = \partial\ell/\partial\hat y "
            rf"= {signal}$: {what}; the risk $\varepsilon$ is the square-loss error." "\n")


_BLOCK_INTRO = (
    "% input spectrum: per-block order parameters (docs/derivation.md §1a)\n"
    "\\noindent Inputs $x \\sim \\mathcal{N}(0, \\Sigma)$, $\\Sigma = \\sum_{c} s_c P_c$ (blocks $c$), "
    "$\\operatorname{rank} P_c = f_c N$; per block $Q^{c} = W P_c W^\\top/N$, "
    "$\\rho^{c} = W P_c W^{*\\top}/N$, $T^{c} = W^* P_c W^{*\\top}/N$. The fields "
    "$(\\lambda, \\nu)$ have the covariance $\\Omega = \\sum_c s_c \\begin{pmatrix} Q^{c} "
    "& \\rho^{c} \\\\ \\rho^{c\\top} & T^{c} \\end{pmatrix}$; the block fields are "
    "$\\mu^{c}_l = w_l P_c x/\\sqrt{N}$ (students) and $\\mu^{*c}_m$ (teachers), "
    "$\\operatorname{Cov}(\\mu^{c}_l, z) = s_c (Q^{c}\\ \\rho^{c})_{l\\cdot}$. "
    "The moment kinds are expectations at $\\Omega$: $G^{c}_{kl} = E[\\sigma'(\\lambda_k)\\,"
    "\\mu^{c}_l\\,\\delta] = s_c \\sum_{j=1}^{p+p^*} (Q^{c}\\ \\rho^{c})_{lj}\\, "
    "E[\\partial_j(\\sigma'(\\lambda_k)\\delta)]$ (Stein's lemma), $\\tilde G^{c}_{km} = "
    "E[\\sigma'(\\lambda_k)\\,\\mu^{*c}_m\\,\\delta]$, $G_{kk} = \\sum_c G^{c}_{kk}$, "
    "$B_{kl} = E[\\sigma'(\\lambda_k)\\sigma'(\\lambda_l)\\delta^2]$, "
    "$R_k = E[\\sigma(\\lambda_k)\\delta]$, and the risk is $\\varepsilon(\\Omega)$: "
    "the isotropic model's (\\texttt{symquad equations} without \\texttt{--spectrum}) with "
    "$(Q, \\rho, T)$ replaced by the blocks of $\\Omega$. $Q_{kk} = \\sum_c Q^{c}_{kk}$ is "
    "the Euclidean norm.\n")


def _block_rows(eq):
    """Rows of the per-block drift (:func:`symquad.symbolic.blocks.block_moment_drift`)."""
    k, l, m = UNITS
    index = {k: "k", l: "l", m: "m", CB: "c"}
    heads = {QBf: ("Q^{%s}_{%s%s}", 1), MGB: ("G^{%s}_{%s%s}", 1), RHOBf: (r"\rho^{%s}_{%s%s}", 1),
             MGTB: (r"\tilde G^{%s}_{%s%s}", 1), QTf: ("Q_{%s%s}", 0), MG: ("G_{%s%s}", 0),
             MB: ("B_{%s%s}", 0), MR: ("R_{%s}", 0), Af: ("a_{%s}", 0), FS: ("f_{%s} s_{%s}", 2)}
    names, symbols = {}, {}

    def replace(expr):
        if expr is None:
            return None
        def sym(e):
            fmt, kind = heads[e.func]
            args = [index[x] for x in e.args]
            text = fmt % ((args[0], args[0]) if kind == 2 else tuple(args))
            if text not in symbols:
                symbols[text] = sp.Symbol(f"_b{len(symbols)}")
                names[symbols[text]] = text
            return symbols[text]
        out = expr.replace(lambda e: isinstance(e, sp.Function) and e.func in heads, sym)
        return out
    dQ, drho, da = (replace(x) for x in (eq.dQ, eq.drho, eq.da))
    trace = sp.Symbol("_trSigma")
    dQ, drho = dQ.xreplace({TR_SIGMA: trace}), drho.xreplace({TR_SIGMA: trace})
    names.update(_names(dQ, drho, da))
    names[trace] = r"\operatorname{tr}\Sigma/N"
    for sym_, text in list(names.items()):
        if sym_.name.startswith("_b"):
            names[sym_] = text
    t = sp.Symbol("t")
    rows = [(r"\frac{dQ^{c}_{kl}}{dt}", display_rhs(dQ, names)),
            (r"\frac{d\rho^{c}_{km}}{dt}", display_rhs(drho, names))]
    if da is not None:
        rows.append((r"\frac{da_{k}}{dt}", display_rhs(da, names)))
    return rows


def _spectrum_line(model) -> str:
    """The model's blocks ``(f_c, s_c)``."""
    blocks = ",\\ ".join(f"({f}, {s})" for f, s in model.spectrum)
    return (f"% spectrum: {model._field_text('spectrum')}\n"
            f"\\noindent Blocks $(f_c, s_c)$: ${blocks}$ ({model.n_blocks} blocks); every "
            "expression below holds for each block $c$.\n")


def equations_latex(eq, standalone: bool = False) -> str:
    """LaTeX for the risk and the ODEs of an :class:`~symquad.symbolic.derive.Equations`."""
    model = eq.model
    if "spectrum" in model.changed_fields():
        body = (_BLOCK_INTRO + _loss_line(model, eq.form) + _model_line(model)
                + _spectrum_line(model) + align_rows(_block_rows(eq)))
        if standalone:
            return document(body, title="symquad equations (input spectrum, per block)")
        return body
    if eq.form == "matrix":
        intro, rows = _MATRIX_INTRO, _matrix_rows(eq)
    elif eq.form == "tensor" and not model.is_polynomial:
        intro, rows = _SPECIAL_TENSOR_INTRO + _special_intro(model), _tensor_rows(eq)
    elif eq.form == "tensor":
        intro, rows = _TENSOR_INTRO, _tensor_rows(eq)
    else:
        intro, rows = "% entry-by-entry form\n", _entry_rows(eq)
    body = intro + _loss_line(model, eq.form) + _model_line(model) + align_rows(rows)
    if standalone:
        return document(body, title=f"symquad equations ({eq.form} form)")
    return body
