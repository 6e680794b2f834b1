r"""Render the diffusion matrix: its assembly from moment kinds, and the route modules.

* :func:`render_diffusion_assembly` → ``symquad/_generated/diffusion_assembly.py``:
  the blocks of ``D`` (:func:`symquad.symbolic.diffusion.moment_diffusion`, one
  function per constraint) as broadcasting numpy code in gathered arrays
  (:mod:`symquad.runtime.diffusion_engine`);
* :func:`render_diffusion_matrix_module` → ``symquad/_generated/diffusion_matrix.py``:
  the moment kinds for ``σ = c z² + c0``, ``σ* = c* z² + c0*`` as words
  ``(CA)^J C`` read at index arrays (:mod:`symquad.symbolic.diffusion_matrix`);
* :func:`render_diffusion_tensor_module`: the multigraph plan of the kinds for
  one pair of polynomial activations (generated on demand into the kernel
  cache; :mod:`symquad.symbolic.diffusion_tensor`);
* :func:`render_diffusion_entries_module`: the entry route, ``D`` entry by
  entry for one model structure (kernel cache).
"""

from __future__ import annotations

import json
import pprint
import textwrap

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..numeric.layout import state_layout
from ..spec import CONSTRAINTS, Model
from ..symbolic.diffusion import (KY, LY, MY, TEACHER_FIELD, Af, K, L, M, Qf, RHOf,
                                  diffusion_polynomials, moment_diffusion, parse_kind)
from ..symbolic.diffusion_matrix import MAX_WORD, kind_recipes
from ..symbolic.diffusion_tensor import kind_plans
from ..symbolic.jacobian import jacobian_polynomials
from ..symbolic.matrix_form import ACT_SYMBOLS, KAPPA
from ..symbolic.second_order import second_order_polynomials
from ..symbolic.symbols import NOISE, PARAMS
from ..symbolic.tensor import derive_tensor_form
from .printer import ScalarPrinter
from .render import _emit_assignments
from .tensor_render import _phi_source

__all__ = ["render_diffusion_assembly", "render_diffusion_matrix_module",
           "render_diffusion_tensor_module", "render_diffusion_entries_module",
           "render_second_order_entries_module"]


def _atom_code(atom, units) -> str:
    """numpy code of one atom of a block expression, gathered at the unit index arrays."""
    def unit(u):
        return f"_u[{units[u]!r}]"
    f, args = atom.func, atom.args
    if f is Qf:
        return f"_g(Q, {unit(args[0])}, {unit(args[1])})"
    if f is RHOf:
        return f"_g(rho, {unit(args[0])}, {unit(args[1])})"
    if f is Af:
        return f"_g(a, {unit(args[0])})"
    name, codes = _kind_read(atom, units)
    return f"kinds({name!r}, {', '.join(codes)})"


def _kind_read(atom, units) -> tuple:
    """``(name, index codes)`` of a moment-kind atom read at the unit index arrays."""
    name = atom.func.__name__
    nd, nx, ns = parse_kind(name)
    codes = []
    for pos, arg in enumerate(atom.args):
        if nd <= pos < nd + nx and arg.func is TEACHER_FIELD:     # a teacher field ν_m
            codes.append(f"_u[{'t' + units[arg.args[0]]!r}]")
        else:
            codes.append(f"_u[{units[arg]!r}]")
    return name, codes


def _split_term(term, atoms, rows, cols):
    """``(scalar, row part, column part, mixed part)`` of one product of a block's expression.

    An atom whose units are all row units (``k, l, m``) is a column vector of the
    block, all column units (``K, L, M``) a row vector; an atom holding both is a
    full ``rows × columns`` array; parameters and numbers are scalars.
    """
    scalar, row, col, mixed = [], [], [], []
    for factor in sp.Mul.make_args(term):
        base = factor.base if factor.is_Pow else factor
        if base not in atoms:
            scalar.append(factor)
            continue
        units = base.free_symbols & (rows | cols)
        (mixed if units & rows and units & cols else row if units <= rows else col).append(factor)
    return sp.Mul(*scalar), sp.Mul(*row), sp.Mul(*col), sp.Mul(*mixed)


