"""The SymPy symbols every derivation stage shares.

Entry symbols are named ``Q_i_j``, ``rho_i_m``, ``T_l_m`` (1-based, valid Python
identifiers, so generated code can use them) and print in LaTeX as ``Q_{ij}``,
``\\rho_{im}``, ``T_{lm}`` through :func:`latex_names`.  ``Q`` and ``T`` are
symmetric: ``Q[i, j]`` and ``Q[j, i]`` are the same symbol.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

# the module, not model_fields: looked up when called, so a replacement in symquad.spec
# (tests' synthetic fields) takes effect here
from .. import spec

__all__ = [
    "ETA", "NOISE", "WEIGHT_DECAY", "BATCH", "ETA_READOUT", "PARAMS", "P", "P_STAR", "XI",
    "MAX_ENTRY_SYMBOLS", "overlap_symbols", "field_symbols", "readout_symbols",
    "matrix_symbols", "latex_names", "latex_name", "check_entry_symbol_count",
    "entry_symbol_count", "latex_names_for",
]

#: Most entry symbols ``Q_ij (i <= j), ρ_im, T_lm`` that :func:`overlap_symbols` builds.
#: Beyond it (``p ≈ 200`` at ``p* = 2``) an explicit entry-by-entry object is
#: refused: its symbols alone take seconds and hundreds of MB (``p = 1000``:
#: 5·10⁵ symbols, 12 s, 1.1 GB measured), and every consumer of them costs far
#: more; the matrix and tensor forms are width independent.
MAX_ENTRY_SYMBOLS = 20_000

#: SGD step size η, label-noise variance Δ, widths p and p* (matrix form).
def _parameter_symbols():
    """One Symbol per kernel parameter, built from the Model fields' metadata."""
    by_param = {f.metadata["param"]: f for f in spec.model_fields() if "param" in f.metadata}
    out = []
    for name in spec.KERNEL_PARAMS:
        kind = "positive" if name == "eta" else by_param[name].metadata["kind"]
        out.append(sp.Symbol(name, positive=True) if kind in ("positive", "int")
                   else sp.Symbol(name, nonnegative=True))
    return tuple(out)


#: The scalar parameters of every generated kernel, in the order of their ``PARAMS``
#: tuple and of :meth:`symquad.Model.kernel_params` (:data:`symquad.spec.KERNEL_PARAMS`).
PARAMS = _parameter_symbols()
_BY_NAME = {s.name: s for s in PARAMS}
#: SGD step size η, label-noise variance Δ, weight decay λ, mini-batch size b and
#: readout learning rate η_a.
ETA, NOISE, WEIGHT_DECAY, BATCH, ETA_READOUT = (
    _BY_NAME[n] for n in ("eta", "Delta", "weight_decay", "batch_size", "lr_readout"))
P = sp.Symbol("p", positive=True, integer=True)
P_STAR = sp.Symbol("p_star", positive=True, integer=True)
#: The standard normal label-noise variable ξ.
XI = sp.Symbol("xi", real=True)


def _symmetric(name: str, n: int) -> sp.Matrix:
    rows = [[sp.Symbol(f"{name}_{min(i, j) + 1}_{max(i, j) + 1}", real=True)
             for j in range(n)] for i in range(n)]
    return sp.ImmutableMatrix(rows)


def entry_symbol_count(p: int, p_star: int) -> int:
    """Number of distinct entry symbols of ``(Q, ρ, T)``: ``p(p+1)/2 + p p* + p*(p*+1)/2``."""
    return p * (p + 1) // 2 + p * p_star + p_star * (p_star + 1) // 2


def check_entry_symbol_count(p: int, p_star: int) -> None:
    """Refuse (ValueError) widths whose entry symbols exceed :data:`MAX_ENTRY_SYMBOLS`.

    Runs before any symbol is built, so an oversized request fails at once.
    """
    count = entry_symbol_count(p, p_star)
    if count > MAX_ENTRY_SYMBOLS:
        raise ValueError(
            f"an entry-by-entry (explicit) object at p={p}, p_star={p_star} needs {count} "
            f"entry symbols (> {MAX_ENTRY_SYMBOLS} allowed; their number grows like p²); "
            f"the matrix form (sigma = c z**2) and the tensor form (any polynomial) are "
            f"width independent: symquad.derive(model) with form='matrix' or 'tensor'")


@lru_cache(maxsize=None)
def overlap_symbols(p: int, p_star: int):
    """Entry-symbol matrices ``(Q, rho, T)`` of shapes (p,p), (p,p*), (p*,p*).

    Their number grows like ``p²``: :func:`check_entry_symbol_count` refuses
    more than :data:`MAX_ENTRY_SYMBOLS` before any is built.
    """
    check_entry_symbol_count(p, p_star)
    Q = _symmetric("Q", p)
    T = _symmetric("T", p_star)
    rho = sp.ImmutableMatrix(p, p_star,
                             lambda i, m: sp.Symbol(f"rho_{i + 1}_{m + 1}", real=True))
    return Q, rho, T


