r"""Matrix-form derivation for quadratic activations ``σ = c z² + c0``, ``σ* = c* z² + c0*``.

With ``z = (λ, ν)`` and ``C = [[Q, ρ], [ρᵀ, T]]`` the clean error is a quadratic
form plus a constant, ``ŷ − y_clean = zᵀ A z + κ`` with the diagonal

.. math::  A = \operatorname{diag}(c\,a_1, …, c\,a_p, −c^* b_1, …, −c^* b_{p^*}),
           \qquad κ = c_0 \textstyle\sum_k a_k − c_0^* \sum_m b_m ,

and ``δ = zᵀAz + κ − √Δ ξ``.  The moment kinds of
:mod:`symquad.symbolic.moments` are then, since ``σ'(z) = 2cz``,

* ``G_kj = E[σ'(λ_k) u_j δ] = 2c\,E[z zᵀ δ]_{kj}``,
* ``B_kl = E[σ'(λ_k) σ'(λ_l) δ²] = 4c²\,E[z zᵀ δ²]_{kl}``,
* ``R_k = E[σ(λ_k) δ] = c\,E[z zᵀ δ]_{kk} + c_0 E[δ]``,

(read off the local polynomials by :func:`matrix_moments`, not typed), and
:mod:`symquad.symbolic.quadforms` reduces ``E[δ^m z zᵀ]`` and ``E[δ^m]`` to
traces and words in ``A`` and ``C``.  Two evaluations of these words:

* the kernels (:func:`symquad.codegen.render.render_matrix_module`) multiply
  words of the combined ``C`` with ``A`` as a vector of weights: cost
  ``O((p + p*)³)`` whatever the readouts;
* the symbolic form (:func:`derive_matrix_form`) expands every word block by
  block (``C`` has blocks ``Q, ρ, ρᵀ, T``; ``A`` is ``c D_a`` on the students and
  ``−c* D_b`` on the teachers, scalars when the readouts are uniform) into
  width-independent expressions in the MatrixSymbols ``Q, ρ, T`` (and ``D_a``,
  ``D_b``), and combines them with the one assembly of the drift
  (:func:`symquad.symbolic.moments.moment_drift`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import sympy as sp

from ..spec import Model, error_signal_weight
from .moments import MB, MG, MGT, MR, moment_drift
from .quadforms import COV, expect_forms, expect_outer
from .symbols import (NOISE, P, P_STAR, XI, matrix_symbols, overlap_symbols,
                      readout_symbols)
from .update import Af, Qf, RHOf, switched_off

__all__ = ["MatrixEquations", "derive_matrix_form", "explicit", "display_form",
           "matrix_moments", "uniform_matrix_form", "KAPPA", "ACT_SYMBOLS", "DA", "DB",
           "UNIFORM_READOUTS"]

LAM, NU = 0, 1  # block indices of z = (λ, ν)

#: The constant of the error and the activation coefficients as symbols
#: (``σ = c z² + c0``, ``σ* = c* z² + c0*``).
KAPPA = sp.Symbol("kappa", real=True)
ACT_SYMBOLS = sp.symbols("c c_star c0 c0_star", real=True)
#: Diagonal readout matrices ``D_a = diag(a)`` (p×p), ``D_b = diag(b)`` (p*×p*).
DA = sp.MatrixSymbol("D_a", P, P)
DB = sp.MatrixSymbol("D_b", P_STAR, P_STAR)
#: Uniform fixed readouts ``a_k = α``, ``b_m = β`` as symbols (one kernel for all values).
UNIFORM_READOUTS = sp.symbols("alpha beta", real=True)


def _check_quadratic(model: Model):
    if not model.is_quadratic:
        raise ValueError(
            f"the matrix-form route needs c*z**2 (+ constant) for the student and the teacher; "
            f"got activation {model.activation_str!r}, teacher_activation "
            f"{model.teacher_activation_str!r}: use form='tensor' (any width) or "
            f"form='entries' (small p)")


def _rational(c) -> sp.Rational:
    return sp.Rational(c.numerator, c.denominator)


def activation_values(model: Model) -> dict:
    """``{c, c*, c0, c0*}`` of a quadratic model, exact."""
    _check_quadratic(model)
    c, cs, c0, c0s = ACT_SYMBOLS
    return {c: _rational(model.activation[2]), cs: _rational(model.teacher_activation[2]),
            c0: _rational(model.activation[0]), c0s: _rational(model.teacher_activation[0])}


# ---- word level ------------------------------------------------------------------

def _noise_expectation(k: int) -> dict:
    """``E_ξ[δ^k] = Σ_j coeff_j s^j`` with ``δ = s + κ − √Δ ξ`` and ``ξ ~ N(0,1)``."""
    s = sp.Symbol("s")
    poly = sp.Poly(sp.expand((s + KAPPA - sp.sqrt(NOISE) * XI) ** k), s, XI)
    out: dict = {}
    for (js, jx), coeff in poly.terms():
        moment = 0 if jx % 2 else sp.factorial2(jx - 1)   # E[ξ^n] = (n−1)!!, 0 for odd n
        out[js] = out.get(js, 0) + coeff * moment
    return out


def _outer(m: int) -> dict:
    """``E[δ^m z zᵀ]`` as ``{word: coeff}`` (noise integrated out)."""
    acc: dict = {}
    for j, cj in _noise_expectation(m).items():
        for word, coeff in expect_outer([("A",)] * j).items():
            acc[word] = sp.expand(acc.get(word, 0) + cj * coeff)
    return {w: c for w, c in acc.items() if c != 0}


def _scalar(m: int) -> sp.Expr:
    """``E[δ^m]`` as a polynomial in trace placeholders."""
    return sp.expand(sp.Add(*[cj * expect_forms([("A",)] * j)
                              for j, cj in _noise_expectation(m).items()]))


def matrix_moments() -> dict:
    """The moment kinds as combinations of ``E[δ^m z zᵀ]`` entries and ``E[δ^m]``.

    Read off the local polynomials ``σ'(x) = 2c x``, ``σ(x) = c x² + c0`` (``c``,
    ``c0`` symbols): a monomial of degree two in the fields ``x_k x_j`` is the
    ``(k, j)`` entry of ``E[δ^m z zᵀ]``, a constant multiplies ``E[δ^m]``.

    Returns
    -------
    dict
        ``{kind: [(coefficient, "outer" | "scalar", m, entry)]}``, ``entry`` one
        of ``"kj"`` (student row, any column), ``"kl"`` (students), ``"kk"``
        (diagonal) or None for a scalar.
    """
    c, _, c0, _ = ACT_SYMBOLS
    xk, xl, xj = sp.symbols("x_k x_l x_j")
    sigma = sp.Lambda(xk, c * xk**2 + c0)
    dsigma = sp.Lambda(xk, sp.diff(sigma(xk), xk))
    local = {"G": (dsigma(xk) * xj, 1, "kj"), "B": (dsigma(xk) * dsigma(xl), 2, "kl"),
             "R": (sigma(xk), 1, "kk")}
    out = {}
    for kind, (poly, m, entry) in local.items():
        terms = []
        for mono, coeff in sp.Poly(sp.expand(poly), xk, xl, xj).terms():
            degree = sum(mono)
            if degree == 2:
                terms.append((coeff, "outer", m, entry))
            elif degree == 0:
                terms.append((coeff, "scalar", m, None))
            else:  # pragma: no cover - a quadratic σ has no odd terms here
                raise NotImplementedError(f"local factor {poly} is not quadratic in the fields")
        out[kind] = terms
    return out


# ---- block expansion (symbolic, width independent) --------------------------------

class _Blocks:
    """Block structure of the letters: ``C`` (full) and ``A`` (diagonal per block).

    ``A`` on a block is a scalar or a diagonal matrix (``c D_a``, ``−c* D_b``).
    A path through a word yields a scalar and a list of factors: ``("C", i, j)``
    (block ``(i, j)`` of ``C``) or ``("D", i)`` (the diagonal matrix of ``A`` on
    block ``i``).
    """

    def __init__(self, Q, rho, T, a_lam, a_nu, explicit=False):
        self.explicit = explicit
        self.cov = {(LAM, LAM): Q, (LAM, NU): rho, (NU, LAM): rho.T, (NU, NU): T}
        self.diag = {LAM: a_lam, NU: a_nu}

    def matrix(self, factor):
        return self.cov[factor[1:]] if factor[0] == "C" else self.diag[factor[1]]

    def paths(self, word, start, end):
        n_cov = sum(1 for letter in word if letter == COV)
        for mids in product((LAM, NU), repeat=max(n_cov - 1, 0)):
            idx = [start, *mids, end] if n_cov else [start]
            if not n_cov and start != end:
                continue
            scalar, factors, pos = sp.Integer(1), [], 0
            for letter in word:
                if letter == COV:
                    factors.append(("C", idx[pos], idx[pos + 1]))
                    pos += 1
                else:
                    value = self.diag[idx[pos]]
                    if isinstance(value, sp.MatrixExpr) or getattr(value, "is_Matrix", False):
                        factors.append(("D", idx[pos]))
                    else:
                        scalar *= value
            if scalar != 0:
                yield scalar, factors


def _transpose_factor(f):
    return ("C", f[2], f[1]) if f[0] == "C" else f


def _canonical_cycle(factors: list) -> tuple:
    # tr(XY) = tr(YX) = tr(Yᵀ Xᵀ); C blocks transpose to (j, i), diagonals to themselves.
    n = len(factors)
    rev = [_transpose_factor(f) for f in reversed(factors)]
    return min(tuple(w[i:] + w[:i]) for w in (factors, rev) for i in range(n))


def _product(blocks: _Blocks, factors) -> sp.Basic:
    mats = [blocks.matrix(f) for f in factors]
    if blocks.explicit:
        out = mats[0]
        for M in mats[1:]:
            out = out * M
        return out
    return mats[0] if len(mats) == 1 else sp.MatMul(*mats)


def _trace_value(blocks: _Blocks, word: tuple, trace) -> sp.Expr:
    """``tr(word)`` summed over diagonal blocks, cycles canonicalised."""
    total = sp.Integer(0)
    for start in (LAM, NU):
        for scalar, factors in blocks.paths(word, start, start):
            total += scalar * trace(_product(blocks, _canonical_cycle(factors)))
    return total


def _matrix_value(blocks: _Blocks, words: dict, start, end, coeff_value, zero):
    """Block ``(start, end)`` of ``Σ coeff·word``."""
    terms = []
    for word, coeff in words.items():
        cval = coeff_value(coeff)
        for scalar, factors in blocks.paths(word, start, end):
            terms.append(cval * scalar * _product(blocks, factors))
    return sp.Add(*terms) if terms else zero


@dataclass(frozen=True)
class MatrixEquations:
    """Matrix-form risk, moments and ODE right-hand sides.

    Attributes
    ----------
    risk : Expr
        ``ε = ½ E[(zᵀAz + κ)²]`` in ``Q, ρ, T`` (and ``D_a``, ``D_b``).
    dQ, drho : MatrixExpr
        ``dQ/dt`` (p×p) and ``dρ/dt`` (p×p*).
    da : MatrixExpr or None
        ``da/dt`` (p×1) for a trained readout.
    moments : dict
        ``{"G": p×p, "Gt": p×p*, "B": p×p, "R": p×1}`` block expressions (those needed).
    words : dict
        The word-level results ``E[δ^m zzᵀ]`` (``"outer1"``, ``"outer2"``),
        ``E[δ^m]`` (``"scalar1"``) and ``"risk"`` — printable, and what codegen
        consumes.
    coefficient : Expr
        The student's ``c``.
    """

    risk: sp.Expr
    dQ: sp.MatrixExpr
    drho: sp.MatrixExpr
    da: object
    moments: dict
    words: dict
    coefficient: sp.Expr


def word_level() -> dict:
    """``E[δ zzᵀ]``, ``E[δ² zzᵀ]``, ``E[δ]`` and the risk ``½E[(s + κ)²]`` as words in ``A, C``."""
    risk = sp.expand((expect_forms([("A",), ("A",)]) + 2 * KAPPA * expect_forms([("A",)])
                      + KAPPA**2) / 2)
    return {"outer1": _outer(1), "outer2": _outer(2), "scalar1": _scalar(1), "risk": risk}


def _readout_diagonals(model: Model, values: dict, explicit: bool, uniform=None,
                       weight=1):
    """``A`` on the student and teacher blocks, and ``κ`` (`uniform`: symbols ``(α, β)``).

    `weight` multiplies the student's part (its block of ``A`` and its share of ``κ``):
    1 for the clean error ``ŷ − y*`` of the risk, the loss's error-signal weight ``c``
    (:func:`symquad.spec.error_signal_weight`) for the error ``e = c ŷ − y`` the moment
    kinds are expectations against.  At ``c = 0`` the student part is the number 0, so
    the paths through it drop out of every word.
    """
    a_lam, a_nu, kappa_s, kappa_t = _readout_parts(model, values, explicit, uniform)
    if weight == 0:
        return sp.Integer(0), a_nu, -kappa_t
    if weight == 1:
        return a_lam, a_nu, kappa_s - kappa_t
    return weight * a_lam, a_nu, weight * kappa_s - kappa_t


def _readout_parts(model: Model, values: dict, explicit: bool, uniform=None):
    """``(A_λ, A_ν, κ_student, κ_teacher)``: ``A``'s blocks and ``κ = κ_student − κ_teacher``."""
    c, cs, c0, c0s = (values[s] for s in ACT_SYMBOLS)
    if uniform is not None:
        alpha, beta = uniform
        return c * alpha, -cs * beta, c0 * alpha * P, c0s * beta * P_STAR
    if explicit:
        a, b = readout_symbols(model.p, model.p_star)
        a = a if model.readout_trained else tuple(_rational(x) for x in model.readout)
        b = tuple(_rational(x) for x in model.teacher_readout)
        return c * sp.diag(*a), -cs * sp.diag(*b), c0 * sum(a), c0s * sum(b)
    uniform_a = len(set(model.readout)) == 1 and not model.readout_trained
    uniform_b = len(set(model.teacher_readout)) == 1
    # the default readouts stay 1/p, 1/p* (width independent)
    alpha = ((1 / P if model.is_default("readout") else _rational(model.readout[0]))
             if uniform_a else None)
    beta = 1 / P_STAR if model.is_default("teacher_readout") else _rational(model.teacher_readout[0])
    a_lam = c * alpha if uniform_a else c * DA
    a_nu = -cs * beta if uniform_b else -cs * DB
    return (a_lam, a_nu, c0 * alpha * P if uniform_a else c0 * sp.Trace(DA),
            c0s * beta * P_STAR if uniform_b else c0s * sp.Trace(DB))


