r"""Input covariances with ``B`` distinct eigenvalues: the one definition every stage reads.

The field ``Model.spectrum`` says that the inputs are ``x ~ N(0, Σ)`` with

.. math::  Σ = \sum_{b=1}^{B} s_b P_b, \qquad \operatorname{rank} P_b = f_b N,\quad
           \sum_b f_b = 1,

``P_b`` orthogonal projectors onto mutually orthogonal subspaces (in the simulators: blocks
of consecutive coordinates), ``f_b > 0`` the fraction of the ``N`` input directions in block
``b`` and ``s_b > 0`` its eigenvalue.  The default ``((1, 1),)`` is the isotropic input
``Σ = I`` of docs/model.md §1.  The order parameters are then per block
(docs/model.md §1a): ``Q^b = W P_b Wᵀ/N``, ``ρ^b = W P_b W*ᵀ/N``, ``T^b = W* P_b W*ᵀ/N``.

A value is a tuple of pairs ``(f_b, s_b)`` of exact rationals (:class:`fractions.Fraction`),
the way the package keeps its other exact fields (readouts, activation coefficients):
a float is read through its shortest decimal (``0.25`` is ``1/4``, ``0.1`` is ``1/10``).
The fractions must sum to 1 **exactly**: three blocks of a third are written ``1/3``, not
``0.333…`` (whose shortest decimals sum to ``0.9999999999999999``; the error says so).
Exactness matters because the simulators give block ``b`` exactly ``f_b N`` coordinates
(``f_b N`` must be an integer for every block, :func:`block_sizes`).

The text form (the CLI flag ``--spectrum``, saved files, sweep grids) is
``"f_1:s_1,f_2:s_2,…"`` (``"0.25:2,0.75:0.6"`` or ``"1/4:2,3/4:3/5"``); ``;`` may separate
the blocks instead of ``,`` (a sweep grid separates its values by commas).

Standard library only (``spec.py`` imports it).
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Integral, Rational, Real

__all__ = ["MAX_BLOCKS", "MAX_EIGENVALUE", "ISOTROPIC", "parse_spectrum", "spectrum_text",
           "stand_in_spectrum", "block_sizes", "check_block_room", "block_dimension", "blocks_key",
           "has_spectrum", "block_axis", "power_law_spectrum"]

#: Largest number of blocks ``B``.  The state holds ``B`` copies of ``(Q, ρ)`` (a state of
#: ``B (p(p+1)/2 + p p*)`` entries per replica), one right-hand side evaluates the
#: three-point sum against ``B (p + p*)`` legs, and the full simulator needs at least one
#: input coordinate per block (``N >= B``); 256 blocks keep the ODE of a ``(4, 2)`` model
#: at 4096 state entries.  Checked when the Model is made.
MAX_BLOCKS = 256

#: Eigenvalues ``s_b`` lie in ``[1/MAX_EIGENVALUE, MAX_EIGENVALUE]``: a route multiplies two
#: covariances (``s_b²`` terms) and squares the readouts beside them in float64.
MAX_EIGENVALUE = Fraction(10) ** 100

#: The isotropic input ``Σ = I``: one block holding every direction, eigenvalue 1.
ISOTROPIC = ((Fraction(1), Fraction(1)),)

_HINT = ("spectrum must be a sequence of (fraction, eigenvalue) pairs, e.g. "
         "((1/4, 2), (3/4, 3/5)), or the text 'f1:s1,f2:s2,...' such as '0.25:2,0.75:0.6'")


def _rational(value, what: str) -> Fraction:
    """An exact rational from an int, Fraction, float (shortest decimal) or numeric text."""
    if isinstance(value, bool):
        raise TypeError(f"spectrum: {what} must be a number, got a bool")
    if isinstance(value, (Integral, Rational)):
        return Fraction(value)
    if isinstance(value, Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"spectrum: {what} must be finite, got {value!r}")
        return Fraction(repr(float(value)))
    if isinstance(value, str):
        text = value.strip()
        try:
            if "/" in text:
                num, den = text.split("/")
                return Fraction(int(num), int(den))
            if len(text) > 64:
                raise ValueError
            as_float = float(text)
            if not math.isfinite(as_float):
                raise ValueError
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"spectrum: {what} must be a finite rational number such as "
                             f"'3', '1/4' or '0.6', got {value!r}") from None
    raise TypeError(f"spectrum: {what} must be a number, got {value!r}; {_HINT}")


def _pairs(value):
    """The raw ``(f, s)`` pairs of `value` (text or a sequence of pairs)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"spectrum must not be empty; {_HINT}")
        if len(text) > 100_000:
            raise ValueError(f"spectrum text too long ({len(text)} characters); {_HINT}")
        blocks = text.replace(";", ",").split(",")
        if len(blocks) > MAX_BLOCKS:
            raise ValueError(f"spectrum has {len(blocks)} blocks; B must be in "
                             f"[1, {MAX_BLOCKS}] (symquad.spectrum.MAX_BLOCKS)")
        out = []
        for i, block in enumerate(blocks):
            parts = block.split(":")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise ValueError(f"spectrum: block {i + 1} must be 'fraction:eigenvalue', "
                                 f"got {block.strip()!r}; {_HINT}")
            out.append(tuple(parts))
        return out
    if isinstance(value, (bytes, dict)) or not hasattr(value, "__len__"):
        raise TypeError(f"{_HINT}; got {type(value).__name__}")
    if len(value) > MAX_BLOCKS:
        raise ValueError(f"spectrum has {len(value)} blocks; B must be in [1, {MAX_BLOCKS}] "
                         f"(symquad.spectrum.MAX_BLOCKS)")
    out = []
    for i, pair in enumerate(value):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"spectrum: block {i + 1} must be a pair (fraction, eigenvalue), "
                             f"got {pair!r}; {_HINT}")
        out.append(tuple(pair))
    return out