@lru_cache(maxsize=None)
def field_symbols(p: int, p_star: int):
    """Local fields ``(λ_1..λ_p)`` and ``(ν_1..ν_p*)`` as tuples of Symbols."""
    lam = tuple(sp.Symbol(f"lambda_{k + 1}", real=True) for k in range(p))
    nu = tuple(sp.Symbol(f"nu_{m + 1}", real=True) for m in range(p_star))
    return lam, nu


@lru_cache(maxsize=None)
def readout_symbols(p: int, p_star: int):
    """Output weights ``(a_1..a_p)`` of the student and ``(b_1..b_p*)`` of the teacher."""
    a = tuple(sp.Symbol(f"a_{k + 1}", real=True) for k in range(p))
    b = tuple(sp.Symbol(f"b_{m + 1}", real=True) for m in range(p_star))
    return a, b


def matrix_symbols():
    """Width-independent MatrixSymbols ``Q`` (p×p), ``rho`` (p×p*), ``T`` (p*×p*)."""
    return (sp.MatrixSymbol("Q", P, P), sp.MatrixSymbol("rho", P, P_STAR),
            sp.MatrixSymbol("T", P_STAR, P_STAR))


#: LaTeX heads of the entry, field and readout symbols (``Q_1_2`` -> ``Q_{12}``,
#: ``nu_3`` -> ``\nu_{3}``, ``a_2`` -> ``a_{2}``).
_ENTRY_HEADS = {"Q": "Q", "rho": r"\rho", "T": "T"}
_FIELD_HEADS = {"lambda": r"\lambda", "nu": r"\nu", "a": "a", "b": "b"}


def _parameter_names() -> dict:
    """Width-independent names: the widths, ξ, and every kernel parameter (field metadata)."""
    names = {ETA: r"\eta", P: "p", P_STAR: "p^{*}", XI: r"\xi"}
    names.update({_BY_NAME[f.metadata["param"]]: f.metadata["latex"] for f in spec.model_fields()
                  if "param" in f.metadata})
    return names


#: Width-independent names (parameters and the label-noise variable).
_PARAMETER_NAMES = _parameter_names()


def latex_name(symbol, wide: bool = False):
    """LaTeX of one entry, field or readout symbol (``rho_2_1`` -> ``\rho_{21}``), else None.

    ``wide=True`` separates two indices by a comma (``Q_{10,12}``), as needed
    once an index has two digits.
    """
    if symbol in _PARAMETER_NAMES:
        return _PARAMETER_NAMES[symbol]
    parts = getattr(symbol, "name", "").split("_")
    if len(parts) == 3 and parts[0] in _ENTRY_HEADS and parts[1].isdigit() \
            and parts[2].isdigit():
        return f"{_ENTRY_HEADS[parts[0]]}_{{{parts[1]}{',' if wide else ''}{parts[2]}}}"
    if len(parts) == 2 and parts[0] in _FIELD_HEADS and parts[1].isdigit():
        return f"{_FIELD_HEADS[parts[0]]}_{{{parts[1]}}}"
    return None


def latex_names_for(symbols) -> dict:
    """``symbol -> LaTeX`` for the given symbols (those :func:`latex_name` knows).

    Width independent: it names only the symbols passed in (e.g. the free
    symbols of the expressions being printed), never all ``p²`` entries.
    """
    symbols = list(symbols)
    wide = any(int(part) >= 10 for s in symbols if latex_name(s) is not None
               for part in s.name.split("_")[1:] if part.isdigit())
    names = dict(_PARAMETER_NAMES)
    for s in symbols:
        name = latex_name(s, wide)
        if name is not None:
            names[s] = name
    return names


def latex_names(p: int, p_star: int) -> dict:
    """``symbol -> LaTeX`` map for :func:`sympy.latex`'s ``symbol_names``.

    Names every entry of ``(Q, ρ, T)`` and every field of a ``(p, p*)`` model,
    so its size grows like ``p²`` (checked by :func:`overlap_symbols`); to print
    an expression, :func:`latex_names_for` its free symbols is width independent.
    """
    Q, rho, T = overlap_symbols(p, p_star)
    lam, nu = field_symbols(p, p_star)
    a, b = readout_symbols(p, p_star)
    symbols = (set(Q.free_symbols) | rho.free_symbols | T.free_symbols | set(lam) | set(nu)
               | set(a) | set(b))
    return latex_names_for(symbols)
