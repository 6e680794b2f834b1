"""The SymPy symbols every derivation stage shares.

Entry symbols are named ``Q_i_j``, ``rho_i_m``, ``T_l_m`` (1-based, valid Python
identifiers, so generated code can use them) and print in LaTeX as ``Q_{ij}``,
``\\rho_{im}``, ``T_{lm}`` through :func:`latex_names`.  ``Q`` and ``T`` are
symmetric: ``Q[i, j]`` and ``Q[j, i]`` are the same symbol.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

__all__ = [
    "ETA", "NOISE", "WEIGHT_DECAY", "BATCH", "ETA_READOUT", "PARAMS", "P", "P_STAR", "XI",
    "overlap_symbols", "field_symbols", "readout_symbols", "matrix_symbols", "latex_names",
]

#: SGD step size η, label-noise variance Δ, widths p and p* (matrix form).
def _parameter_symbols():
    """One Symbol per kernel parameter, built from the Model fields' metadata."""
    from ..spec import KERNEL_PARAMS, model_fields
    by_param = {f.metadata["param"]: f for f in model_fields() if "param" in f.metadata}
    out = []
    for name in KERNEL_PARAMS:
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


@lru_cache(maxsize=None)
def overlap_symbols(p: int, p_star: int):
    """Entry-symbol matrices ``(Q, rho, T)`` of shapes (p,p), (p,p*), (p*,p*)."""
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


def latex_names(p: int, p_star: int) -> dict:
    """``symbol -> LaTeX`` map for :func:`sympy.latex`'s ``symbol_names``."""
    sep = "," if max(p, p_star) >= 10 else ""
    from ..spec import model_fields
    names = {ETA: r"\eta", P: "p", P_STAR: "p^{*}", XI: r"\xi"}
    names.update({_BY_NAME[f.metadata["param"]]: f.metadata["latex"] for f in model_fields()
                  if "param" in f.metadata})
    Q, rho, T = overlap_symbols(p, p_star)
    for mat, head in ((Q, "Q"), (rho, r"\rho"), (T, "T")):
        for s in mat.free_symbols:
            _, i, j = s.name.rsplit("_", 2)
            names[s] = f"{head}_{{{i}{sep}{j}}}"
    a, b = readout_symbols(p, p_star)
    for s in a + b:
        names[s] = f"{s.name[0]}_{{{s.name.split('_')[1]}}}"
    lam, nu = field_symbols(p, p_star)
    for s in lam:
        names[s] = rf"\lambda_{{{s.name.split('_')[1]}}}"
    for s in nu:
        names[s] = rf"\nu_{{{s.name.split('_')[1]}}}"
    return names