def _block_lines(x, y, expr, printer) -> list:
    """Lines computing block ``(x, y)`` of ``D`` as a sum of outer products.

    Every term of the expanded expression is ``scalar · r · c · X``: ``r`` a product
    of atoms read at the row units (a column ``(…, R, 1)``), ``c`` at the column
    units (a row ``(…, 1, C)``), ``X`` the atoms holding both (a kind read at mixed
    units, ``(…, R, C)``; at most one per term here).  The terms without ``X`` are
    one matrix product ``(…, R, m) @ (…, m, C)`` (:func:`~symquad.runtime.
    diffusion_engine.outer_sum`), each other term ``X · (r c)`` with ``r c`` an outer
    product — instead of broadcasting multiplies on ``R × C`` arrays for every factor.
    When every ``X`` is a kind read (so far every block), the mixed terms are one
    :func:`~symquad.runtime.diffusion_engine.kind_sum` call: the reads listed in the atoms'
    order, not gathered here (a whole-array kind source is read in place), the terms by
    position; otherwise the gathered ``X`` go to
    :func:`~symquad.runtime.diffusion_engine.mixed_sum` (terms whose ``X`` is one array at
    run time share one product).  Both add the same sums in the same order.
    """
    rows, cols = {K, L, M}, {KY, LY, MY}
    units = {K: "k", L: "l", M: "m", KY: "K", LY: "L", MY: "M"}
    tag = f"{x}_{y}"
    lines = [f"    # block ({x}, {y})",
             f"    _u = _engine.block_units({x!r}, {y!r}, p, ps)",
             "    _shape = batch + _u['shape']"]
    atoms = sorted((a for a in expr.atoms(sp.Function) if a.func is not TEACHER_FIELD),
                   key=sp.default_sort_key)
    symbols = {a: sp.Symbol(f"_{tag}_{i}") for i, a in enumerate(atoms)}
    rank, mixed = [], []
    for term in sp.Add.make_args(sp.expand(expr.xreplace(symbols))):
        scalar, r, c, X = _split_term(term, set(symbols.values()), *(
            {sym for a, sym in symbols.items() if a.free_symbols & side} for side in (rows, cols)))
        (rank if X == 1 else mixed).append((scalar * r, c, X))
    # kinds read at row and column units, each term's X one of them: read where they lie
    # (kind_sum), not gathered into block-size arrays here
    kind_x = {sym: a for a, sym in symbols.items() if a.func not in (Qf, RHOf, Af)
              and a.free_symbols & rows and a.free_symbols & cols}
    in_place = bool(mixed) and all(X in kind_x for _, _, X in mixed)
    lines += [f"    {symbols[a]} = {_atom_code(a, units)}" for a in atoms
              if not (in_place and symbols[a] in kind_x)]
    # an atom is a row (column) vector when its units are row (column) units only
    exprs = [e for r, c, _ in rank + mixed for e in (r, c)]
    reps, reduced = sp.cse(exprs, symbols=sp.numbered_symbols(f"_{tag}x"), order="canonical")
    lines += _emit_assignments(reps, printer)
    vectors = [printer.doprint(e) for e in reduced]
    nr = len(rank)
    if not rank:                                  # pragma: no cover - every block has some
        raise AssertionError(f"block ({x}, {y}) has no rank-one term")
    # the matrix product's result is a fresh (…, R, C) array: the mixed terms add in place
    lines.append("    _acc = _engine.outer_sum(("
                 + ", ".join(vectors[2 * i] for i in range(nr)) + ",), ("
                 + ", ".join(vectors[2 * i + 1] for i in range(nr)) + ",), _shape)")
    if in_place:
        # the reads in the atoms' order (the order a kind source sees them: the matrix
        # route keeps the first of a symmetric kind's permuted reads), the terms by position
        order = [symbols[a] for a in atoms if symbols[a] in kind_x]
        reads = [_kind_read(kind_x[X], units) for X in order]
        lines.append("    _engine.kind_sum(_acc, kinds, (" + ", ".join(
            f"({name!r}, {', '.join(codes)})" for name, codes in reads) + ",), (" + ", ".join(
            f"({order.index(X)}, {vectors[2 * (nr + i)]}, {vectors[2 * (nr + i) + 1]})"
            for i, (_, _, X) in enumerate(mixed)) + ",))")
    elif mixed:                                   # pragma: no cover - no such block today
        lines.append("    _acc += _engine.mixed_sum((" + ", ".join(
            f"({printer.doprint(X)}, {vectors[2 * (nr + i)]}, {vectors[2 * (nr + i) + 1]})"
            for i, (_, _, X) in enumerate(mixed)) + ",), _shape)")
    lines.append(f"    blocks[({x!r}, {y!r})] = _acc")
    return lines


