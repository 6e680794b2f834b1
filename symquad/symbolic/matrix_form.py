"""Matrix-form derivation of the ODEs and the risk for ``σ(z) = c z² (+ c0)``.

With ``z = (λ, ν)`` and ``C = [[Q, ρ], [ρᵀ, T]]`` the network outputs are
quadratic forms: ``ŷ = zᵀ B z`` with ``B = diag(c I_p/p, 0)`` and the clean
error ``ŷ − y_clean = zᵀ A z`` with ``A = diag(c I_p/p, −c I_p*/p*)`` (the
constant ``c0`` cancels).  The local gradient is then
``g = ∂ℓ/∂λ = δ [(B + Bᵀ) z]_λ`` with ``δ = zᵀAz − √Δ ξ``, and the SGD increments
of :func:`symquad.symbolic.network.sgd_increments`,

``N ΔQ = −η (g λᵀ + λ gᵀ) + η² r g gᵀ``,  ``N Δρ = −η g νᵀ``,

need only ``E[δ^k z zᵀ]`` (``k = 1, 2``), which
:mod:`symquad.symbolic.quadforms` reduces to traces and words in ``A, B, C``.
Expanding the words block by block (``C`` has blocks ``Q, ρ, ρᵀ, T``; ``A`` and
``B`` are scalar on each block) gives width-independent expressions in the
MatrixSymbols ``Q, ρ, T`` whose evaluation costs ``O((p + p*)³)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import sympy as sp

from ..spec import Model
from .quadforms import COV, expect_forms, expect_outer
from .symbols import ETA, NOISE, P, P_STAR, XI, matrix_symbols, overlap_symbols

__all__ = ["MatrixEquations", "derive_matrix_form", "explicit"]

LAM, NU = 0, 1  # block indices of z = (λ, ν)


def _quadratic_coefficient(model: Model) -> sp.Rational:
    if not model.is_quadratic:
        raise ValueError(
            f"the matrix-form route needs activation c*z**2 (+ constant); got "
            f"{model.activation_str!r}: use form='tensor' (any width) or form='entries' (small p)")
    c = model.activation[2]
    return sp.Rational(c.numerator, c.denominator)


class _Blocks:
    """Block structure of the letters: ``C`` (full), ``A``/``B`` (scalar per block)."""

    def __init__(self, c, Q, rho, T, p, p_star, explicit=False):
        self.explicit = explicit
        self.cov = {(LAM, LAM): Q, (LAM, NU): rho, (NU, LAM): rho.T, (NU, NU): T}
        self.diag = {"A": (c / p, -c / p_star), "B": (c / p, sp.Integer(0))}

    def paths(self, word, start, end):
        """Yield ``(scalar, [block keys])`` for each index path of ``word`` from start to end."""
        n_cov = sum(1 for letter in word if letter == COV)
        for mids in product((LAM, NU), repeat=max(n_cov - 1, 0)):
            idx = [start, *mids, end] if n_cov else [start]
            if not n_cov and start != end:
                continue
            scalar, keys, pos = sp.Integer(1), [], 0
            for letter in word:
                if letter == COV:
                    keys.append((idx[pos], idx[pos + 1]))
                    pos += 1
                else:
                    scalar *= self.diag[letter][idx[pos]]
            if scalar != 0:
                yield scalar, keys


def _canonical_cycle(keys: list) -> tuple:
    # tr(XY) = tr(YX) = tr(Yᵀ Xᵀ); transposing block (i, j) gives block (j, i).
    n = len(keys)
    rev = [(j, i) for i, j in reversed(keys)]
    return min(tuple(w[i:] + w[:i]) for w in (keys, rev) for i in range(n))


def _product(blocks: _Blocks, keys) -> sp.Basic:
    mats = [blocks.cov[k] for k in keys]
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
        for scalar, keys in blocks.paths(word, start, start):
            total += scalar * trace(_product(blocks, _canonical_cycle(keys)))
    return total


def _matrix_value(blocks: _Blocks, words: dict, start, end, coeff_value, zero):
    """Block ``(start, end)`` of ``Σ coeff·word``."""
    terms = []
    for word, coeff in words.items():
        cval = coeff_value(coeff)
        for scalar, keys in blocks.paths(word, start, end):
            terms.append(cval * scalar * _product(blocks, keys))
    return sp.Add(*terms) if terms else zero


def _noise_expectation(k: int) -> dict:
    """``E_ξ[δ^k] = Σ_j coeff_j s^j`` with ``δ = s − √Δ ξ`` and ``ξ ~ N(0,1)``."""
    s = sp.Symbol("s")
    poly = sp.Poly(sp.expand((s - sp.sqrt(NOISE) * XI) ** k), s, XI)
    out: dict = {}
    for (js, jx), coeff in poly.terms():
        # E[ξ^n] = (n-1)!! for even n, 0 for odd n
        moment = 0 if jx % 2 else sp.factorial2(jx - 1)
        out[js] = out.get(js, 0) + coeff * moment
    return out


def _expect_error_power_outer(k: int) -> dict:
    """``E[δ^k z zᵀ]`` as ``{word: coeff}`` (noise integrated out)."""
    acc: dict = {}
    for j, cj in _noise_expectation(k).items():
        for word, coeff in expect_outer([("A",)] * j).items():
            acc[word] = sp.expand(acc.get(word, 0) + cj * coeff)
    return {w: c for w, c in acc.items() if c != 0}


def _sandwich(left: tuple, words: dict, right: tuple) -> dict:
    return {left + w + right: c for w, c in words.items()}


@dataclass(frozen=True)
class MatrixEquations:
    """Matrix-form risk and ODE right-hand sides.

    Attributes
    ----------
    risk : Expr
        ``ε = ½ E[(zᵀAz)²] = ½ (tr(AC)² + 2 tr(ACAC))`` in ``Q, ρ, T``.
    dQ, drho : MatrixExpr
        ``dQ/dt`` (p×p) and ``dρ/dt`` (p×p*).
    words : dict
        The word-level result before block expansion (``risk``, ``dQ``, ``drho``
        as ``{word: coefficient}``) — printable, and what codegen consumes.
    """

    risk: sp.Expr
    dQ: sp.MatrixExpr
    drho: sp.MatrixExpr
    words: dict
    coefficient: sp.Rational


def _word_level(model: Model) -> dict:
    """Derive risk, dQ, dρ as word sums in the letters A, B, C."""
    m1 = _expect_error_power_outer(1)          # E[δ zzᵀ]
    m2 = _expect_error_power_outer(2)          # E[δ² zzᵀ]
    # g = δ (B + Bᵀ) z restricted to λ; B is symmetric, so (B + Bᵀ) = 2B.
    grad_words = [("B",), ("B",)]

    def add(acc, words, factor):
        for w, c in words.items():
            acc[w] = sp.expand(acc.get(w, 0) + factor * c)

    dQ: dict = {}
    for h in grad_words:
        add(dQ, _sandwich(h, m1, ()), -ETA)         # −η E[g λᵀ]
        add(dQ, _sandwich((), m1, h), -ETA)         # −η E[λ gᵀ]
        for h2 in grad_words:
            add(dQ, _sandwich(h, m2, h2), ETA**2)   # η² E[r g gᵀ], r → 1
    drho: dict = {}
    for h in grad_words:
        add(drho, _sandwich(h, m1, ()), -ETA)       # −η E[g νᵀ]
    risk = expect_forms([("A",), ("A",)]) / 2       # ½ E[(zᵀAz)²]
    return {"risk": risk, "dQ": dQ, "drho": drho}


def _evaluate(words: dict, c, Q, rho, T, p, p_star, trace, zero_q, zero_r, explicit=False,
              trace_names=None):
    blocks = _Blocks(c, Q, rho, T, p, p_star, explicit)
    trace_syms = {}

    def coeff_value(coeff):
        subs = {}
        for s in coeff.free_symbols:
            if s.name.startswith("tr("):
                if s not in trace_syms:
                    word = tuple(s.name[3:-1])
                    trace_syms[s] = (trace_names[s] if trace_names
                                     else _trace_value(blocks, word, trace))
                subs[s] = trace_syms[s]
        return coeff.xreplace(subs)

    risk = coeff_value(words["risk"])
    dQ = _matrix_value(blocks, words["dQ"], LAM, LAM, coeff_value, zero_q)
    drho = _matrix_value(blocks, words["drho"], LAM, NU, coeff_value, zero_r)
    return risk, dQ, drho


def derive_matrix_form(model: Model, coefficient=None) -> MatrixEquations:
    """Width-independent matrix-form equations of a quadratic model.

    The result depends on the model only through the activation's ``z²``
    coefficient ``c``; ``p``, ``p*``, ``η`` and ``Δ`` stay symbols
    (:data:`~symquad.symbolic.symbols.P`, ``P_STAR``, ``ETA``, ``NOISE``).
    Passing a Symbol as `coefficient` keeps ``c`` symbolic too (codegen uses
    this so that one kernel serves every ``σ(z) = c z² + c0``).
    """
    c = _quadratic_coefficient(model) if coefficient is None else coefficient
    words = _word_level(model)
    Q, rho, T = matrix_symbols()
    risk, dQ, drho = _evaluate(words, c, Q, rho, T, P, P_STAR, sp.Trace,
                               sp.ZeroMatrix(P, P), sp.ZeroMatrix(P, P_STAR))
    return MatrixEquations(risk=risk, dQ=dQ, drho=drho, words=words, coefficient=c)


def explicit(model: Model, eqs: MatrixEquations | None = None):
    """Matrix-form equations evaluated on explicit entry-symbol matrices.

    Returns ``(risk, dQ, drho)``: an expanded scalar and explicit SymPy
    matrices in the entry symbols of :func:`overlap_symbols`, with ``η`` and
    ``Δ`` symbolic.
    """
    eqs = eqs or derive_matrix_form(model)
    p, k = model.p, model.p_star
    Q, rho, T = (sp.Matrix(M) for M in overlap_symbols(p, k))
    risk, dQ, drho = _evaluate(
        eqs.words, eqs.coefficient, Q, rho, T, sp.Integer(p), sp.Integer(k),
        lambda M: M.trace(), sp.zeros(p, p), sp.zeros(p, k), explicit=True)
    return (sp.expand(risk), sp.Matrix(dQ).applyfunc(sp.expand),
            sp.Matrix(drho).applyfunc(sp.expand))


def display_form(model: Model):
    """Readable matrix form: traces of ``(AC)^n`` named ``τ_n``.

    Returns ``(definitions, risk, dQ, drho)`` where ``definitions`` maps each
    ``τ_n`` Symbol to its expression in ``Q, ρ, T`` and the equations use the
    ``τ_n``.  ``τ_1 = E[ŷ − y_clean]`` and ``2 τ_2`` is its variance.
    """
    eqs = derive_matrix_form(model)
    Q, rho, T = matrix_symbols()
    placeholders = set(eqs.words["risk"].free_symbols)
    for key in ("dQ", "drho"):
        for coeff in eqs.words[key].values():
            placeholders |= coeff.free_symbols
    placeholders = sorted((s for s in placeholders if s.name.startswith("tr(")),
                          key=lambda s: (len(s.name), s.name))
    names = {s: sp.Symbol(f"tau_{len(s.name[3:-1]) // 2}") for s in placeholders}
    blocks = _Blocks(eqs.coefficient, Q, rho, T, P, P_STAR)
    definitions = {names[s]: _trace_value(blocks, tuple(s.name[3:-1]), sp.Trace)
                   for s in placeholders}
    risk, dQ, drho = _evaluate(eqs.words, eqs.coefficient, Q, rho, T, P, P_STAR, sp.Trace,
                               sp.ZeroMatrix(P, P), sp.ZeroMatrix(P, P_STAR),
                               trace_names=names)
    return definitions, risk, dQ, drho