def _evaluate_blocks(model, words, values, Q, rho, T, p, k, trace, explicit=False,
                     trace_names=None, uniform=None, error_trace_names=None):
    """Moments and risk from the word level, block by block.

    The risk is the square-loss error's (``A``, ``κ`` of ``ŷ − y*``); the moments are
    expectations against the loss's error signal ``e = c ŷ − y`` (``c`` of
    :func:`symquad.spec.error_signal_weight`), whose ``A`` and ``κ`` have the student
    part times ``c``: the same words evaluated on other blocks.  For ``c = 1`` both
    are one evaluation.  `trace_names` (`error_trace_names`) name the traces of the
    risk's (the error's) words instead of expanding them.
    """
    weight = error_signal_weight(model)

    def evaluator(w, names):
        a_lam, a_nu, kappa = _readout_diagonals(model, values, explicit, uniform, weight=w)
        blocks = _Blocks(Q, rho, T, a_lam, a_nu, explicit)
        cache = {}

        def coeff_value(coeff):
            subs = {KAPPA: kappa}
            for s in coeff.free_symbols:
                if s.name.startswith("tr("):
                    if s not in cache:
                        word = tuple(s.name[3:-1])
                        cache[s] = (names[s] if names
                                    else _trace_value(blocks, word, trace))
                    subs[s] = cache[s]
            return coeff.xreplace(subs).xreplace(values)
        return blocks, coeff_value

    risk_blocks, risk_value = evaluator(1, trace_names)
    blocks, coeff_value = ((risk_blocks, risk_value) if weight == 1
                           else evaluator(weight, error_trace_names))

    zeros = {(LAM, LAM): sp.zeros(p, p) if explicit else sp.ZeroMatrix(p, p),
             (LAM, NU): sp.zeros(p, k) if explicit else sp.ZeroMatrix(p, k)}

    def block(name, end):
        return _matrix_value(blocks, words[name], LAM, end, coeff_value, zeros[(LAM, end)])

    recipes = matrix_moments()
    moments = {}
    for kind, selection in (("G", LAM), ("Gt", NU), ("B", LAM), ("R", LAM)):
        total = None
        for coeff, what, m, entry in recipes["R" if kind == "R" else
                                            ("G" if kind in ("G", "Gt") else "B")]:
            coeff = sp.sympify(coeff).xreplace(values)
            if what == "outer":
                mat = block(f"outer{m}", selection)
                if entry == "kk":
                    mat = (sp.Matrix([mat[i, i] for i in range(p)]) if explicit
                           else sp.DiagonalOf(mat))
                term = coeff * mat
            else:
                scalar = coeff_value(words[f"scalar{m}"])
                term = (coeff * scalar * (sp.ones(p, 1) if explicit else sp.OneMatrix(p, 1)))
            total = term if total is None else total + term
        moments[kind] = total
    risk = risk_value(words["risk"]).xreplace(switched_off(model))
    return risk, moments


