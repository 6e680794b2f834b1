"""Gaussian expectations of products of quadratic forms, in matrix form.

For ``z ~ N(0, C)`` and symmetric matrices built as *words* (products of the
symmetric base matrices, e.g. ``A C A``), Gaussian integration by parts gives
two reduction rules (``s_W = zᵀ W z``, ``∇ s_W = (W + Wᵀ) z``):

.. math::

    E[s_{W_0} F] = \\operatorname{tr}(W_0 C)\\, E[F] + E[z^T W_0 C\\, ∇F],

    E[z z^T F] = C\\, E[F] + C\\, E[∇∇^T F]\\, C .

Applied to ``F = Π_k s_{W_k}`` they reduce any such expectation to traces of
words times words, whatever the dimension: the width-independent matrix-form route
(docs/derivation.md §3).  A word is a tuple of base-matrix names; all base matrices are
symmetric, so the transpose of a word is the reversed word and traces are
invariant under rotation and reversal of the word.

The results are linear combinations ``{word: coefficient}`` whose coefficients
are SymPy expressions in :class:`Trace` placeholders ``tr(word)``; turning
words into blocks of ``Q, ρ, T`` is :mod:`symquad.symbolic.matrix_form`'s job.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import sympy as sp

__all__ = ["canonical_trace", "trace_symbol", "expect_forms", "expect_outer", "COV"]

#: Name of the covariance matrix in words.
COV = "C"


def canonical_trace(word: tuple) -> tuple:
    """Representative of ``tr(word)`` under rotation and reversal (symmetric letters)."""
    n = len(word)
    candidates = []
    for w in (word, word[::-1]):
        candidates.extend(w[i:] + w[:i] for i in range(n))
    return min(candidates)


@lru_cache(maxsize=None)
def trace_symbol(word: tuple) -> sp.Symbol:
    """A commutative placeholder Symbol for ``tr(word)`` (canonical word)."""
    return sp.Symbol("tr(" + "".join(canonical_trace(word)) + ")")


def _canonical_form(word: tuple) -> tuple:
    # zᵀ W z = zᵀ Wᵀ z: a quadratic form only sees the symmetric part.
    return min(word, word[::-1])


def _gradient_words(word: tuple) -> tuple:
    """Words of ``W + Wᵀ`` (``∇ zᵀWz = (W + Wᵀ) z``)."""
    return (word, word[::-1])


@lru_cache(maxsize=None)
def _expect_forms(forms: tuple) -> sp.Expr:
    if not forms:
        return sp.Integer(1)
    w0, rest = forms[0], forms[1:]
    total = trace_symbol(w0 + (COV,)) * _expect_forms(rest)
    for k, wk in enumerate(rest):
        others = rest[:k] + rest[k + 1:]
        for h in _gradient_words(wk):
            merged = _canonical_form(w0 + (COV,) + h)
            total += _expect_forms(tuple(sorted(others + (merged,))))
    return sp.expand(total)


def expect_forms(forms) -> sp.Expr:
    """``E[Π_k zᵀ W_k z]`` for words ``W_k``, as a polynomial in trace placeholders.

    Examples
    --------
    >>> expect_forms([("A",), ("A",)])
    tr(AC)**2 + 2*tr(ACAC)
    """
    return _expect_forms(tuple(sorted(_canonical_form(tuple(w)) for w in forms)))


def _add(acc: dict, word: tuple, coeff) -> None:
    acc[word] = acc[word] + coeff


@lru_cache(maxsize=None)
def _expect_outer(forms: tuple) -> tuple:
    acc: dict = defaultdict(lambda: sp.Integer(0))
    _add(acc, (COV,), _expect_forms(forms))
    for k, wk in enumerate(forms):
        others = forms[:k] + forms[k + 1:]
        for h in _gradient_words(wk):
            _add(acc, (COV,) + h + (COV,), _expect_forms(others))
    for k, wk in enumerate(forms):
        for l, wl in enumerate(forms):
            if k == l:
                continue
            others = tuple(f for j, f in enumerate(forms) if j not in (k, l))
            inner = dict(_expect_outer(others))
            for hk in _gradient_words(wk):
                for hl in _gradient_words(wl):
                    for word, coeff in inner.items():
                        _add(acc, (COV,) + hk + word + hl + (COV,), coeff)
    return tuple(sorted((w, sp.expand(c)) for w, c in acc.items() if sp.expand(c) != 0))


def expect_outer(forms) -> dict:
    """``E[z zᵀ Π_k zᵀ W_k z]`` as ``{word: coefficient}`` (the matrix is Σ coeff·word).

    Examples
    --------
    >>> expect_outer([("A",)])
    {('C',): tr(AC), ('C', 'A', 'C'): 2}
    """
    return dict(_expect_outer(tuple(sorted(_canonical_form(tuple(w)) for w in forms))))


# ---- moments with open legs: E[z_{x_1} … z_{x_L} (zᵀAz)^f] ---------------------------

@lru_cache(maxsize=None)
def _expect_legs(depths: tuple, forms: int) -> tuple:
    """Recursion of :func:`expect_legs` on legs ``((CA)^{j} z)_x`` of the given depths ``j``.

    Gaussian integration by parts on the first leg, ``E[(Mz)_x Φ] = Σ_y (MC)_{xy}
    E[∂_y Φ]``: the derivative either closes the leg with another one,
    ``(CA)^j C ((CA)^{j'})ᵀ = (CA)^{j+j'} C``, or hits a form,
    ``∂_y (zᵀAz)^f = 2f (zᵀAz)^{f−1} (Az)_y``, which deepens the leg by one.
    Returns ``((pairs, coefficient), ...)`` with ``pairs`` a sorted tuple of
    ``(leg, leg', J)`` (leg numbers relative to `depths`).
    """
    if not depths:
        return (((), _expect_forms((("A",),) * forms)),)
    acc: dict = defaultdict(lambda: sp.Integer(0))
    j0, rest = depths[0], depths[1:]
    for pos, j in enumerate(rest):
        others = rest[:pos] + rest[pos + 1:]
        for pairs, coeff in _expect_legs(others, forms):
            # renumber: legs of `others` -> legs of `depths` (skip 0 and pos + 1)
            names = [i + 1 for i in range(len(rest)) if i != pos]
            moved = tuple((names[a], names[b], J) for a, b, J in pairs)
            key = tuple(sorted(moved + ((0, pos + 1, j0 + j),)))
            acc[key] += coeff
    if forms:
        for pairs, coeff in _expect_legs((j0 + 1,) + rest, forms - 1):
            acc[pairs] += 2 * forms * coeff
    return tuple((k, sp.expand(c)) for k, c in sorted(acc.items()) if sp.expand(c) != 0)


def expect_legs(n_legs: int, forms: int) -> dict:
    """``E[z_{x_1} … z_{x_L} (zᵀAz)^f]`` as ``{pairing: coefficient}``.

    Each key is a perfect matching of the legs ``0..L−1`` with a word per
    pair, ``((a, b, J), ...)`` for the factor ``[(CA)^J C]_{x_a x_b}``; the
    coefficients are polynomials in trace placeholders ``tr((AC)^j)``.  Zero
    for an odd number of legs.

    Examples
    --------
    >>> expect_legs(2, 1)
    {((0, 1, 0),): tr(AC), ((0, 1, 1),): 2}
    """
    if n_legs % 2:
        return {}
    return dict(_expect_legs((0,) * n_legs, forms))