def parse_spectrum(value) -> tuple:
    """The canonical spectrum ``((f_1, s_1), …, (f_B, s_B))`` (Fractions) of `value`.

    `value` is a sequence of pairs ``(f_b, s_b)`` or the text ``"f1:s1,f2:s2,…"``.
    Checked: ``1 <= B <= MAX_BLOCKS``; every ``f_b`` in ``(0, 1]`` and ``Σ f_b = 1``
    exactly (as rationals); every ``s_b`` in ``[1e-100, 1e100]``.  The blocks keep the
    order given (block ``b`` is a label: the teacher's power per block is the user's).

    Raises
    ------
    TypeError, ValueError
        Naming ``spectrum``, the block at fault and the allowed range.
    """
    pairs = _pairs(value)
    if not pairs:
        raise ValueError(f"spectrum must have at least one block; {_HINT}")
    out = []
    for i, (f, s) in enumerate(pairs):
        f = _rational(f, f"the fraction f_{i + 1}")
        s = _rational(s, f"the eigenvalue s_{i + 1}")
        if not 0 < f <= 1:
            raise ValueError(f"spectrum: the fraction f_{i + 1} must be in (0, 1], got {f}")
        if not 1 / MAX_EIGENVALUE <= s <= MAX_EIGENVALUE:
            raise ValueError(f"spectrum: the eigenvalue s_{i + 1} must be in [1e-100, 1e100] "
                             f"(positive; symquad.spectrum.MAX_EIGENVALUE), got {float(s):g}")
        out.append((f, s))
    total = sum(f for f, _ in out)
    if total != 1:
        raise ValueError(
            f"spectrum: the fractions must sum to 1 exactly (as rationals), got {total} "
            f"(= {float(total):.17g}); write thirds and the like as fractions, e.g. "
            f"'1/3:2,1/3:1,1/3:1/2'")
    return tuple(out)


def spectrum_text(spectrum) -> str:
    """The text form ``"f1:s1,f2:s2,…"`` of a canonical spectrum (read back by :func:`parse_spectrum`)."""
    return ",".join(f"{f}:{s}" for f, s in spectrum)


def blocks_key(spectrum) -> str:
    """What the generated code of a spectrum depends on: the number of blocks, ``"B=3"``."""
    return f"B={len(spectrum)}"


def stand_in_spectrum(spectrum) -> tuple:
    """A fixed spectrum with the same number of blocks (what the symbolic caches see).

    ``B`` blocks of fraction ``1/B`` with the eigenvalues ``2, 3, …, B + 1`` (never the
    isotropic default, also for ``B = 1``).
    """
    B = len(spectrum)
    return tuple((Fraction(1, B), Fraction(b + 2)) for b in range(B))


def block_sizes(spectrum, N: int) -> tuple:
    """The number of input coordinates ``f_b N`` of each block at dimension ``N``.

    Raises ValueError unless every ``f_b N`` is an integer: ``N`` must be a multiple of
    the least common denominator of the fractions (named in the error).
    """
    lcd = math.lcm(*(f.denominator for f, _ in spectrum))
    if N % lcd:
        raise ValueError(f"N must be a multiple of {lcd} (the least common denominator of "
                         f"the spectrum's fractions {spectrum_text(spectrum)}): each block "
                         f"holds exactly f_b N input coordinates; got N = {N}")
    return tuple(int(f * N) for f, _ in spectrum)