def _diffusion_function(constraint: str, printer) -> tuple:
    md = moment_diffusion(Model(2, 1, 1.0, constraint=constraint, lr_readout=1.0))
    fixed = moment_diffusion(Model(2, 1, 1.0, constraint=constraint))
    args = ", ".join(s.name for s in PARAMS)
    out = [f"def diffusion_{constraint}(Q, rho, a, kinds, params, trained, batch):",
           f'    """D with constraint {constraint!r} in state order (batch + (dim, dim)).',
           "",
           "    ``kinds(name, *index_arrays)`` returns a moment kind read at index arrays;",
           "    the readout blocks are computed when `trained`.",
           '    """',
           f"    {args} = params",
           "    p, ps = rho.shape[-2:]",
           "    blocks = {}"]
    for (x, y), expr in md.blocks.items():
        if "a" in (x, y):
            continue
        out += _block_lines(x, y, expr, printer)
    out.append("    if trained:")
    for (x, y), expr in md.blocks.items():
        if "a" not in (x, y):
            continue
        out += ["    " + line for line in _block_lines(x, y, expr, printer)]
    out.append("    return _engine.assemble(blocks, p, ps, trained, batch)")
    return out, {True: md.kinds(), False: fixed.kinds()}


def render_diffusion_assembly() -> str:
    """The generated diffusion assembly (one ``diffusion_<constraint>`` per constraint)."""
    printer = ScalarPrinter()
    doc = textwrap.dedent('''\
        """The diffusion matrix D assembled from its moment kinds: one function per constraint.

        Derived by symquad.symbolic.diffusion (the covariance of the per-sample
        increments of symquad.symbolic.update, divided by the batch size) and
        rendered by symquad.codegen.diffusion_render; every block is evaluated on
        the state entries through index arrays (symquad.runtime.diffusion_engine).

        Arguments (leading batch dimensions allowed):
            Q      (..., p, p)    student-student overlaps
            rho    (..., p, p*)   student-teacher overlaps
            a      (..., p)       student readout
            kinds  callable       kinds(name, *index_arrays): moment kind M<d><x><s>
                                  E[prod sigma'(lam_i) prod u_j prod sigma(lam_k) delta^(d+s)]
                                  read at index arrays (fields: students 0..p-1,
                                  teachers p..p+p*-1)
            params tuple          PARAMS, in this order (symquad.Model.kernel_params)
            trained bool          whether the readout is part of the state
            batch  tuple          the leading batch shape
        State order: symquad.numeric.layout.StateLayout (upper triangle of Q row by
        row, rho row-major, a).  Time is t = steps/N; the noise of one unit of
        time is D/N.
        """
        ''')
    out = [BANNER, doc, "from symquad.runtime import diffusion_engine as _engine\n", "",
           "PARAMS = " + repr(tuple(s.name for s in PARAMS)), "_g = _engine.gather", ""]
    kinds = {}
    for constraint in CONSTRAINTS:
        lines, used = _diffusion_function(constraint, printer)
        out += [""] + lines + [""]
        for trained, names in used.items():
            kinds[(constraint, trained)] = names
    out += ["", "#: (constraint, trained readout) -> the moment kinds the assembly reads",
            "KINDS = " + pprint.pformat(kinds, width=96, compact=True),
            "DIFFUSION = {" + ", ".join(f"{c!r}: diffusion_{c}" for c in CONSTRAINTS) + "}"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)


# ---- matrix route --------------------------------------------------------------------

def _recipe_canonical(terms, perm=None):
    """A matrix-route kind's recipe as ``{pairing: coefficient}``, vertices relabelled by `perm`.

    A pairing is the sorted tuple of its ``(u, v, J)`` with ``u <= v`` (the words
    ``W_J = (CA)^J C`` are symmetric, so ``W_J[u, v] = W_J[v, u]``).
    """
    out: dict = {}
    for coeff, pairing in terms:
        key = tuple(sorted((min(perm[u], perm[v]), max(perm[u], perm[v]), J) if perm else
                           (min(u, v), max(u, v), J) for u, v, J in pairing))
        out[key] = out.get(key, 0) + coeff
    return out