def _assemble(model, moments, Q, rho, explicit, p, uniform=None):
    """The drift from the moments by the one assembly, in matrix notation.

    Each term of :func:`moment_drift` is ``coefficient · a_k^i a_l^j · X(k, l)``,
    which is ``coefficient · D_a^i X D_a^j`` (scalars when the readouts are
    uniform); the sphere's diagonal terms have no matrix form here.
    """
    md = moment_drift(model)
    if model.constraint != "none":
        raise ValueError(f"form='matrix' has no symbolic matrix form for constraint="
                         f"{model.constraint!r} (its projection is diagonal): use "
                         "form='tensor' or form='entries'; the numeric matrix kernels "
                         "support it")
    a_syms = readout_symbols(model.p, model.p_star)[0] if explicit else None
    if uniform is not None:
        Da = uniform[0]
    elif explicit:
        Da = sp.diag(*(a_syms if model.readout_trained
                       else [_rational(x) for x in model.readout]))
    elif model.readout_trained or len(set(model.readout)) > 1:
        Da = DA
    elif model.is_default("readout"):
        Da = 1 / P
    else:
        Da = _rational(model.readout[0])
    K, L, M = sp.symbols("k l m", integer=True, positive=True)
    G, Gt, B, R = (moments[x] for x in ("G", "Gt", "B", "R"))
    atoms = {(Qf, (K, L)): Q, (MG, (K, L)): G, (MG, (L, K)): G.T, (MB, (K, L)): B,
             (MB, (L, K)): B.T, (RHOf, (K, M)): rho, (MGT, (K, M)): Gt, (MR, (K,)): R}

    def power(x, n):
        if n == 0:
            return None
        return x**n if not isinstance(x, (sp.MatrixBase, sp.MatrixExpr)) else \
            (sp.MatPow(x, n).doit() if not explicit else x**n)

    def convert(expr):
        if expr is None:
            return None
        total = None
        for term in sp.Add.make_args(sp.expand(expr)):
            scalar, ak, al, X = sp.Integer(1), 0, 0, None
            for factor in sp.Mul.make_args(term):
                base, exp = factor.as_base_exp()
                if isinstance(base, sp.Function) and base.func is Af:
                    if base.args[0] == K:
                        ak += int(exp)
                    else:
                        al += int(exp)
                elif isinstance(factor, sp.Function) and (factor.func, factor.args) in atoms:
                    X = atoms[(factor.func, factor.args)]
                else:
                    scalar *= factor
            if X is None:  # pragma: no cover - every drift term has one state/moment factor
                raise NotImplementedError(f"drift term {term} has no matrix form")
            left, right = power(Da, ak), power(Da, al)
            value = X
            if left is not None:
                value = left * value
            if right is not None:
                value = value * right
            value = scalar * value
            total = value if total is None else total + value
        return total
    off = {} if uniform is not None else switched_off(model)
    return tuple(None if e is None else _tidy(convert(e.xreplace(off)), explicit)
                 for e in (md.dQ, md.drho, md.da))