def check_block_room(model, N, name="N") -> tuple:
    """The block sizes ``f_b N`` of a spectrum model at dimension `N`, checked for the simulators.

    Every ``f_b N`` must be an integer (``N`` a multiple of the least common denominator
    of the fractions, :func:`symquad.spectrum.block_sizes`) and at least ``p + p* + b``
    (the reduced simulator keeps an orthonormal basis of the weights' span and a batch's
    inputs within each block).  Raises ValueError naming `name` otherwise.
    """
    try:
        sizes = block_sizes(model.spectrum, N)
    except ValueError as exc:
        raise ValueError(str(exc).replace("N must be", f"{name} must be", 1)) from None
    need = model.p + model.p_star + model.batch_size
    if min(sizes) < need:
        raise ValueError(f"{name} = {N} gives a block of {min(sizes)} coordinates; every block "
                         f"needs at least p + p_star + batch_size = {need} "
                         f"(spectrum {model._field_text('spectrum')})")
    return sizes


def block_dimension(model, N) -> int:
    """The smallest dimension ``>= N`` at which every block of `model` has room
    (:func:`check_block_room`): a multiple of the fractions' least common denominator."""
    lcd = math.lcm(*(f.denominator for f, _ in model.spectrum))
    need = model.p + model.p_star + model.batch_size
    smallest = min(f for f, _ in model.spectrum)
    low = max(int(N), math.ceil(need / smallest))
    return lcd * math.ceil(low / lcd)


def has_spectrum(model) -> bool:
    """True when `model` has a non-default input spectrum: its overlaps carry a block axis."""
    return "spectrum" in model.changed_fields()


def block_axis(model) -> tuple:
    """``(B,)`` for a model with an input spectrum, ``()`` for the isotropic model: the
    axes before the matrix axes of ``Q``, ``ρ``, ``T``."""
    return (len(model.spectrum),) if has_spectrum(model) else ()


def _exponent(value, name: str) -> float:
    """An exponent in ``[0, 20]`` (TypeError for a non-number, ValueError out of range)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a finite real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if not 0 <= float(value) <= 20:
        raise ValueError(f"{name} must be in [0, 20] (j^-{name} over up to {MAX_BLOCKS} "
                         f"blocks stays within the eigenvalue range [1e-100, 1e100]), got "
                         f"{value!r}")
    return float(value)


def power_law_spectrum(alpha, L, teacher_exponent=0.0):
    r"""An ``L``-block truncation of the power law ``s_j ∝ j^{−α}`` and the teacher's power per block.

    ``L`` blocks of equal fraction ``f_j = 1/L`` with eigenvalues ``s_j = j^{−α}/Z``,
    ``Z = (1/L) Σ_i i^{−α}`` (so ``tr Σ/N = Σ_j f_j s_j = 1``), each ``j^{−α}`` read as the
    exact rational of its shortest decimal (the package's exact spectrum); and the
    teacher's share of its power in block ``j``, ``t_j = j^{−β}/Σ_i i^{−β}`` with ``β`` =
    `teacher_exponent` (``β = 0``: ``t_j = f_j``, the isotropic teacher), so that the
    per-block teacher overlaps are ``T^j = t_j T``.

    Parameters
    ----------
    alpha : float
        Decay exponent of the eigenvalues, in ``[0, 20]``.
    L : int
        Number of blocks, ``1 <= L <= MAX_BLOCKS``.
    teacher_exponent : float, optional
        Decay exponent ``β`` of the teacher's power per block, in ``[0, 20]``.

    Returns
    -------
    (spectrum, teacher) : (tuple of (Fraction, Fraction), tuple of float)
        ``Model(..., spectrum=spectrum)``; ``T^j = teacher[j] · T``.

    Examples
    --------
    >>> spectrum, teacher = power_law_spectrum(1.0, 2)
    >>> [(str(f), str(s)) for f, s in spectrum]
    [('1/2', '4/3'), ('1/2', '2/3')]
    >>> teacher
    (0.5, 0.5)
    """
    alpha = _exponent(alpha, "alpha")
    beta = _exponent(teacher_exponent, "teacher_exponent")
    if isinstance(L, bool) or not isinstance(L, Integral) or not 1 <= L <= MAX_BLOCKS:
        raise ValueError(f"L must be an integer in [1, {MAX_BLOCKS}] "
                         f"(symquad.spectrum.MAX_BLOCKS), got {L!r}")
    raw = [Fraction(repr(float(j) ** -alpha)) for j in range(1, L + 1)]
    mean = sum(raw) / L
    spectrum = parse_spectrum(tuple((Fraction(1, L), r / mean) for r in raw))
    weights = [float(j) ** -beta for j in range(1, L + 1)]
    total = math.fsum(weights)
    return spectrum, tuple(w / total for w in weights)