def symmetric_kinds(recipes) -> tuple:
    """The matrix-route kinds whose value is symmetric under every permutation of their vertices.

    Checked on the recipes themselves: the kind ``Σ c_P Π_{(u,v,J)∈P} W_J[x_u, x_v]``
    is unchanged by every transposition of neighbouring vertices (they generate all
    permutations) when the relabelled pairings carry the same coefficients (compared
    by ``sympy.expand`` of the difference).  With ``σ' = 2c z`` linear, the kinds
    without a ``σ`` vertex (all legs ``z_x``) are; the generated source reads each of
    those once per set of index arrays.
    """
    out = []
    for name, terms in sorted(recipes.items()):
        size = sum(parse_kind(name))
        base = _recipe_canonical(terms)
        ok = True
        for k in range(size - 1):
            perm = list(range(size))
            perm[k], perm[k + 1] = k + 1, k
            moved = _recipe_canonical(terms, perm)
            if set(moved) != set(base) or any(sp.expand(moved[key] - base[key]) != 0
                                              for key in base):
                ok = False
                break
        if ok:
            out.append(name)
    return tuple(out)


def render_diffusion_matrix_module() -> str:
    """Moment kinds of the diffusion for ``σ = c z² + c0``, ``σ* = c* z² + c0*`` (any width)."""
    printer = ScalarPrinter()
    recipes = kind_recipes()
    doc = textwrap.dedent(f'''\
        """Matrix-form moment kinds of the diffusion for σ = c z² + c0, σ* = c* z² + c0*, any width.

        Derived by symquad.symbolic.diffusion_matrix: with σ'(x) = 2c x and
        σ(x) = c x² + c0 every kind is a sum of Gaussian moments with open legs,
        E[z_x1 … z_xL δ^r], δ = zᵀAz + κ − √Δ ξ, which Gaussian integration by parts
        reduces to products of the words W_J = (CA)^J C (J <= {MAX_WORD}) read at the
        legs' indices and traces tr((AC)^j) (symquad.symbolic.quadforms.expect_legs).
        A = diag(c a, −c* b), κ = c0 Σa − c0* Σb.  Cost O((p + p*)^3) for the words,
        then O(1) per entry of D.

        Arguments (leading batch dimensions allowed): Q (..., p, p), rho (..., p, p*),
        T (..., p*, p*), a (..., p), b (..., p*), Delta, c, c_star, c0, c0_star.
        """
        ''')
    c, c_star, c0, c0_star = ACT_SYMBOLS
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import tensor_engine as _engine",
           "from symquad.runtime.diffusion_engine import WordGather as _WordGather",
           "from symquad.runtime.diffusion_engine import gather as _g", "", "",
           "def _m(x):",
           '    """A scalar per batch element as shape (..., 1, 1) (against the words)."""',
           "    return numpy.asarray(x, dtype=float)[..., None, None]", "", "",
           "def _mat(rows):",
           '    """A matrix of scalars (each per batch element) as shape (..., rows, columns)."""',
           "    try:",
           "        out = numpy.array(rows, dtype=float)",
           "        if out.ndim == 2:                   # unbatched: every entry one number",
           "            return out",
           "    except ValueError:                      # (entries of different shapes)",
           "        pass",
           "    flat = numpy.broadcast_arrays(*[numpy.asarray(e, dtype=float) for r in rows for e in r])",
           "    return numpy.stack(flat, -1).reshape(flat[0].shape + (len(rows), len(rows[0])))",
           "", "",
           "def _add(total, term):",
           '    """total + term; in place when both are arrays of one shape (total: a fresh sum)."""',
           "    if type(total) is numpy.ndarray and type(term) is numpy.ndarray and total.shape == term.shape:",
           "        total += term",
           "        return total",
           "    return total + term",
           "", "",
           "def _s(x, idx):",
           '    """A scalar per batch element broadcast against arrays gathered at `idx`."""',
           "    x = numpy.asarray(x, dtype=float)",
           "    return x.reshape(x.shape + (1,) * len(numpy.broadcast_shapes(*[i.shape for i in idx])))",
           "", "",
           "def kinds(Q, rho, T, a, b, Delta, c, c_star, c0, c0_star):",
           '    """A kind source: kinds(name, *index_arrays) (see symquad.runtime.diffusion_engine)."""',
           "    C, p = _engine.combine(Q, rho, T)",
           "    a = numpy.asarray(a, dtype=float)",
           "    b = numpy.asarray(b, dtype=float)",
           "    wA = _engine.weights(c * a, c_star * b)",
           "    kappa = c0 * a.sum(-1) - c0_star * b.sum(-1)",
           "    batch = numpy.broadcast_shapes(C.shape[:-2], wA.shape[:-1])",
           "    C = numpy.broadcast_to(C, batch + C.shape[-2:])",
           "    CA = C * wA[..., None, :]",
           "    W = [C]"]
    out += [f"    for _ in range({MAX_WORD}):",
            "        W.append(CA @ W[-1])",
            "    AC = numpy.swapaxes(CA, -1, -2)",
            "    P = AC"]
    traces = sorted({s for r in recipes.values() for coeff, _ in r for s in coeff.free_symbols
                     if s.name.startswith("tr(")}, key=lambda s: len(s.name))
    names = {}
    for t in traces:
        j = t.name.count("A")
        names[t] = sp.Symbol(f"tr_{j}")
    out.append("    tr = {}")
    out += [f"    for j in range(1, {max([t.name.count('A') for t in traces], default=1) + 1}):",
            "        tr[j] = numpy.trace(P, axis1=-2, axis2=-1)",
            "        P = P @ AC"]
    out += [f"    tr_{j} = tr[{j}]" for j in sorted({t.name.count("A") for t in traces})]
    out += ["", "    words = _WordGather(W)",
            "    # a symmetric kind read at a permutation of the same index arrays: one value",
            "    seen = {}", "",
            "    def source(name, *idx):",
            "        if name not in _SYMMETRIC:",
            "            return _KINDS[name](words, idx, locals_)",
            "        key = (name,) + tuple(sorted(map(id, idx)))",
            "        hit = seen.get(key)",
            "        if hit is None:                   # (the arrays held: their ids stay unique)",
            "            hit = seen[key] = (_KINDS[name](words, idx, locals_), idx)",
            "        return hit[0]", "",
            "    locals_ = dict(Delta=Delta, c=c, c_star=c_star, c0=c0, c0_star=c0_star,",
            "                   kappa=kappa, " + ", ".join(f"tr_{j}=tr_{j}" for j in
                                                       sorted({t.name.count('A')
                                                               for t in traces})) + ")",
            "    return source", ""]
    scalars = (NOISE, c, c_star, c0, c0_star, KAPPA) + tuple(names.values())
    for kind, terms in sorted(recipes.items()):
        out += ["", f"def _{kind}(W, idx, s):",
                f'    """{kind}: gathered at idx (one index array per vertex)."""']
        out.append("    " + ", ".join(sym.name for sym in scalars) + ", = ("
                   + ", ".join(f"s[{sym.name!r}]" if sym.name != "Delta" else "s['Delta']"
                               for sym in scalars) + ",)")
        coeffs = [sp.expand(coeff.xreplace(names)) for coeff, _ in terms]
        reps, reduced = sp.cse(coeffs, symbols=sp.numbered_symbols("x"), order="canonical")
        out += [f"    {sym} = {printer.doprint(val)}" for sym, val in reps]
        # group by the vertex pattern of the pairs: Σ_{J1,J2} c W_J1[u,v] W_J2[w,x]
        # = Σ_J1 W_J1[u,v] · (Σ_J2 c W_J2)[w,x]: the inner sums are n×n matrices
        groups: dict = {}
        for value, (_, pairing) in zip(reduced, terms):
            pattern = tuple((u, v) for u, v, _ in pairing)
            Js = tuple(J for _, _, J in pairing)
            groups.setdefault(pattern, {}).setdefault(Js[:-1], []).append(
                (Js[-1] if Js else None, value))
        out.append("    total = 0.0")
        matrices: dict = {}
        for pattern, heads in groups.items():
            if not pattern:
                (_, value), = heads[()]
                out.append(f"    total = total + _s({printer.doprint(value)}, idx)")
                continue
            (ul, vl) = pattern[-1]
            if len(pattern) == 2 and len(set(pattern)) == 2:
                # Σ_{J,J'} H[J, J'] W_J[u, v] W_J'[w, x]: one call on the stacked words
                # (WordGather.pairs) instead of one gather and product per J
                nJ = 1 + max(head[0] for head in heads)
                nJ2 = 1 + max(J for tail in heads.values() for J, _ in tail)
                H = [["0"] * nJ2 for _ in range(nJ)]
                for head, tail in heads.items():
                    for J, value in tail:
                        H[head[0]][J] = printer.doprint(value)
                (u, v) = pattern[0]
                text = "_mat((" + ", ".join("(" + ", ".join(row) + ",)" for row in H) + ",))"
                if text not in matrices:            # (the pairings of one kind share it)
                    matrices[text] = f"H{len(matrices)}"
                    out.append(f"    {matrices[text]} = {text}")
                out.append(f"    term = W.pairs({matrices[text]}, "
                           f"idx[{u}], idx[{v}], idx[{ul}], idx[{vl}])")
                out.append("    total = _add(total, term)")
                continue
            for head, tail in heads.items():
                combo = " + ".join(f"_m({printer.doprint(value)}) * W.words[{J}]"
                                   for J, value in tail)
                factors = [f"W({J}, idx[{u}], idx[{v}])" for (u, v), J in zip(pattern, head)]
                factors.append(f"_g({combo}, idx[{ul}], idx[{vl}])")
                out.append("    term = " + " * ".join(factors))
                out.append("    total = _add(total, term)")
        out.append("    return total")
    out += ["", "", "_KINDS = {" + ", ".join(f"{k!r}: _{k}" for k in sorted(recipes)) + "}",
            "# symmetric under every permutation of their vertices (checked on the recipes)",
            f"_SYMMETRIC = frozenset({symmetric_kinds(recipes)!r})"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)


