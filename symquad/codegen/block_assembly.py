"""Render the per-block drift assembly of an input spectrum (docs/derivation.md §1a).

The index-generic per-block drift of :func:`symquad.symbolic.blocks.block_moment_drift`
(derived from the update rule through the projectors ``P_c``) is printed as broadcasting
numpy code, one function per constraint, into ``symquad/_generated/block_assembly.py``.
Arrays carry the block axis before the matrix axes: ``Q``, ``Gb`` ``(..., B, p, p)``,
``rho``, ``Gtb`` ``(..., B, p, p*)``; the kinds at the total covariance (``G``, ``B``,
``(..., p, p)``), the Euclidean ``Qt = Σ_c Q^c`` and the readout broadcast over the blocks
(a ``None`` block axis); ``fs`` ``(..., B)`` holds ``f_c s_c``.  Nothing depends on ``B``:
one module for every number of blocks.
"""

from __future__ import annotations

import textwrap

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..spec import CONSTRAINTS, Model
from ..symbolic.blocks import CB, FS, MGB, MGTB, QBf, QTf, RHOBf, TR_SIGMA, block_moment_drift
from ..symbolic.moments import MB, MG, MR
from ..symbolic.symbols import PARAMS
from ..symbolic.update import UNITS, Af
from .assembly import cse_block_lines, drift_body_lines
from .printer import ScalarPrinter

__all__ = ["render_block_assembly_module", "STAND_IN"]

K, L, M = UNITS
_DIAG = "numpy.diagonal({x}, axis1=-2, axis2=-1)"
_SWAP = "numpy.swapaxes({x}, -1, -2)"

#: The model whose per-block drift is rendered (its stand-in: two blocks; the derivation
#: is for a generic block ``c`` and does not depend on ``B`` or the values).
STAND_IN = Model(2, 1, 1.0, spectrum="1/2:2,1/2:3", lr_readout=1.0)


def _array_code(atom, space: str) -> str:
    """numpy code of one atom in the output space ``"ckl"`` (dQ), ``"ckm"`` (dρ) or ``"k"``."""
    f, args = atom.func, atom.args
    # a unit index as an axis of (..., B, p, ·): k the rows, l the columns
    unit = {"ckl": {K: "[..., :, None]", L: "[..., None, :]"},
            "ckm": {K: "[..., :, None]"}, "k": {K: ""}}[space]
    if f is FS and args == (CB,):
        return "fs[..., :, None, None]"
    if f in (QBf, MGB) and args[0] == CB:
        name = "Q" if f is QBf else "Gb"
        i, j = args[1:]
        if (i, j) == (K, L):
            return name
        if (i, j) == (L, K):
            return _SWAP.format(x=name)
        if i == j:
            return f"{_DIAG.format(x=name)}{unit[i]}"
    if f is RHOBf and args == (CB, K, M):
        return "rho"
    if f is MGTB and args == (CB, K, M):
        return "Gtb"
    if f in (QTf, MG, MB):
        name = {QTf: "Qt", MG: "G", MB: "B"}[f]
        if len(set(args)) == 1:                     # a diagonal entry, broadcast over blocks
            return f"{_DIAG.format(x=name)}[..., None, :]{unit[args[0]]}"
        if args == (K, L):
            return f"{name}[..., None, :, :]"
    if f is Af:
        return f"a[..., None, :]{unit[args[0]]}" if space != "k" else "a"
    if f is MR and args == (K,) and space == "k":
        return "R"
    raise NotImplementedError(f"no array form of {atom} in index space {space}")


def _render(expr, space, printer, name):
    atoms = sorted(expr.atoms(sp.Function), key=sp.default_sort_key)
    expr = expr.xreplace({TR_SIGMA: sp.Symbol("tr_sigma")})
    return cse_block_lines(expr, atoms, lambda a: _array_code(a, space), name, printer, name)


def _drift_function(constraint: str, printer) -> list:
    md = block_moment_drift(STAND_IN.replace(constraint=constraint))
    args = ", ".join(s.name for s in PARAMS)
    out = [f"def drift_blocks_{constraint}(Q, rho, Qt, a, Gb, Gtb, G, B, R, fs, tr_sigma, "
           "params):",
           f'    """Per-block drift with constraint {constraint!r}: ``(dQ, dρ, da)``.',
           "",
           "    ``dQ`` (..., B, p, p), ``dρ`` (..., B, p, p*); ``da`` (..., p) or None when",
           "    ``R`` is (a fixed readout).",
           '    """',
           f"    {args} = params"]
    return out + drift_body_lines(md, ("ckl", "ckm", "k"), _render, printer)


def render_block_assembly_module() -> str:
    """The generated per-block assembly (one ``drift_blocks_<constraint>`` per constraint)."""
    printer = ScalarPrinter()
    doc = textwrap.dedent('''\
        """The per-block drift of an input spectrum, assembled from the moment kinds.

        Derived by symquad.symbolic.blocks (one SGD step through the projectors P_c,
        first order in 1/N) in the moment kinds of the block fields; rendered by
        symquad.codegen.block_assembly.  One module for every number of blocks B.

        Arguments (leading batch dimensions allowed; c a block, k, l students, m a teacher):
            Q      (..., B, p, p)    Q^c = W P_c Wᵀ/N
            rho    (..., B, p, p*)   ρ^c = W P_c W*ᵀ/N
            Qt     (..., p, p)       Σ_c Q^c (the Euclidean overlaps: the sphere's norms)
            a      (..., p)          student readout
            Gb     (..., B, p, p)    E[σ'(λ_k) μ^c_l δ],  μ^c_l = w_l P_c x/√N
            Gtb    (..., B, p, p*)   E[σ'(λ_k) μ*^c_m δ]
            G      (..., p, p)       E[σ'(λ_k) λ_l δ] = Σ_c Gb
            B      (..., p, p)       E[σ'(λ_k) σ'(λ_l) δ²]  (label noise included)
            R      (..., p)          E[σ(λ_k) δ], or None for a fixed readout
            fs     (..., B)          f_c s_c
            tr_sigma float           Σ_c f_c s_c = tr Σ/N
            params tuple             PARAMS, in this order (symquad.Model.kernel_params)
        Every expectation is over the fields at the total covariance
        Ω = Σ_c s_c [[Q^c, ρ^c], [ρ^cᵀ, T^c]].  Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "",
           "PARAMS = " + repr(tuple(s.name for s in PARAMS)), ""]
    for constraint in CONSTRAINTS:
        out += [""] + _drift_function(constraint, printer) + [""]
    out += ["", "DRIFT = {" + ", ".join(f"{c!r}: drift_blocks_{c}" for c in CONSTRAINTS)
            + "}"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)