def _tidy(expr, explicit: bool):
    """Symmetric letters untransposed, like matrix words collected (display and analyses)."""
    if explicit:
        return expr
    Q, rho, T = matrix_symbols()
    expr = expr.xreplace({Q.T: Q, T.T: T, DA.T: DA, DB.T: DB})
    terms = {}
    for term in sp.MatAdd.make_args(sp.expand(expr)):
        coeff, mat = term.as_coeff_mmul()
        mat = mat.doit() if isinstance(mat, sp.MatrixExpr) else mat
        terms[mat] = terms.get(mat, 0) + coeff
    parts = [sp.factor_terms(c) * m for m, c in terms.items() if sp.expand(c) != 0]
    return sp.MatAdd(*parts) if len(parts) > 1 else parts[0]


def derive_matrix_form(model: Model) -> MatrixEquations:
    """Width-independent matrix-form equations of a quadratic model.

    ``p``, ``p*``, ``η``, ``Δ`` and the other learning parameters stay symbols;
    the readouts are scalars when uniform and the diagonal MatrixSymbols
    ``D_a``, ``D_b`` otherwise (``D_a`` always for a trained readout).
    """
    values = activation_values(model)
    words = word_level()
    Q, rho, T = matrix_symbols()
    risk, moments = _evaluate_blocks(model, words, values, Q, rho, T, P, P_STAR, sp.Trace)
    dQ, drho, da = _assemble(model, moments, Q, rho, explicit=False, p=P)
    return MatrixEquations(risk=risk, dQ=dQ, drho=drho, da=da, moments=moments,
                           words=words, coefficient=values[ACT_SYMBOLS[0]])