# ---- tensor route --------------------------------------------------------------------

_TENSOR_API = '''

PLAN = dict(KINDS)
PLAN["__phi__"] = phi
PLAN["__top__"] = TOP


def kinds(Q, rho, T, a, b, Delta, names):
    """A kind source with the kinds `names` (symquad.runtime.diffusion_engine.tensor_kinds)."""
    return _engine.tensor_kinds(PLAN, Q, rho, T, a, b, Delta, names)
'''


def _plan_json(plans) -> str:
    """The multigraph plan as JSON text, one term per line.

    A string literal: Python compiles the nested tuple literal of a large plan
    slowly (6.4 s for the 10k terms of ``z² + z³/3``, and ``pprint`` takes 10 s
    more), ``json`` reads it back in ~0.1 s
    (:func:`symquad.runtime.diffusion_engine.plan_from_json`).
    """
    def dump(x):
        return json.dumps(x, separators=(",", ":"))
    kinds = []
    for name, (roles, parts) in plans.items():
        blocks = []
        for noise, q, terms in parts:
            body = ",\n".join(dump(term) for term in terms)
            blocks.append(f"[{dump(noise)},{q},[\n{body}]]")
        kinds.append(f"{dump(name)}:[{dump(roles)},[\n" + ",\n".join(blocks) + "]]")
    return "{\n" + ",\n".join(kinds) + "}\n"


