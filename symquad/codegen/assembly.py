"""Render the drift assembly: moment kinds → ``dQ/dt``, ``dρ/dt``, ``da/dt`` (any width).

The matrix and tensor routes evaluate the moment kinds of
:mod:`symquad.symbolic.moments` (``G``, ``Gt``, ``B``, ``R``); how those
combine into the ODE is the index-generic expression of
:func:`symquad.symbolic.moments.moment_drift`, derived from the update rule.
This module prints that expression as broadcasting numpy code, one function
per constraint, into ``symquad/_generated/assembly.py``: the one place the ODE
is assembled for every width, every activation and both routes.

Index-generic symbols become arrays by their index pattern: in ``dQ_kl``,
``Q_kl → Q``, ``Q_kk → diag(Q)[:, None]``, ``Q_ll → diag(Q)[None, :]``,
``a_k → a[:, None]``, ``G(l, k) → Gᵀ``, ``B(k, k) → diag(B)[:, None]``…; in
``dρ_km``, ``ρ_km → rho`` and the ``k``-only symbols as columns; in ``da_k``
plain vectors.  ``dQ`` is symmetrised (``½(dQ + dQᵀ)``) so that it is
symmetric to the last bit.
"""

from __future__ import annotations

import textwrap

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..spec import CONSTRAINTS, Model
from ..symbolic.moments import MB, MG, MGT, MR, moment_drift
from ..symbolic.symbols import PARAMS
from ..symbolic.update import UNITS, Af, Qf, RHOf
from .printer import ScalarPrinter
from .render import _emit_assignments

__all__ = ["render_assembly_module"]


K, L, M = UNITS

_DIAG = "numpy.diagonal({x}, axis1=-2, axis2=-1)"
_SWAP = "numpy.swapaxes({x}, -1, -2)"


def _array_code(atom, space: str) -> str:
    """numpy expression of one index-generic atom in the output index space."""
    f, args = atom.func, atom.args
    col = {"kl": {K: "[..., :, None]", L: "[..., None, :]"}, "km": {K: "[..., :, None]"},
           "k": {K: ""}}[space]
    names = {MG: "G", MB: "B", Qf: "Q"}
    if f in names and len(set(args)) == 1:                    # a diagonal entry
        return f"{_DIAG.format(x=names[f])}{col[args[0]]}"
    if f in (MG, MB, Qf):
        if args == (K, L):
            return names[f]
        if args == (L, K):
            return _SWAP.format(x=names[f])
    if f is MGT and args == (K, M):
        return "Gt"
    if f is RHOf and args == (K, M):
        return "rho"
    if f is Af:
        return f"a{col[args[0]]}"
    if f is MR and args == (K,) and space == "k":
        return "R"
    raise NotImplementedError(f"no array form of {atom} in index space {space}")


def cse_block_lines(expr, atoms, atom_code, tag, printer, target):
    """Lines assigning `target` from `expr`: each atom read once into ``_<tag>_<i>``
    (``atom_code(atom)`` its array code), common subexpressions ``_<tag>x<j>``, one sum."""
    symbols = {a: sp.Symbol(f"_{tag}_{i}") for i, a in enumerate(atoms)}
    lines = [f"    {symbols[a]} = {atom_code(a)}" for a in atoms]
    reps, (reduced,) = sp.cse([expr.xreplace(symbols)],
                              symbols=sp.numbered_symbols(f"_{tag}x"), order="canonical")
    lines += _emit_assignments(reps, printer)
    lines.append(f"    {target} = {printer.doprint(reduced)}")
    return lines


def _render_expression(expr, space, printer, name):
    """Lines computing `name` from an index-generic expression (CSE, then one sum)."""
    atoms = sorted(expr.atoms(sp.Function), key=sp.default_sort_key)
    return cse_block_lines(expr, atoms, lambda a: _array_code(a, space), name, printer, name)


def _drift_function(constraint: str, printer) -> list:
    md = moment_drift(Model(2, 1, 1.0, constraint=constraint, lr_readout=1.0))
    args = ", ".join(s.name for s in PARAMS)
    out = [f"def drift_{constraint}(Q, rho, a, G, Gt, B, R, params):",
           f'    """Drift with constraint {constraint!r}: ``(dQ/dt, dρ/dt, da/dt)``.',
           "",
           "    ``da`` is None when ``R`` is (a fixed readout).  Every array may carry",
           "    leading batch dimensions.",
           '    """',
           f"    {args} = params"]
    return out + drift_body_lines(md, ("kl", "km", "k"), _render_expression, printer)


def drift_body_lines(md, spaces, render, printer) -> list:
    """The body of a generated drift function after its parameters: ``dQ`` (symmetrised),
    ``dρ``, and ``da`` unless ``R`` is None; ``render(expr, space, printer, name)`` gives
    the lines of one output in its index space (`spaces`: of dQ, dρ, da)."""
    out = render(md.dQ, spaces[0], printer, "dQ")
    out.append("    dQ = 0.5 * (dQ + numpy.swapaxes(dQ, -1, -2))")
    out += render(md.drho, spaces[1], printer, "drho")
    out.append("    if R is None:")
    out.append("        return dQ, drho, None")
    out += render(md.da, spaces[2], printer, "da")
    out.append("    return dQ, drho, da")
    return out


def render_assembly_module() -> str:
    """The generated assembly module (one ``drift_<constraint>`` function per constraint)."""
    printer = ScalarPrinter()
    doc = textwrap.dedent('''\
        """The drift assembled from the moment kinds: one function per constraint.

        Derived by symquad.symbolic.update (one SGD step as a map of the order
        parameters, first order in 1/N) and symquad.symbolic.moments (the moment
        kinds of the factored gradients); rendered by symquad.codegen.assembly.

        Arguments (leading batch dimensions allowed; n = p + p*):
            Q      (..., p, p)    student-student overlaps  W Wᵀ/N
            rho    (..., p, p*)   student-teacher overlaps  W W*ᵀ/N
            a      (..., p)       student readout
            G      (..., p, p)    E[σ'(λ_k) λ_l δ]
            Gt     (..., p, p*)   E[σ'(λ_k) ν_m δ]
            B      (..., p, p)    E[σ'(λ_k) σ'(λ_l) δ²]  (label noise included)
            R      (..., p)       E[σ(λ_k) δ], or None for a fixed readout
            params tuple          PARAMS, in this order (symquad.Model.kernel_params)
        Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "",
           "PARAMS = " + repr(tuple(s.name for s in PARAMS)), ""]
    for constraint in CONSTRAINTS:
        out += [""] + _drift_function(constraint, printer) + [""]
    out += ["", "DRIFT = {" + ", ".join(f"{c!r}: drift_{c}" for c in CONSTRAINTS) + "}"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)