def uniform_matrix_form() -> MatrixEquations:
    """The matrix form for *uniform fixed* readouts, everything symbolic.

    ``a_k = α``, ``b_m = β`` (:data:`UNIFORM_READOUTS`), the activation
    coefficients ``c, c*, c0, c0*`` (:data:`ACT_SYMBOLS`), ``p``, ``p*`` and every
    learning parameter stay symbols, and there is no constraint: the scalar
    blocks of ``A`` let every word be expanded into products of ``Q, ρ, ρᵀ, T``.
    The fast kernel for this family (``symquad/_generated/quadratic_matrix_uniform.py``)
    is rendered from it; it is the same drift as :func:`derive_matrix_form` (the one
    assembly), evaluated on smaller blocks.
    """
    model = Model(2, 1, 1.0)
    values = {s: s for s in ACT_SYMBOLS}
    words = word_level()
    Q, rho, T = matrix_symbols()
    risk, moments = _evaluate_blocks(model, words, values, Q, rho, T, P, P_STAR, sp.Trace,
                                     uniform=UNIFORM_READOUTS)
    dQ, drho, da = _assemble(model, moments, Q, rho, explicit=False, p=P, uniform=UNIFORM_READOUTS)
    return MatrixEquations(risk=risk, dQ=dQ, drho=drho, da=da, moments=moments, words=words,
                           coefficient=ACT_SYMBOLS[0])