def render_diffusion_tensor_module(activation, teacher_activation=None,
                                   generator: str | None = None) -> str:
    """Tensor-route moment kinds of the diffusion for ``(σ, σ*)`` (a multigraph plan)."""
    activation = tuple(activation)
    teacher_activation = activation if teacher_activation is None else tuple(teacher_activation)
    tf = derive_tensor_form(activation, teacher_activation)
    probe = Model(1, 1, 1.0, activation=activation, teacher_activation=teacher_activation)
    plans, top = kind_plans(activation, teacher_activation)
    counts = {k: sum(len(t) for _, _, t in v[1]) for k, v in plans.items()}
    pair = f"σ(z) = {probe.activation_str}" + (
        "" if tf.same_activation else f", σ*(z) = {probe.teacher_activation_str}")
    doc = textwrap.dedent(f'''\
        """Tensor-form moment kinds of the diffusion for {pair}, any width.

        Derived by symquad.symbolic.diffusion_tensor (multigraph expansion of
        E[∏σ'(u_i) ∏u_j ∏σ(u_k) δ^r], δ = Σ_a w_a σ_a(u_a) − √Δ ξ, with the clean
        error's factors as summed vertices; terms per kind: {counts});
        evaluated by symquad.runtime.diffusion_engine.tensor_kinds.
        """
        ''')
    out = [BANNER, doc, "import numpy\n",
           "from symquad.runtime import diffusion_engine as _engine", "",
           f"ACTIVATION = {probe.activation_str!r}",
           f"TEACHER_ACTIVATION = {probe.teacher_activation_str!r}", f"TOP = {top}"]
    if not tf.same_activation:
        out.append("STUDENT, TEACHER = 0, 1")
    if generator is not None:
        out.append(f"GENERATOR = {generator!r}")
    out += ["", "# kind -> (roles, ((noise coefficient, power of Delta), q, "
                "((multiplicity, edges, orders), ...)), ...), as JSON (lists for tuples)",
            "KINDS = _engine.plan_from_json(r\'\'\'" + _plan_json(plans) + "\'\'\')", "", ""]
    out += _phi_source(tf)
    body = "\n".join(out) + "\n" + _TENSOR_API
    return body + checksum_line(body)


# ---- entry route ---------------------------------------------------------------------

#: Terms per line of a long sum (Python's compiler recurses once per binary operator).
_TERMS_PER_LINE = 40


def _assign(name: str, expr, printer) -> list:
    """``name = expr`` as lines; a long sum is accumulated a few terms per line."""
    terms = sp.Add.make_args(expr) if expr.is_Add else (expr,)
    if len(terms) <= _TERMS_PER_LINE:
        return [f"    {name} = {printer.doprint(expr)}"]
    lines = []
    for start in range(0, len(terms), _TERMS_PER_LINE):
        chunk = printer.doprint(sp.Add(*terms[start:start + _TERMS_PER_LINE]))
        lines.append(f"    {name} = {chunk}" if start == 0 else f"    {name} = {name} + ({chunk})")
    return lines


def _sparse_data(gens, polys, trained):
    """Module lines holding polynomials ``[[(num, den, exponents), ...], ...]`` as compressed arrays.

    The monomials are shared by all polynomials (``EXPONENTS``, one row per
    monomial over ``GENERATORS``); term ``t`` adds ``NUMERATORS[t]/DENOMINATORS[t]``
    times monomial ``COLUMNS[t]`` to polynomial ``ROWS[t]``.  Returns the lines
    and a short description.
    """
    import base64
    import zlib

    import numpy as np
    monomials: dict = {}
    rows, cols, nums, dens = [], [], [], []
    for n, terms in enumerate(polys):
        for num, den, expo in terms:
            rows.append(n)
            cols.append(monomials.setdefault(tuple(expo), len(monomials)))
            nums.append(num)
            dens.append(den)
    exps = np.zeros((len(monomials), len(gens)), dtype=np.uint8)
    for expo, i in monomials.items():
        if expo and max(expo) > 255:  # pragma: no cover - degrees are far below
            raise ValueError("exponent beyond 255")
        exps[i] = expo
    big = max(max(map(abs, nums), default=0), max(dens, default=1))
    if big >= 2**53:  # pragma: no cover - exact as float64 up to 2**53
        raise ValueError("a coefficient is not exact in float64")

    def blob(array):
        return base64.b64encode(zlib.compress(np.ascontiguousarray(array).tobytes(), 9)) \
            .decode("ascii")
    lines = [f"GENERATORS = {tuple(gens)!r}",
             f"N_MONOMIALS = {len(monomials)}",
             f"N_POLYNOMIALS = {len(polys)}",
             f"EXPONENTS = {blob(exps)!r}",
             f"ROWS = {blob(np.array(rows, dtype=np.int32))!r}",
             f"COLUMNS = {blob(np.array(cols, dtype=np.int32))!r}",
             f"NUMERATORS = {blob(np.array(nums, dtype=np.float64))!r}",
             f"DENOMINATORS = {blob(np.array(dens, dtype=np.float64))!r}",
             "", "_POLY = _engine.SparsePolynomials(GENERATORS, N_MONOMIALS, EXPONENTS, ROWS, "
             f"COLUMNS, NUMERATORS, DENOMINATORS, N_POLYNOMIALS, trained={bool(trained)!r})"]
    return lines, f"{len(monomials)} monomials, {len(nums)} terms"


def _model_text(model: Model) -> str:
    act = f"activation={model.activation_str!r}"
    if not model.is_default("teacher_activation"):
        act += f", teacher_activation={model.teacher_activation_str!r}"
    if model.constraint != "none":
        act += f", constraint={model.constraint!r}"
    readout = "trained" if model.readout_trained else "fixed"
    return f"Model(p={model.p}, p_star={model.p_star}, {act}), {readout} readout"