def explicit(model: Model, eqs: MatrixEquations | None = None):
    """Matrix-form equations evaluated on explicit entry-symbol matrices.

    Returns ``(risk, dQ, drho)`` — and ``da`` for a trained readout — expanded
    in the entry symbols of :func:`overlap_symbols` (and ``a_1..a_p`` for a
    trained readout); fixed readouts take the model's values; ``η``, ``Δ`` and
    the other parameters stay symbols.
    """
    eqs = eqs or derive_matrix_form(model)
    values = activation_values(model)
    p, k = model.p, model.p_star
    Q, rho, T = (sp.Matrix(M) for M in overlap_symbols(p, k))
    risk, moments = _evaluate_blocks(model, eqs.words, values, Q, rho, T, sp.Integer(p),
                                     sp.Integer(k), lambda M: M.trace(), explicit=True)
    dQ, drho, da = _assemble(model, moments, Q, rho, explicit=True, p=p)
    out = (sp.expand(risk), sp.Matrix(dQ).applyfunc(sp.expand),
           sp.Matrix(drho).applyfunc(sp.expand))
    if da is not None:
        out += (sp.Matrix(da).applyfunc(sp.expand),)
    return out


def display_form(model: Model):
    """Readable matrix form: traces of ``(AC)^n`` named ``τ_n``.

    Returns ``(definitions, risk, dQ, drho)`` where ``definitions`` maps each
    ``τ_n`` Symbol to its expression in ``Q, ρ, T`` and the equations use the
    ``τ_n``.  ``τ_1 = E[ŷ − y_clean] − κ`` and ``2 τ_2`` is the variance of the error.
    For a loss whose error signal ``e = c ŷ − y`` is not ``ŷ − y``
    (:func:`symquad.spec.error_signal_weight`), the moments' traces are those of
    ``A_e`` (``A`` with its student block times ``c``), named ``τ^e_n`` (``taue_n``),
    and only the risk keeps the ``τ_n``.
    """
    values = activation_values(model)
    words = word_level()
    Q, rho, T = matrix_symbols()
    weight = error_signal_weight(model)

    def traces(keys):
        found = set()
        for key in keys:
            word = words[key]
            for coeff in (word.values() if isinstance(word, dict) else [word]):
                found |= sp.sympify(coeff).free_symbols
        return sorted((s for s in found if s.name.startswith("tr(")),
                      key=lambda s: (len(s.name), s.name))

    def named(placeholders, head, w):
        names = {s: sp.Symbol(f"{head}_{len(s.name[3:-1]) // 2}") for s in placeholders}
        a_lam, a_nu, _ = _readout_diagonals(model, values, explicit=False, weight=w)
        blocks = _Blocks(Q, rho, T, a_lam, a_nu)
        return names, {names[s]: _trace_value(blocks, tuple(s.name[3:-1]), sp.Trace)
                       for s in placeholders}

    moment_words = ("scalar1", "outer1", "outer2")
    if weight == 1:
        names, definitions = named(traces(("risk",) + moment_words), "tau", 1)
        error_names = None
    else:
        names, definitions = named(traces(("risk",)), "tau", 1)
        error_names, error_definitions = named(traces(moment_words), "taue", weight)
        definitions.update(error_definitions)
    risk, moments = _evaluate_blocks(model, words, values, Q, rho, T, P, P_STAR, sp.Trace,
                                     trace_names=names, error_trace_names=error_names)
    dQ, drho, _ = _assemble(model, moments, Q, rho, explicit=False, p=P)
    return definitions, risk, dQ, drho