def render_diffusion_entries_module(model: Model) -> str:
    """The entry route's ``D`` for ``model``'s structure (readouts and parameters are arguments).

    ``D``'s entries are sparse polynomials with exact rational coefficients
    (:func:`symquad.symbolic.diffusion.diffusion_polynomials`); the module holds
    their monomials and coefficients as compressed arrays (:func:`_sparse_data`),
    evaluated by :class:`symquad.runtime.diffusion_engine.SparsePolynomials`.
    (Printed as code, the same polynomials took minutes of common-subexpression
    elimination at ``p = 2``.)
    """
    gens, entries = diffusion_polynomials(model)
    layout = state_layout(model)
    pairs = sorted(entries)
    data, size = _sparse_data(gens, [entries[key] for key in pairs], model.readout_trained)
    doc = textwrap.dedent(f'''\
        """Entry-by-entry diffusion matrix of {_model_text(model)}.

        Derived by symquad.symbolic.diffusion (Wick/Isserlis covariances of the
        per-sample increments of symquad.symbolic.update, entry by entry, divided by
        the batch size): every entry of the upper triangle (PAIRS) is a sparse
        polynomial in GENERATORS with exact rational coefficients ({size}).
        State order: {', '.join(layout.names)}.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import diffusion_engine as _engine",
           "", f"DIM = {layout.dim}", f"NAMES = {layout.names!r}",
           "PARAMS = " + repr(tuple(x.name for x in PARAMS)), f"PAIRS = {tuple(pairs)!r}"]
    out += data
    out += ["", "",
            "def diffusion(Q, rho, T, a, b, params):",
            '    """D in state order, shape (..., DIM, DIM)."""',
            "    values = _engine.entry_generators(GENERATORS, Q, rho, T, a, b, "
            "dict(zip(PARAMS, params)))",
            "    return _engine.fill_symmetric(_POLY(values), PAIRS, DIM)"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)


def render_jacobian_entries_module(model: Model) -> str:
    """The exact Jacobian of the drift and the gradient of the risk, entry route (one structure)."""
    gens, jac, grad, hess = jacobian_polynomials(model)
    layout = state_layout(model)
    data, size = _sparse_data(gens, jac + grad + hess, model.readout_trained)
    doc = textwrap.dedent(f'''\
        """Jacobian of the drift and gradient of the risk of {_model_text(model)}.

        Derived by symquad.symbolic.jacobian: the entry route's drift and risk
        (symquad.symbolic.entries) differentiated exactly with respect to every state
        entry, as sparse polynomials in GENERATORS ({size}); the first DIM*DIM are
        J[I, J] = d f_I / d X_J row by row, the last DIM the risk's gradient.
        State order: {', '.join(layout.names)}.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import diffusion_engine as _engine",
           "", f"DIM = {layout.dim}", f"NAMES = {layout.names!r}",
           "PARAMS = " + repr(tuple(x.name for x in PARAMS))]
    out += data
    out += ["", "",
            "def jacobian(Q, rho, T, a, b, params):",
            '    """(J, grad risk, Hessian of the risk): (..., DIM, DIM), (..., DIM), (..., DIM, DIM)."""',
            "    values = _engine.entry_generators(GENERATORS, Q, rho, T, a, b, "
            "dict(zip(PARAMS, params)))",
            "    flat = _POLY(values)",
            "    n = DIM * DIM",
            "    J = flat[..., :n].reshape(flat.shape[:-1] + (DIM, DIM))",
            "    H = flat[..., n + DIM:].reshape(flat.shape[:-1] + (DIM, DIM))",
            "    return J, flat[..., n:n + DIM], H"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)


def render_second_order_entries_module(model: Model) -> str:
    """The O(1/N) mean source ``f_1`` and the drift's second derivatives, entry route (one structure).

    :func:`symquad.symbolic.second_order.second_order_polynomials`: ``f_1`` (the
    ``1/N`` term of one step's mean increment) and ``∂²f_I/∂X_J∂X_K`` as sparse
    polynomials, rendered like the Jacobian's module (kernel cache, never committed).
    """
    gens, f1, hess = second_order_polynomials(model)
    layout = state_layout(model)
    data, size = _sparse_data(gens, f1 + hess, model.readout_trained)
    doc = textwrap.dedent(f'''\
        """O(1/N) mean source and drift Hessian of {_model_text(model)}.

        Derived by symquad.symbolic.second_order (entry route, exact): sparse
        polynomials in GENERATORS ({size}); the first DIM are f1_I (E[N dX] = f +
        f1/N + O(1/N^2)), the next DIM**3 d2 f_I / dX_J dX_K at (I*DIM + J)*DIM + K.
        State order: {', '.join(layout.names)}.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import diffusion_engine as _engine",
           "", f"DIM = {layout.dim}", f"NAMES = {layout.names!r}",
           "PARAMS = " + repr(tuple(x.name for x in PARAMS))]
    out += data
    out += ["", "",
            "def second_order(Q, rho, T, a, b, params):",
            '    """(f1, drift Hessian): (..., DIM), (..., DIM, DIM, DIM)."""',
            "    values = _engine.entry_generators(GENERATORS, Q, rho, T, a, b, "
            "dict(zip(PARAMS, params)))",
            "    flat = _POLY(values)",
            "    H = flat[..., DIM:].reshape(flat.shape[:-1] + (DIM, DIM, DIM))",
            "    return flat[..., :DIM], H"]
    body = "\n".join(out) + "\n"
    return body + checksum_line(body)
