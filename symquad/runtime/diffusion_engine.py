r"""Evaluation of the diffusion matrix ``D`` from its moment kinds (imported by generated code).

The generated diffusion assembly (:mod:`symquad.codegen.diffusion_render`)
writes each block of ``D`` — ``(Q, Q)``, ``(Q, ρ)``, ``(Q, a)``, ``(ρ, ρ)``,
``(ρ, a)``, ``(a, a)`` — as one broadcasting expression in *gathered* arrays:
every unit of a block (``k, l, m`` of the row entry, ``K, L, M`` of the
column entry) is an integer index array over the block's rows or columns in
state order (:func:`block_indices`), and every atom (``Q_kL``, ``ρ_kM``,
``a_K``, a moment kind ``M_{dxs}(…)``) is read at those indices.  So the
expression is evaluated directly on the ``dim × dim`` entries of the state,
never on ``p⁴`` index grids, and repeated units (``Q_kk``) need no special
case.

The moment kinds come from a *kind source* (:class:`KindArrays` for the
tensor route: whole arrays over students ``p`` and fields ``n = p + p*``; the
generated matrix module for ``σ = c z²``: word matrices read at the indices).

Tensor route (:func:`tensor_kinds`): a kind
``E[∏_{d} σ'(u_i) ∏_{x} u_j ∏_{s} σ(u_k) δ^r]`` with
``δ = Σ_a w_a σ_a(u_a) − √Δ ξ`` is, after the label noise is integrated out
(``δ^r → Σ_{s even} binom(r,s)(s−1)!! Δ^{s/2} δ_c^{r−s}``), a sum over
multigraphs on the external vertices and ``q = r − s`` summed vertices
(:mod:`symquad.symbolic.diffusion_tensor`); each multigraph is a contraction of
Hadamard powers ``C^{∘m}/m!`` and vertex vectors ``φ_j(D) (w)``.  They are
evaluated as one straight-line program of pairwise contractions with CSE
(:class:`_Program`) run in a flat workspace by the compiled interpreter of
:mod:`symquad.runtime.contraction_vm` and a few matrix products
(:class:`_Executable`).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy

from . import tensor_engine as _tensor

try:        # einsum's C core: the program's small steps skip the Python wrapper (~3 µs a call)
    from numpy._core.multiarray import c_einsum as _c_einsum
except ImportError:                                      # pragma: no cover - numpy < 2
    try:
        from numpy.core.multiarray import c_einsum as _c_einsum
    except ImportError:
        _c_einsum = None

__all__ = ["block_indices", "block_units", "outer_sum", "mixed_sum", "kind_sum", "assemble",
           "gather", "KindArrays", "WordGather", "tensor_kinds", "tensor_kinds_reference",
           "plan_from_json", "BLOCK_PAIRS", "SparsePolynomials", "entry_generators",
           "fill_symmetric"]

#: Blocks of ``D`` in state order (the others are transposes).
BLOCK_PAIRS = (("Q", "Q"), ("Q", "rho"), ("Q", "a"), ("rho", "rho"), ("rho", "a"), ("a", "a"))


def _units(block, p, ps):
    """Index arrays of one block's units, in state order: ``Q -> (k, l)``, ``rho -> (k, m)``, ``a -> (k,)``."""
    if block == "Q":
        iu, ju = numpy.triu_indices(p)
        return iu, ju
    if block == "rho":
        return numpy.repeat(numpy.arange(p), ps), numpy.tile(numpy.arange(ps), p)
    return (numpy.arange(p),)


def block_indices(x, y, p, ps):
    """Unit index arrays of block ``(x, y)``: rows as ``(n, 1)`` columns, columns as ``(1, n)`` rows."""
    rows = tuple(u[:, None] for u in _units(x, p, ps))
    cols = tuple(u[None, :] for u in _units(y, p, ps))
    return rows, cols


def gather(array, *idx):
    """``array[..., idx_0, idx_1, …]`` over its last ``len(idx)`` axes (batch axes kept).

    With index arrays, a ``take`` at flat positions computed once per index arrays
    and axis sizes (:func:`_flat_positions`): numpy's indexing with several index
    arrays recomputes them at every call (at ``p = 16``, ``M400`` at the ``(Q, Q)``
    block's 136 × 136 entries: 15 µs against 78 µs).  The same entries.  The cache is
    looked up first (a hit holds these very objects), the arguments checked on a miss.
    """
    core = array.shape[array.ndim - len(idx):]
    hit = _FLAT.get((core,) + tuple(map(id, idx)))
    if hit is not None:
        flat = hit[0]
    elif all(type(i) is numpy.ndarray for i in idx):
        flat = _flat_positions(core, idx)
    else:
        return array[(Ellipsis,) + tuple(idx)]
    if array.ndim == len(idx):
        return array.reshape(-1).take(flat)
    return array.reshape(array.shape[:array.ndim - len(idx)] + (-1,)).take(flat, axis=-1)


#: Most flat gather positions kept by :func:`gather` (the assembly reads ~60 per
#: constraint and width, the matrix route's kinds ~20 more).
GATHER_CACHE = 1024
_FLAT: dict = {}


def _flat_positions(core, idx):
    """``ravel_multi_index`` of the broadcast index arrays `idx` in `core`, cached.

    Keyed by the index arrays' identities (and `core`); an entry holds the arrays
    themselves, so no identity is reused while it lives; at most :data:`GATHER_CACHE`
    entries (the oldest dropped).  The callers pass the same index objects at every
    call (:func:`block_units`).
    """
    key = (core,) + tuple(map(id, idx))
    hit = _FLAT.get(key)
    if hit is None:
        flat = numpy.ravel_multi_index(numpy.broadcast_arrays(*idx), core)
        hit = _FLAT[key] = (flat, idx)
        if len(_FLAT) > GATHER_CACHE:
            _FLAT.pop(next(iter(_FLAT)), None)
    return hit[0]


_UNITS: dict = {}


def block_units(x, y, p, ps):
    """The unit index arrays of block ``(x, y)`` by name, the same objects at every call.

    Rows (``(n, 1)`` columns) ``k, l`` (``Q``), ``k, m`` (``ρ``), ``k`` (``a``); columns
    (``(1, n)`` rows) ``K, L``, ``K, M``, ``K``; a teacher unit as a field, ``p + m``
    or ``p + M``, under ``tm`` / ``tM``; ``"shape"`` the block's ``(rows, columns)``.
    Cached per ``(x, y, p, ps)``: being the same objects, they key the flat gather
    positions of :func:`gather` (and the matrix route's reads of symmetric kinds).
    """
    key = (x, y, p, ps)
    hit = _UNITS.get(key)
    if hit is None:
        rows, cols = block_indices(x, y, p, ps)
        names = {"Q": ("k", "l"), "rho": ("k", "m"), "a": ("k",)}
        hit = dict(zip(names[x], rows))
        hit.update(zip((ch.upper() for ch in names[y]), cols))
        for unit in ("m", "M"):
            if unit in hit:
                hit["t" + unit] = p + hit[unit]
        hit["shape"] = (rows[0].shape[0], cols[0].shape[1])
        for value in hit.values():
            if isinstance(value, numpy.ndarray):
                value.flags.writeable = False
        _UNITS[key] = hit
    return hit


def outer_sum(rows, cols, shape):
    """``Σ_i r_i c_i`` of columns ``r_i (..., R, 1)`` and rows ``c_i (..., 1, C)`` (one product).

    The rank-one terms of a block of ``D`` stacked into ``(..., R, m) @ (..., m, C)``:
    the same sum, reassociated (the matrix product's order of additions).  Returns a
    fresh array of `shape` (``batch + (R, C)``).  The factors are written into the two
    operands by broadcasting assignment (the same values as concatenating broadcast
    views, at about half the Python cost: 21 → 13 µs for nine terms at ``R = C = 136``).
    """
    m = len(rows)
    left = numpy.empty(shape[:-1] + (m,))
    right = numpy.empty(shape[:-2] + (m, shape[-1]))
    for i, r in enumerate(rows):
        left[..., i:i + 1] = r
    for i, c in enumerate(cols):
        right[..., i:i + 1, :] = c
    return numpy.matmul(left, right)


def mixed_sum(terms, shape):
    """``Σ_i X_i ∘ (r_i c_i)`` of ``(X, column, row)`` terms, as ``Σ_X X ∘ (Σ_{X_i = X} r_i c_i)``.

    Terms whose ``X`` is the same array object (a kind source may return one array for
    reads that are equal, e.g. the matrix route's symmetric kinds read at permuted
    index arrays) share one elementwise product, their rank-one parts summed first
    in one matrix product (:func:`outer_sum`); otherwise each term is ``X · (r c)``.
    The same sum, reassociated.  ``shape`` is ``batch + (R, C)``.
    """
    groups: dict = {}
    for X, r, c in terms:
        groups.setdefault(id(X), (X, [], []))
        groups[id(X)][1].append(r)
        groups[id(X)][2].append(c)
    total = None
    for X, rows, cols in groups.values():
        # one rank-one term padded to inner dimension 2 with a zero column: numpy takes
        # inner dimension 1 past BLAS (measured at R = C = 136: 30 µs, 3.2 µs padded,
        # 12 µs for the broadcasting multiply).  The product is a fresh array of the
        # block's shape: multiplied and added in place
        part = outer_sum(rows + [0.0], cols + [0.0], shape) if len(rows) == 1 \
            else outer_sum(rows, cols, shape)
        part *= X
        if total is None:
            total = part
        else:
            total += part
    return total


def kind_sum(acc, kinds, reads, terms):
    """``acc += Σ_i X_i ∘ (r_i c_i)`` in place: ``X_i`` kinds read at a block's row and column units.

    `reads` are ``(name, *index_arrays)``, each ``kinds(name, *index_arrays)``, in the order a
    kind source is asked for them; `terms` are ``(read, r, c)`` with ``read`` a position in
    `reads`, ``r`` a column ``(…, R, 1)`` (or a scalar), ``c`` a row ``(…, 1, C)``.  The same
    bits as ``acc += mixed_sum(((X[read], r, c), …), acc.shape)`` after reading ``X`` in
    order: with a :class:`KindArrays` source and one state (no batch axes) each term is read
    from the kind's whole array at offsets ``ρ_i + γ_j`` (:func:`_kind_offsets`) by the
    compiled :func:`~symquad.runtime.assembly_vm.kind_term`, which multiplies and sums as
    :func:`mixed_sum` does, in its order — without its gathered copy, outer product and two
    elementwise passes per term, or their Python calls (at ``p = 16``, ``z³ − 3z``: the
    ``(Q, Q)`` block's 9 terms 0.43 → 0.15 ms, docs/benchmarks-finite-n.md).  Any other
    source (the matrix route's words, which return one array for a symmetric kind's
    permuted reads), a batch, a read shared by two terms (none in the generated
    assembly) or one whose index arrays do not broadcast to the block's ``(R, C)`` (the
    compiled loop does not check its offsets): the reads, then :func:`mixed_sum`.
    """
    work = _in_place_terms(acc, kinds, reads, terms)
    if work is None:
        X = [kinds(*read) for read in reads]
        acc += mixed_sum(tuple((X[t], r, c) for t, r, c in terms), acc.shape)
        return acc
    from . import assembly_vm as _vm      # lazy: numba
    tot = numpy.empty_like(acc) if len(work) > 1 else acc
    last = len(work) - 1
    for t, (X, ro, co, r, c) in enumerate(work):
        mode = _vm.ONLY if last == 0 else _vm.FIRST if t == 0 else _vm.LAST if t == last \
            else _vm.MIDDLE
        _vm.kind_term(acc, tot, X, ro, co, r, c, mode)
    return acc


def _in_place_terms(acc, kinds, reads, terms):
    """The operands of :func:`kind_sum`'s compiled loop per term, ``(X flat, ρ, γ, r, c)``;
    None where it does not apply (not a :class:`KindArrays` source, a batch, another shape,
    offsets of other lengths than the block's ``R`` and ``C``)."""
    if not (type(kinds) is KindArrays and acc.ndim == 2 and acc.flags.c_contiguous
            and acc.dtype == numpy.float64):
        return None
    if len({t for t, _, _ in terms}) < len(terms):
        return None          # a read shared by terms: mixed_sum sums their r c first
    R, C = acc.shape
    rshape, cshape = (R, 1), (1, C)
    arrays = kinds.arrays
    work = []
    for t, r, c in terms:
        read = reads[t]
        X = arrays[read[0]]
        if not (X.ndim == len(read) - 1 and X.flags.c_contiguous
                and X.dtype == numpy.float64):
            return None
        offsets = _kind_offsets(X.shape, read[1:])
        # the compiled loop reads ro[i], co[j] for every entry of the block, unchecked:
        # only index arrays that broadcast to the block's very shape (R, C) (a read at
        # row units only, or at another block's units, is left to mixed_sum, which
        # broadcasts it or refuses it)
        if offsets is None or offsets[0].shape != (R,) or offsets[1].shape != (C,):
            return None
        r, c = _along(r, R, rshape), _along(c, C, cshape)
        if r is None or c is None:
            return None
        work.append((X.reshape(-1), offsets[0], offsets[1], r, c))
    return work


def _along(v, n, shape):
    """`v` (a scalar or an array broadcasting to `shape`, ``(n, 1)`` or ``(1, n)``) as a
    contiguous ``float64`` vector of length `n`; None when it has more axes (a batch)."""
    if type(v) is not numpy.ndarray:
        return numpy.full(n, v, dtype=numpy.float64)
    if v.shape == shape and v.dtype == numpy.float64 and v.flags.c_contiguous:
        return v.reshape(n)
    if v.ndim > 2:
        return None
    return numpy.ascontiguousarray(numpy.broadcast_to(v, shape).reshape(n),
                                   dtype=numpy.float64)


def _kind_offsets(core, idx):
    """``(ρ, γ)``: the flat positions of a kind of shape `core` read at `idx` are ``ρ_i + γ_j``.

    From :func:`_flat_positions` (cached likewise, by the index arrays' identities): ``ρ``
    its first column less its corner, ``γ`` its first row.  A C-ordered position is linear
    in the indices, so the split holds whenever every index array is a column ``(R, 1)`` or
    a row ``(1, C)`` (:func:`block_units`); it is checked once, and None returned where it
    fails (another shape of index arrays), as for non-arrays.
    """
    key = ("offsets", core) + tuple(map(id, idx))
    hit = _FLAT.get(key)
    if hit is None:
        split = None
        if all(type(i) is numpy.ndarray and i.ndim == 2 for i in idx):
            flat = _flat_positions(core, idx)
            ro = numpy.ascontiguousarray(flat[:, 0] - flat[0, 0], dtype=numpy.intp)
            co = numpy.ascontiguousarray(flat[0, :], dtype=numpy.intp)
            if numpy.array_equal(flat, ro[:, None] + co[None, :]):
                split = (ro, co)
        hit = _FLAT[key] = (split, idx)
        if len(_FLAT) > GATHER_CACHE:
            _FLAT.pop(next(iter(_FLAT)), None)
    return hit[0]


def assemble(blocks, p, ps, trained, batch):
    """The symmetric ``D`` (batch + (dim, dim)) from its blocks in state order.

    A block ``(X, Y)``, ``X ≠ Y``, is written at ``(X, Y)`` and transposed at ``(Y, X)``;
    a diagonal block ``(X, X)``, symmetric in exact arithmetic, as ``½(V + Vᵀ)`` so that
    ``D`` is symmetric to the last bit.  The same entries as ``½(D + Dᵀ)`` over the whole
    matrix (off the diagonal blocks ``½(V + V) = V`` exactly, short of overflow), without
    its two passes and two ``dim × dim`` temporaries over the off-diagonal blocks.
    """
    n = {"Q": p * (p + 1) // 2, "rho": p * ps, "a": p if trained else 0}
    names = ("Q", "rho", "a") if trained else ("Q", "rho")
    start = dict(zip(names, itertools.accumulate([0] + [n[b] for b in names])))
    dim = sum(n[b] for b in names)
    D = numpy.empty(batch + (dim, dim))
    for (x, y), value in blocks.items():
        if x not in names or y not in names:
            continue
        sx = slice(start[x], start[x] + n[x])
        sy = slice(start[y], start[y] + n[y])
        if type(value) is not numpy.ndarray or value.shape != batch + (n[x], n[y]):
            value = numpy.broadcast_to(value, batch + (n[x], n[y]))    # (~3 µs a view)
        if x == y:
            out = D[..., sx, sy]
            numpy.add(value, numpy.swapaxes(value, -1, -2), out=out)
            out *= 0.5
        else:
            D[..., sx, sy] = value
            D[..., sy, sx] = numpy.swapaxes(value, -1, -2)
    return D


class WordGather:
    """``W_J[..., x, y]`` of the matrix route's words, each gathered once per pair of index arrays.

    The words are symmetric, so ``(x, y)`` and ``(y, x)`` share an entry; the
    index arrays are kept referenced so their ids stay unique while cached.
    """

    def __init__(self, words):
        self.words = words
        self.cache = {}
        self.stack = None
        try:                                    # the four-index buffer of a former call
            self.buffer = _PAIR_SPARE.pop()
        except IndexError:
            self.buffer = None

    def __del__(self):
        try:
            if self.buffer is not None and self.buffer.size <= MAX_PAIR_TENSOR \
                    and not _PAIR_SPARE:
                _PAIR_SPARE.append(self.buffer)
        except Exception:                       # pragma: no cover - interpreter shutdown
            pass

    def __call__(self, J, x, y):
        key = (J,) + tuple(sorted((id(x), id(y))))
        hit = self.cache.get(key)
        if hit is None:
            hit = (gather(self.words[J], x, y), x, y)
            self.cache[key] = hit
        return hit[0]

    def pairs(self, H, u, v, w, x):
        r"""``Σ_{J,J'} H[..., J, J'] W_J[u, v] W_{J'}[w, x]`` at index arrays ``u, v, w, x``.

        With ``G_J = Σ_J' H[J, J'] W_J'`` (one matrix product per ``H``; the pairings
        of one kind share it), the sum ``Σ_J W_J[u, v] G_J[w, x]`` is taken

        * when one pair depends on the rows only and the other on the columns only
          (e.g. ``(k, l)`` and ``(K, L)`` in the ``(Q, Q)`` block): as one rank-``J``
          matrix product of the gathered ``(R, J) @ (J, C)``;
        * when both pairs span the whole result (``(k, K)`` and ``(l, L)``): as the
          four-index array ``T[a, b, c, d] = Σ_J W_J[a, b] G_J[c, d]`` over
          ``[0, m)`` (``m`` = the largest index + 1), one matrix product
          ``(m², J) @ (J, m²)`` (``J m⁴`` multiply-adds) per ``H``, read by one ``take``
          — instead of a gather and two elementwise passes per ``J`` on every entry —
          where the batch's ``T`` holds at most :data:`MAX_PAIR_TENSOR` elements;
        * otherwise per ``J``.

        The same sum, reassociated.
        """
        nJ, nJ2 = H.shape[-2:]
        key = ("G", id(H))
        hit = self.cache.get(key)
        if hit is None:
            if self.stack is None:
                self.stack = numpy.stack(self.words, axis=-3)
            S = self.stack[..., :nJ2, :, :]
            G = numpy.matmul(H, S.reshape(S.shape[:-2] + (-1,)))
            hit = self.cache[key] = (G.reshape(G.shape[:-1] + S.shape[-2:]), H)
        G = hit[0]
        su, sw = _bshape(u.shape, v.shape), _bshape(w.shape, x.shape)
        X = self.stack[..., :nJ, :, :]
        if su[-1] == 1 and sw[-2] == 1 or su[-2] == 1 and sw[-1] == 1:
            A, B = gather(X, u, v), gather(G, w, x)
            if su[-2] == 1:
                A, B = B, A
            # A (..., J, R, 1), B (..., J, 1, C)
            return numpy.matmul(numpy.swapaxes(A[..., 0], -1, -2), B[..., 0, :])
        full = _bshape(su, sw)
        if su == full and sw == full:
            m = 1 + max(_largest(i) for i in (u, v, w, x))
            if 8 * math.prod(full) >= m ** 4 and \
                    math.prod(G.shape[:-3]) * m ** 4 <= MAX_PAIR_TENSOR:
                key = ("T", id(H), m)
                hit = self.cache.get(key)
                if hit is None:
                    lead = G.shape[:-3]
                    Xm = numpy.ascontiguousarray(X[..., :m, :m]).reshape(lead + (nJ, m * m))
                    Gm = numpy.ascontiguousarray(G[..., :m, :m]).reshape(lead + (nJ, m * m))
                    # one four-index array at a time (the pairings of one kind are read
                    # one after another), in a buffer kept between calls: a fresh one is
                    # page-faulted in at every call
                    for old in [k for k in self.cache if k[0] == "T"]:
                        del self.cache[old]
                    size = math.prod(lead) * m ** 4
                    if self.buffer is None or self.buffer.size < size:
                        self.buffer = numpy.empty(size)
                    T = self.buffer[:size].reshape(lead + (m * m, m * m))
                    numpy.matmul(numpy.swapaxes(Xm, -1, -2), Gm, out=T)
                    hit = self.cache[key] = (T.reshape(lead + (m, m, m, m)), H)
                return gather(hit[0], u, v, w, x)
        total = 0.0
        for J in range(nJ):
            total = total + self(J, u, v) * gather(G[..., J, :, :], w, x)
        return total


def _bshape(a, b):
    """``numpy.broadcast_shapes(a, b)`` (a fast path for shapes of one length)."""
    if len(a) == len(b):
        return tuple(x if y == 1 else y for x, y in zip(a, b))
    return numpy.broadcast_shapes(a, b)


_LARGEST: dict = {}


def _largest(idx):
    """``idx.max()`` of an index array, cached by identity (the array held with it)."""
    hit = _LARGEST.get(id(idx))
    if hit is None or hit[1] is not idx:
        hit = _LARGEST[id(idx)] = (int(idx.max()), idx)
        if len(_LARGEST) > GATHER_CACHE:
            _LARGEST.pop(next(iter(_LARGEST)), None)
    return hit[0]


#: The four-index buffer of :meth:`WordGather.pairs` kept between calls (one, at most
#: :data:`MAX_PAIR_TENSOR` elements; taken out while in use).
_PAIR_SPARE: list = []

#: Largest four-index array of :meth:`WordGather.pairs` (elements, the batch included;
#: 2**22 doubles are 32 MiB: ``m = 16`` for up to 64 states at once).
MAX_PAIR_TENSOR = 2 ** 22


class KindArrays:
    """A kind source holding each kind as a whole array (``(..., p|n, …)``).

    ``source(name, *idx)`` reads kind `name` at broadcasting index arrays, one per
    axis (:func:`gather`: a ``take`` at cached flat positions).
    """

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def __call__(self, name, *idx):
        return gather(self.arrays[name], *idx)


# ---- tensor route -----------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PATHS: dict = {}
_REF_PATHS: dict = {}


def plan_from_json(text):
    """The kinds of a generated tensor-diffusion plan from its JSON text (lists read as tuples)."""
    return {name: _tuples(value) for name, value in json.loads(text).items()}


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def _term_operands(term, roles, Cp, vstud, vsum, p):
    """Subscripts and operands of one multigraph term (see :func:`tensor_kinds`)."""
    edges, orders = term
    letters = _LETTERS[:len(roles)]
    subs, ops = [], []

    def span(v):
        return slice(0, p) if roles[v] in ("d", "s") else slice(None)
    for (u, v), m in edges:
        subs.append("..." + letters[u] + letters[v])
        ops.append(Cp[m][..., span(u), span(v)])
    for v, role in enumerate(roles):
        j = orders[v]
        if role in ("d", "s"):
            subs.append("..." + letters[v])
            ops.append(vstud[j])
        elif role == "q":
            subs.append("..." + letters[v])
            ops.append(vsum[j])
    out = "..." + "".join(letters[v] for v, r in enumerate(roles) if r != "q")
    return ",".join(subs) + "->" + out, ops


def _einsum(key, subscripts, ops):
    shapes = tuple(o.shape for o in ops)
    path = _REF_PATHS.get((subscripts, shapes))
    if path is None:
        path = numpy.einsum_path(subscripts, *ops, optimize="greedy")[0]
        _REF_PATHS[(subscripts, shapes)] = path
    return numpy.einsum(subscripts, *ops, optimize=path)


def _inputs(plan, Q, rho, T, a, b):
    """Batch shape, ``C``, ``w``, ``p`` and the vertex functions ``φ_j(D)`` over the fields."""
    C, p = _tensor.combine(Q, rho, T)
    w = _tensor.weights(a, b)
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    C = numpy.broadcast_to(C, batch + C.shape[-2:])
    w = numpy.broadcast_to(w, batch + w.shape[-1:])
    D = numpy.diagonal(C, axis1=-2, axis2=-1)
    phi = plan["__phi__"](D, p)
    zero = numpy.zeros(batch + (C.shape[-1],))
    phi = [zero if f is None else numpy.broadcast_to(f, zero.shape) for f in phi]
    phi += [zero] * (plan["__top__"] + 2 - len(phi))
    return batch, C, w, p, phi


#: Largest intermediate of one batched contraction, in array elements (chunks of terms
#: are sized to it: 2**24 doubles are 128 MiB).
MAX_INTERMEDIATE = 2 ** 24

_COMPILED: dict = {}
#: Evaluate through :class:`_Program` (False: the class route, kept for the benchmarks).
USE_PROGRAM = True


def _compile_kind(roles, parts):
    """The terms of one kind grouped into *classes* of equal contraction pattern.

    Two multigraphs of one kind and one power ``q`` with the same set of edges
    (only the multiplicities ``m_uv`` and the vertex orders ``j_v`` differ) are the
    same ``einsum`` over different operands; a class is evaluated as one
    contraction with an extra term axis ``t`` (operands gathered from the stacked
    Hadamard powers and vertex functions, the weights ``size/|G|`` an operand
    over ``t``).  Returns ``[(noise, q, [(subscripts, edges, vertices, M, J, weights)])]``
    with ``M`` (terms × edges) the multiplicities and ``J`` (terms × vertex operands) the
    orders.
    """
    out = []
    for noise, q, terms in parts:
        full = tuple(roles) + ("q",) * q
        letters = _LETTERS[:len(full)]
        classes: dict = {}
        for (size, group), edges, orders in terms:
            key = tuple(uv for uv, _ in edges)
            classes.setdefault(key, []).append((size / group, [m for _, m in edges],
                                                [orders[v] for v, r in enumerate(full)
                                                 if r != "x"]))
        compiled = []
        for key, members in classes.items():
            vertices = [(v, r) for v, r in enumerate(full) if r != "x"]
            subs = ["t"] + ["...t" + letters[u] + letters[v] for u, v in key]
            subs += ["...t" + letters[v] for v, _ in vertices]
            outs = "..." + "".join(letters[v] for v, r in enumerate(full) if r != "q")
            weights = numpy.array([wt for wt, _, _ in members])
            M = numpy.array([m for _, m, _ in members], dtype=numpy.intp).reshape(len(members),
                                                                                 len(key))
            J = numpy.array([j for _, _, j in members], dtype=numpy.intp).reshape(
                len(members), len(vertices))
            compiled.append((",".join(subs) + "->" + outs, key, vertices, M, J, weights))
        out.append((noise, q, full, compiled))
    return out


def _compiled(plan, name):
    key = (id(plan), name)
    hit = _COMPILED.get(key)
    if hit is None or hit[0] is not plan:
        roles, parts = plan[name]
        hit = (plan, _compile_kind(roles, parts))
        _COMPILED[key] = hit
    return hit[1]


def tensor_kinds(plan, Q, rho, T, a, b, Delta, names):
    """The kinds ``names`` of a tensor diffusion plan as whole arrays (a :class:`KindArrays`).

    ``plan[name]`` is ``(roles, ((noise, q, terms), …))``: ``roles`` the
    external vertices (``"d"`` for ``σ'``, ``"x"`` for a field, ``"s"`` for
    ``σ``), then per power ``q`` of the clean error the noise factor
    ``noise = (coefficient, power of Δ)`` and the multigraph terms
    ``((size, |G|), edges, orders)`` (weight ``size/|G|``; ``edges`` as ``((u, v), m)`` pairs,
    ``orders[v]`` the order of vertex ``v``'s vertex function; summed
    vertices come last; one term per orbit of the permutations of the summed
    vertices and of the external vertices of one role, so the weighted sum is
    symmetrised over the latter).  Output axes: students (``p``) for
    ``d``/``s`` vertices, fields (``n``) for ``x`` vertices.

    The terms with one edge set are evaluated together (:func:`_compile_kind`):
    one contraction per class instead of one per multigraph, the same sum
    reordered (equal to :func:`tensor_kinds_reference` to rounding).  The classes of
    all kinds run as one straight-line program (:class:`_Program`, built once per
    plan, kinds and ``(p, n)``) in which a sub-contraction shared by several
    multigraphs is computed once, laid out in one workspace per state and run by a
    compiled interpreter and a few matrix products (:class:`_Executable`); when one
    state's workspace exceeds :data:`MAX_WORKSPACE` the classes run one by one, in
    chunks of terms of at most :data:`MAX_INTERMEDIATE` elements.  Cost: the
    program's steps and finals (3453 and 1100 for ``σ = z³ − 3z``, against 13132
    pairwise steps of the classes), each of at most ``O(p^a n^b)`` multiply-adds with
    ``a + b ≤ 8`` (``p⁴ n`` in practice; measured in docs/benchmarks-finite-n.md).
    """
    batch, C, w, p, phi = _inputs(plan, Q, rho, T, a, b)
    top = plan["__top__"]
    n = C.shape[-1]
    # stacks over the multiplicity / order: axis -3 (C^∘m/m!) and -2 (φ_j)
    CP = numpy.stack(_tensor._hadamard_powers(C, top), axis=-3)
    PHI = numpy.stack(phi, axis=-2)
    stud = PHI[..., :p]
    summed = PHI * w[..., None, :]
    if USE_PROGRAM and _executable(plan, tuple(names), p, n, 1).size <= MAX_WORKSPACE:
        return KindArrays(_run_program(plan, tuple(names), p, n, CP, stud, summed, Delta,
                                       batch))
    # one state's workspace above MAX_WORKSPACE (p ≳ 16 at degree 3): the classes one by
    # one, their terms in chunks of bounded intermediates
    out = {}
    for name in names:
        roles, _ = plan[name]
        shape = batch + tuple(p if r in ("d", "s") else n for r in roles)
        total = numpy.zeros(shape)
        for (coeff, dpow), q, full, classes in _compiled(plan, name):
            acc = numpy.zeros(shape)
            for subs, edges, vertices, M, J, weights in classes:
                ops = [weights]
                for e, (u, v) in enumerate(edges):
                    su = slice(0, p) if full[u] in ("d", "s") else slice(None)
                    sv = slice(0, p) if full[v] in ("d", "s") else slice(None)
                    ops.append(CP[..., M[:, e], su, sv])
                for col, (v, role) in enumerate(vertices):
                    ops.append((summed if role == "q" else stud)[..., J[:, col], :])
                acc += _class_einsum(subs, ops, len(weights))
            total += (coeff * Delta ** dpow) * acc
        out[name] = _symmetrise(total, roles, len(batch))
    return KindArrays(out)


def _class_contraction(subs, edges, vertices, full, nt, p, n):
    """``(subscripts, shapes)``: one class's contraction without its weights, terms kept.

    ``subs`` is the class's einsum (the weights first, :func:`_compile_kind`); the
    result sums nothing over the term axis ``t`` (``...t`` in the output), and
    ``shapes`` are the operands' shapes without the batch: an edge ``(t, span_u,
    span_v)``, a vertex vector ``(t, span)``, a span being ``p`` for an external vertex
    (roles ``d``, ``s``) and ``n`` for the others.  What :func:`_pairwise_plan` plans
    (and ``bench_kernels.py --diffusion-floor`` bounds).
    """
    ins, outs = subs.split("->")
    span = {True: p, False: n}
    shapes = [(nt, span[full[u] in ("d", "s")], span[full[v] in ("d", "s")])
              for u, v in edges]
    shapes += [(nt, n if role == "q" else p) for _, role in vertices]
    return ",".join(ins.split(",")[1:]) + "->" + outs.replace("...", "...t"), shapes


class _Program:
    r"""The kinds of one plan as one straight-line program of pairwise contractions, with CSE.

    Built once per ``(plan, kinds, p, n)`` from the classes of :func:`_compile_kind`:
    every class's contraction (its weights left out) is planned pairwise
    (:func:`_pairwise_plan`) and each step is named by what it computes — its
    subscripts up to a renaming of letters (:func:`_step_name`) and the names of its
    two inputs, recursively down to the *leaves*
    (a Hadamard power ``C^{∘m}/m!`` at given multiplicities and spans, the vertex
    functions at given orders, student or summed).  Steps with one name are one
    step: the multigraphs of all kinds share their sub-contractions (a summed
    vertex joined to the same externals by the same multiplicities, …), which
    leaves ~1/9 of the classes' steps besides their finals for ``z³ − 3z`` (1230 of
    11613; 3444 when named by their spelling), ~1/7 for ``z² + z³/3`` (7174 of 51486;
    counted at ``p = 3``, ``p* = 2``, the nine kinds of a trained readout).  Each
    class's last step is a *final*: it is taken with the terms' weights
    ``coefficient · size/|G| · Δ^power``, summing over the terms into its kind.  The
    same sum as the class route, reassociated (the weights last): equal to rounding.
    :class:`_Executable` runs it.
    """

    def __init__(self, plan, names, p, n):
        index = {}
        #: ("leaf", spec) or ("step", subscripts, input, input, multiply-adds), in order
        self.ops = []
        #: per class: (kind, input node, input node, subscripts summing over the terms,
        #: the terms' weights times the noise coefficient, the power of Δ, multiply-adds)
        self.finals = []
        self.largest = 1
        self.p, self.n = p, n

        def node(key, make):
            hit = index.get(key)
            if hit is None:
                hit = index[key] = len(index)       # = its position in self.ops
                make(hit)
            return hit

        def leaf(spec):
            return node(spec, lambda i, s=spec: self.ops.append(("leaf", s)))

        def step(subs, i, j, flops):
            # named by what it computes: the letters renamed in order of appearance
            # (_step_name), so that classes naming the same contraction with other
            # letters share it; the first class's subscripts are kept (a reader names a
            # node's axes by position, under its own letters)
            return node((_step_name(subs), i, j),
                        lambda _, f=flops: self.ops.append(("step", subs, i, j, f)))
        for name in names:
            for (coeff, dpow), q, full, classes in _compiled(plan, name):
                for subs, edges, vertices, M, J, weights in classes:
                    outs = subs.split("->")[1]
                    terms, core = _class_contraction(subs, edges, vertices, full,
                                                    len(weights), p, n)
                    ins = terms.split("->")[0].split(",")
                    cur = []
                    for e, (_, su, sv) in enumerate(core[:len(edges)]):
                        spec = ("C", tuple(int(x) for x in M[:, e]), su, sv)
                        cur.append((ins[len(cur)], leaf(spec)))
                    for col, (v, role) in enumerate(vertices):
                        spec = ("q" if role == "q" else "s", tuple(int(x) for x in J[:, col]))
                        cur.append((ins[len(cur)], leaf(spec)))
                    plan_steps, largest = _pairwise_plan(terms, core)
                    self.largest = max(self.largest, largest)
                    if len(cur) == 1:
                        raise AssertionError("a multigraph term with one operand")
                    for positions, st, flops in plan_steps[:-1]:
                        x, y = [cur.pop(i)[1] for i in positions]
                        cur.append((st.split("->")[1], step(st, x, y, flops)))
                    # the class's last step sums over its terms t with their weights
                    positions, st, flops = plan_steps[-1]
                    x, y = [cur.pop(i)[1] for i in positions]
                    self.finals.append((name, x, y, st.split("->")[0] + "->" + outs,
                                        coeff * numpy.asarray(weights, float), dpow, flops))
        self.roles = {name: plan[name][0] for name in names}
        self.n_steps = sum(1 for o in self.ops if o[0] == "step")

    def cost(self):
        """``{"steps", "finals", "macs_steps", "macs_finals"}``: the program's size per state.

        ``steps`` pairwise contractions and ``finals`` weighted last steps, and their
        multiply-adds per state (the term axis included), as counted by the planner
        (:func:`_pairwise_plan`).
        """
        return {"steps": self.n_steps, "finals": len(self.finals),
                "macs_steps": sum(o[4] for o in self.ops if o[0] == "step"),
                "macs_finals": sum(f[6] for f in self.finals)}

    def shapes(self):
        """Per node (leaves and steps, in order): its letters and shape (term axis first)."""
        p, n = self.p, self.n
        out = []
        for op in self.ops:
            if op[0] == "leaf":
                spec = op[1]
                if spec[0] == "C":
                    out.append(("tuv", (len(spec[1]), spec[2], spec[3])))
                else:
                    out.append(("tu", (len(spec[1]), n if spec[0] == "q" else p)))
            else:
                _, subs, i, j, _ = op
                ins, res = subs.split("->")
                dims = {}
                for sub, k in zip(ins.split(","), (i, j)):
                    dims.update(zip(sub.replace("...", ""), out[k][1]))
                res = res.replace("...", "")
                out.append((res, tuple(dims[ch] for ch in res)))
        return out


def _step_name(subscripts):
    """A pairwise step's subscripts with its letters renamed in order of first appearance.

    ``"...tcb,...tb->...tc"`` and ``"...tae,...te->...ta"`` both become
    ``"...tab,...tb->...ta"``: with the same two input nodes they are the same
    contraction (each result axis is the same sum over the same input axes, in the
    same position), so :class:`_Program` makes them one node.  ``t`` (the term axis)
    and ``...`` (the batch) keep their names.  Each class names its vertices by its own
    letters (:func:`_compile_kind`: ``a, b, …`` in the order of the kind's roles, then
    the summed vertices), so one sub-contraction — a summed vertex joined to one
    external, say — was named differently by classes that join it to different
    externals, and counted as several steps: 16241 steps for ``z² + z³/3`` at
    ``p = 8``, 7174 by this name (measured, this pass).
    """
    names, out = {}, []
    for ch in subscripts:
        if ch.isalpha() and ch != "t":
            ch = names.setdefault(ch, _LETTERS[len(names)])
            if ch == "t":
                raise AssertionError("a step with 20 letters or more")
        out.append(ch)
    return "".join(out)


#: An interpreter step's result is copied in another axis order for a reader that does at
#: least this many times as many multiply-adds as the result has entries (and wants it so).
STEP_COPY = 8
#: Fewest entries (times the batch) of a step that sums nothing for it to be multiplied
#: into its final instead of written (:meth:`_Executable._fuse_into_finals`).
FUSE_MIN = 2 ** 12


#: Steps and finals of fewer multiply-adds than this (times the batch) run in the
#: compiled interpreter (:mod:`symquad.runtime.contraction_vm`); larger ones as numpy
#: matrix products (:func:`_dot`), the finals stacked by pattern (:class:`_Executable`).
VM_STEP = 2 ** 14

#: Largest workspace of one :class:`_Executable` call, in array elements (the batch is
#: split into chunks to stay below it; 2**25 doubles are 256 MiB).
MAX_WORKSPACE = 2 ** 25

#: Most (executable, batch size) pairs whose prebuilt views (:meth:`_Executable._step_views`,
#: :meth:`_Executable._group_views`) are kept with the workspace buffer: a chunked batch
#: needs two (the full chunks and the last), each kind set its own.
MAX_VIEWS = 8


def _letters(subscripts):
    """The letters of a pairwise step's two operands and result, without the ``...``."""
    ins, out = subscripts.replace("...", "").split("->")
    x, y = ins.split(",")
    return x, y, out


def _role_perms(roles):
    """Permutations ``σ`` (tuples, position → image) of the positions that keep every role."""
    groups = {}
    for v, role in enumerate(roles):
        groups.setdefault(role, []).append(v)
    out = []
    for choice in itertools.product(*[itertools.permutations(g) for g in groups.values()]):
        perm = list(range(len(roles)))
        for g, images in zip(groups.values(), choice):
            for v, u in zip(g, images):
                perm[v] = u
        out.append(tuple(perm))
    return out


def _reader_counts(program):
    """``{node: number of steps and finals of `program` that read it}`` (one per operand)."""
    readers = {}
    for op in program.ops:
        if op[0] == "step":
            for i in op[2:4]:
                readers[i] = readers.get(i, 0) + 1
    for fin in program.finals:
        for i in fin[1:3]:
            readers[i] = readers.get(i, 0) + 1
    return readers


def _axis_order(letters, order):
    """The positions in `letters` (a node's axes, as one reader names them) of `order`."""
    return tuple(letters.index(c) for c in order)


def _final_pattern(xs, ys, outs, perms):
    """Canonical pattern of a final ``Σ_t x_t y_t`` under the kind's role permutations.

    The kind is symmetrised over the permutations ``σ`` of its external axes that keep
    their roles (:func:`_symmetrise`), so a term may be replaced by its image
    ``σ(term)``: relabelled so that its operands' external axes are the smallest
    possible positions, finals of one *pattern* — the same output positions in each
    operand and the same numbers of summed letters (shared, or of one operand only) —
    are one contraction over their stacked terms.  Returns ``(pattern, σ, swapped)``.
    """
    best = None
    inner_x = [ch for ch in xs if ch != "t" and ch not in outs]
    inner_y = [ch for ch in ys if ch != "t" and ch not in outs]
    shared = sum(1 for ch in inner_x if ch in inner_y)
    nx, ny = len(inner_x) - shared, len(inner_y) - shared
    for perm in perms:
        ex = tuple(sorted(perm[outs.index(ch)] for ch in xs if ch in outs))
        ey = tuple(sorted(perm[outs.index(ch)] for ch in ys if ch in outs))
        for cand in (((ex, ey, shared, nx, ny), perm, False),
                     ((ey, ex, shared, ny, nx), perm, True)):
            if best is None or cand[0] < best[0]:
                best = cand
    return best


def _canonical_order(xs, ys, outs, perm):
    """The axes of `xs` and `ys` in the pattern's order: term, externals, shared, own letters."""
    def ext(letters):
        return sorted((ch for ch in letters if ch in outs), key=lambda c: perm[outs.index(c)])
    shared = [ch for ch in xs if ch != "t" and ch not in outs and ch in ys]
    own_x = [ch for ch in xs if ch != "t" and ch not in outs and ch not in ys]
    own_y = [ch for ch in ys if ch != "t" and ch not in outs and ch not in xs]
    return ["t"] + ext(xs) + shared + own_x, ["t"] + ext(ys) + shared + own_y


class _Executable:
    r"""A :class:`_Program` laid out in one flat workspace per state and run in few calls.

    Every node (leaf or step result) is a region of a ``float64`` row ``W[b]`` per
    state ``b``, allocated when it is computed and reused once its last reader has
    run.  At call time the inputs are copied in (the stacked ``C^{∘m}/m!``,
    ``φ_j``, ``w φ_j``), the leaves gathered from them in one compiled loop
    (:func:`contraction_vm.gather`), and:

    * every step below :data:`VM_STEP` multiply-adds runs in the compiled
      interpreter (:func:`symquad.runtime.contraction_vm.run`), a run of consecutive
      ones per call; a larger step is one numpy matrix product (:func:`_dot`);
    * the finals of one kind are grouped by pattern (:func:`_final_pattern`).  In a
      group, the finals that share an operand (the same node, read in the same
      order: CSE makes this common) are summed before the product,
      ``Σ_m Σ_t w_mt x_t y_m,t = Σ_t x_t (Σ_m w_mt y_m,t)``, on the side that saves the
      most multiply-adds; the interpreter writes each distinct shared operand once
      and accumulates the weighted partners into one stack per group, as soon as
      their inputs exist (an interpreter step writes a shared operand or a lone
      partner in place, :meth:`_place_in_stacks`, and adds a partner read by nothing
      else straight into its block, :meth:`_fuse_partners`), and the group is one
      matrix product over the stacked terms into its kind.  A step that sums nothing
      read by one interpreter final only is multiplied into that final instead of
      written (:meth:`_fuse_into_finals`).  A group below
      :data:`VM_STEP` multiply-adds (small widths), or one in which every external axis
      of one operand is also in the other (a batch of ``(1 × t)(t × J)`` products),
      runs as weighted interpreter steps into its kind instead.

    Every node is laid out for its main reader (:func:`_layouts`).  Memory: one
    workspace of :attr:`size` elements per state, at most :data:`MAX_WORKSPACE` per
    call (:func:`_run_program` chunks the batch; larger programs take the class route).

    The same sums as :class:`_Program` describes, reassociated: equal to rounding.
    """

    def __init__(self, program, top, nbatch):
        from . import contraction_vm as vm      # lazy: numba
        self.vm = vm
        p, n = program.p, program.n
        shapes = program.shapes()
        ops, finals = program.ops, program.finals
        self.roles = program.roles
        # fixed regions: the inputs, a constant 1, the kinds, the weights, the groups'
        # stacks (the accumulated side is zeroed by its first writer)
        layout = {"CP": (top + 1) * n * n, "stud": (top + 2) * p, "summed": (top + 2) * n,
                  "one": 1}
        self.regions, end = {}, 0
        for key, size in layout.items():
            self.regions[key] = (end, end + size)
            end += size
        one = (self.regions["one"][0], "", ())
        self.outputs = {}
        for name, roles in self.roles.items():
            shape = tuple(p if r in ("d", "s") else n for r in roles)
            self.outputs[name] = (end, shape)
            end += math.prod(shape)
        groups, member_of = self._plan_groups(program, shapes, nbatch)
        self.zero_span = (self.regions["one"][1], end)
        wsizes = [len(f[4]) for f in finals]
        self.weights = numpy.concatenate([f[4] for f in finals]) if finals else numpy.zeros(0)
        self.powers = numpy.concatenate([numpy.full(len(f[4]), f[5], float) for f in finals]) \
            if finals else numpy.zeros(0)
        self.w_span = (end, end + self.weights.size)
        self._weights_cache = None              # (Δ, weights · Δ^powers): _weights_at
        w_off = list(itertools.accumulate([end] + wsizes))
        end += self.weights.size
        for g in groups:
            g["copy_off"] = end
            g["acc_off"] = end + g["copy_size"]
            end += g["copy_size"] + g["acc_size"]
        placed = self._place_in_stacks(program, shapes, groups, member_of, nbatch)
        #: nodes written straight into a stack, by role (shared operand, lone partner)
        self.placed = {role: sum(1 for v in placed.values() if v[2] == role)
                       for role in ("shared", "partner")}
        # execution order: the leaves, then each step followed by the finals whose last
        # input it is (a final: a weighted interpreter step into its kind, or the
        # stacking of its operands into its group); the groups' products at the end
        # (the leaves are all gathered first: a final's last input is its last *step*
        # input, or none; a leaf can come after a step in the node order, made by a later
        # class that reuses the step)
        after = {}
        for f, fin in enumerate(finals):
            after.setdefault(max(k if ops[k][0] == "step" else -1 for k in fin[1:3]),
                             []).append(f)
        seq = [("final", f) for f in after.get(-1, ())]
        for k, op in enumerate(ops):
            if op[0] == "step":
                seq.append(("op", k))
                seq.extend(("final", f) for f in after.get(k, ()))
        # steps that sum nothing read by one final into its kind only: never written,
        # the final multiplies their two operands itself (a third factor); their
        # operands are read at the final's position
        fused3 = self._fuse_into_finals(program, shapes, member_of, placed, nbatch)
        where = {(kind, k): pos for pos, (kind, k) in enumerate(seq)}
        last = {}
        for pos, (kind, k) in enumerate(seq):
            if kind == "op" and k in fused3:
                continue
            for i in (ops[k][2:4] if kind == "op" else finals[k][1:3]):
                last[i] = pos
        for k, f in fused3.items():
            for i in ops[k][2:4]:
                last[i] = max(last.get(i, -1), where[("final", f)])
        #: steps that sum nothing multiplied into their final (:meth:`_fuse_into_finals`)
        self.fused_finals = len(fused3)
        fused, acc_first = self._fuse_partners(program, shapes, member_of, placed, seq, nbatch)
        self.placed["fused"] = len(fused)
        # allocation: exact-size free lists (shapes repeat), a region is reused after its
        # last reader; an output is allocated before its inputs are released
        free, offset = {}, [0] * len(ops)
        top_ = [end]

        def alloc(size):
            pool = free.get(size)
            if pool:
                return pool.pop()
            start = top_[0]
            top_[0] += size
            return start

        def release(node):
            # a stack block is never reused; a fused partner or a step multiplied into
            # its final has no region of its own
            if node not in placed and node not in fused and node not in fused3:
                free.setdefault(math.prod(shapes[node][1]), []).append(offset[node])
            for perm in set(copies.get(node, {}).values()) - {memory.get(node)}:
                if (node, perm) in copy_at and copy_at[(node, perm)] != offset[node]:
                    free.setdefault(math.prod(shapes[node][1]), []).append(
                        copy_at[(node, perm)])
        # the axis order of each node in memory, as positions of its logical axes (the
        # producing step's output letters): a numpy step writes its matrix product's
        # natural order (no transposed copy); a leaf or an interpreter step's result is
        # laid out for its largest reader (_layouts)
        memory, swapped, copies = _layouts(ops, finals, seq, shapes, self.outputs, groups,
                                           member_of,
                                   nbatch, {**{k: v[1] for k, v in placed.items()},
                                            **{k: v[1] for k, v in fused.items()}})
        leaves = [k for k, op in enumerate(ops) if op[0] == "leaf"]
        src, dst = [], []
        copy_at = {}                            # (node, permutation) -> offset
        extra = {k: sorted(set(v.values()) - {memory.get(k, tuple(range(len(shapes[k][1]))))})
                 for k, v in copies.items()}
        #: leaves gathered more than once (in the orders their readers want)
        self.leaf_copies = sum(len(v) for k, v in extra.items() if ops[k][0] == "leaf")
        #: interpreter results copied in another order for a reader
        self.step_copies = sum(len(v) for k, v in extra.items() if ops[k][0] == "step")
        for k in leaves:
            size = math.prod(shapes[k][1])
            spec = ops[k][1]
            region = {"C": "CP", "q": "summed", "s": "stud"}[spec[0]]
            flat = self._leaf_source(spec, p, n).reshape(shapes[k][1])
            # the gather checks no index (contraction_vm.gather): every source in the
            # leaf's own input, not merely before the leaves' span (an order past its
            # input would read the next input's entries)
            r_lo, r_hi = self.regions[region]
            if flat.min() < 0 or flat.max() >= r_hi - r_lo:
                raise AssertionError(f"leaf {spec} gathered from outside its input {region}")
            main = memory.get(k, tuple(range(flat.ndim)))
            for perm in [main] + sorted(set(copies.get(k, {}).values()) - {main}):
                at = alloc(size)
                if perm == main:
                    offset[k] = at
                copy_at[(k, perm)] = at
                dst.append(at + numpy.arange(size))
                src.append(self.regions[region][0] + flat.transpose(perm).ravel())
        leaf_dst = numpy.concatenate(dst)
        self.leaf_src = numpy.concatenate(src).astype(numpy.intp)
        # the leaves are allocated first (nothing released yet), one after another: one
        # span, filled by one gather (contraction_vm.gather) from the inputs before it
        lo = int(leaf_dst[0])
        self.leaf_span = (lo, lo + leaf_dst.size)
        if not numpy.array_equal(leaf_dst, numpy.arange(*self.leaf_span)):
            raise AssertionError("the leaves not allocated in one span")
        for k in leaves:
            if k not in last:
                release(k)
        rows, self.segments = [], []

        def emit(row):
            if self.segments and self.segments[-1][0] == "vm":
                self.segments[-1][2] += 1
            else:
                self.segments.append(["vm", len(rows), len(rows) + 1])
            rows.append(row)

        def operand(k, letters, reader=None):
            # a node's axes are named by the subscripts of the step reading it (a leaf
            # or a shared step is read under other letters by other classes); a leaf
            # or an interpreter step's result may have a copy in the order this reader
            # wants
            perm = copies.get(k, {}).get(reader)
            if perm is not None:
                return (copy_at[(k, perm)], "".join(letters[a] for a in perm),
                        tuple(shapes[k][1][a] for a in perm))
            order = memory.get(k)
            if order is None:
                return (offset[k], letters, shapes[k][1])
            return (offset[k], "".join(letters[a] for a in order),
                    tuple(shapes[k][1][a] for a in order))
        copied = set()
        for pos, (kind, k) in enumerate(seq):
            if kind == "op":
                _, subs, i, j, flops = ops[k]
                xl, yl, zl = _letters(subs)
                if k in fused3:
                    continue                    # its final multiplies x and y itself
                if k in fused:
                    # the only reader is a final whose group accumulates it, weighted:
                    # the step adds its weighted products straight into the block
                    f = fused[k][0]
                    g_idx, (_, _, _, _, ol, oo, block) = member_of[f]
                    a_off = groups[g_idx]["acc_off"] + block[1]
                    target = (a_off, "".join(zl[ol.index(c)] for c in oo),
                              tuple(shapes[k][1][ol.index(c)] for c in oo))
                    emit(vm.encode(operand(i, xl, ("op", k, 0)), operand(j, yl, ("op", k, 1)),
                                   target,
                                   w=(w_off[f], zl[ol.index("t")]),
                                   zero=acc_first[(g_idx, block[1])] == pos))
                    for i_ in {i, j}:
                        if last.get(i_) == pos:
                            release(i_)
                    continue
                offset[k] = placed[k][0] if k in placed else alloc(math.prod(shapes[k][1]))
                if _numpy_step(ops[k], shapes, nbatch):
                    x, y = operand(i, xl), operand(j, yl)
                    if k in swapped:
                        x, y = y, x
                    z = operand(k, zl)
                    if _natural_order(x[1], y[1], z[1]) != z[1]:
                        raise AssertionError("a numpy step's result not in its product's order")
                    self.segments.append(("step", f"...{x[1]},...{y[1]}->...{z[1]}", x, y, z))
                else:
                    emit(vm.encode(operand(i, xl, ("op", k, 0)), operand(j, yl, ("op", k, 1)),
                                   operand(k, zl)))
                    for perm in extra.get(k, ()):
                        copy_at[(k, perm)] = at = alloc(math.prod(shapes[k][1]))
                        emit(vm.encode(operand(k, zl), one,
                                       (at, "".join(zl[a] for a in perm),
                                        tuple(shapes[k][1][a] for a in perm))))
                ins = (i, j)
            else:
                name, i, j, subs, _, _, _ = finals[k]
                ins = (i, j)
                xl, yl, zl = _letters(subs)
                if k not in member_of and k in (fused3.get(i), fused3.get(j)):
                    # one operand a step that sums nothing, never written: its operands
                    # read here, z += ((x·y)·u)·w (contraction_vm._inner3), named by this
                    # final's letters
                    zo, zshape = self.outputs[name]
                    side = 0 if fused3.get(i) == k else 1
                    node, letters = (i, xl) if side == 0 else (j, yl)
                    other, o_letters = (j, yl) if side == 0 else (i, xl)
                    _, ssubs, si, sj, _ = ops[node]
                    sx, sy, sz = _letters(ssubs)
                    rename = dict(zip(sz, letters))
                    emit(vm.encode(operand(si, "".join(rename[c] for c in sx), ("op", node, 0)),
                                   operand(sj, "".join(rename[c] for c in sy), ("op", node, 1)),
                                   (zo, zl, zshape), w=(w_off[k], "t"), zero=False,
                                   u=operand(other, o_letters, ("final", k, 1 - side))))
                    ins = (i, j, si, sj)
                elif k not in member_of:
                    zo, zshape = self.outputs[name]
                    emit(vm.encode(operand(i, xl, ("final", k, 0)),
                                   operand(j, yl, ("final", k, 1)), (zo, zl, zshape),
                                   w=(w_off[k], "t"), zero=False))
                else:
                    g, (shared, s_letters, s_order, other, o_letters, o_order, block) = \
                        groups[member_of[k][0]], member_of[k][1]
                    c_off = g["copy_off"] + block[0]
                    a_off = g["acc_off"] + block[1]
                    # one copy per block (its offset names it)
                    key = (member_of[k][0], block[0])
                    first = key not in copied
                    s_target = (c_off, "".join(s_order),
                                tuple(shapes[shared][1][s_letters.index(c)] for c in s_order))
                    in_place = placed.get(other, (None,))[0] == a_off
                    if in_place:
                        # the partner was written in its block (the block's only one):
                        # the weights go on the shared operand's copy instead
                        copied.add(key)
                        emit(vm.encode(operand(shared, s_letters), one, s_target,
                                       w=(w_off[k], "t")))
                    else:
                        if first and placed.get(shared, (None,))[0] != c_off:
                            # the shared operand, once, in order (unless written there)
                            emit(vm.encode(operand(shared, s_letters), one, s_target))
                        copied.add(key)
                        # its partner, weighted, added into the shared operand's block
                        # (the first writer zeroes the block), unless its step did
                        if other not in fused:
                            emit(vm.encode(operand(other, o_letters), one,
                                           (a_off, "".join(o_order),
                                            tuple(shapes[other][1][o_letters.index(c)]
                                                  for c in o_order)),
                                           w=(w_off[k], "t"),
                                           zero=acc_first[(member_of[k][0], block[1])] == pos))
            for i in set(ins):
                if last.get(i) == pos:
                    release(i)
        self.code = numpy.array(rows, dtype=numpy.int64).reshape(-1, vm.ROW)
        self.groups = [(g["name"], g["subs"], g["copy_off"], g["copy_size"], g["acc_off"],
                        g["acc_size"], g["shape_copy"], g["shape_acc"], g["copy_is_x"])
                       for g in groups]
        #: per group: None, or the plan of its product over ordered pairs only
        #: (:func:`_pair_plan`)
        self.pair_plans = [_pair_plan(g[1], self.roles[g[0]],
                                      g[6] if g[8] else g[7], g[7] if g[8] else g[6])
                           if _group_macs(g) * nbatch >= PAIR_MIN else None
                           for g in self.groups]
        self.size = top_[0]

    def cost(self):
        """What one call does per state: Python-level calls and multiply-adds by where they run.

        ``calls``: interpreter runs, numpy steps and group products (each one Python
        call; about ten more set the workspace up and symmetrise); ``vm_rows``: the
        interpreter's steps; ``macs_vm`` their multiply-adds (the groups' stacking
        included, one per element), ``macs_numpy`` the numpy steps', ``macs_groups``
        the group products'.
        """
        vm, code = self.vm, self.code
        nl = code[:, vm._NL]
        macs_vm = int(sum(math.prod(code[r, vm._D:vm._D + nl[r]]) for r in range(len(code))))
        macs_numpy = 0
        for seg in self.segments:
            if seg[0] == "step":
                _, subs, x, y, _ = seg
                xl, yl, _ = _letters(subs)
                dims = dict(zip(xl, x[2]))
                dims.update(zip(yl, y[2]))
                macs_numpy += math.prod(dims.values())
        macs_groups = 0
        for (name, subs, co, cs, ao, as_, shc, sha, copy_is_x), plan in zip(self.groups,
                                                                            self.pair_plans):
            xl, yl, _ = _letters(subs)
            dims = dict(zip(xl, shc if copy_is_x else sha))
            dims.update(zip(yl, sha if copy_is_x else shc))
            if plan is not None:                # ordered pairs only: P·Q instead of p²·q²
                px, py = plan[1].size, plan[4].size
                dims = {c: d for c, d in dims.items() if c not in plan[0][:4]}
                dims.update(i=px, j=py)
            macs_groups += math.prod(dims.values())
        return {"calls": len(self.segments) + len(self.groups), "vm_rows": len(code),
                "macs_vm": macs_vm, "macs_numpy": macs_numpy, "macs_groups": macs_groups}

    @staticmethod
    def _leaf_source(spec, p, n):
        """Flat positions, in its input's region, of one leaf's entries (term axis first)."""
        if spec[0] == "C":
            m, su, sv = spec[1:]
            return (numpy.asarray(m)[:, None, None] * n * n
                    + numpy.arange(su)[None, :, None] * n + numpy.arange(sv)[None, None, :]).ravel()
        j = numpy.asarray(spec[1])
        return (j[:, None] * n + numpy.arange(n)[None, :]).ravel() if spec[0] == "q" else \
            (j[:, None] * p + numpy.arange(p)[None, :]).ravel()

    def _place_in_stacks(self, program, shapes, groups, member_of, nbatch):
        """Nodes written straight into a group's stack: ``{node: (offset, permutation)}``.

        The shared operand of a block is copied into the stack and each partner added
        there, weighted (:meth:`_plan_groups`); an interpreter step can write its result
        in place instead, in the block's order (its other readers read it there): the
        shared operand of a block, or — in a block with one partner only — the larger of
        the two, the smaller then copied with the weights.  Saves those copies (at
        ``p = 16``, ``z² + z³/3``: ~9·10⁶ of the 3.6·10⁷ element updates of the stacks).
        A node is written in one place; leaves and numpy results are not placed.
        Returns ``{node: (offset, permutation of its logical axes, "shared" | "partner")}``.
        """
        ops = program.ops
        movable = {k for k, op in enumerate(ops)
                   if op[0] == "step" and not _numpy_step(op, shapes, nbatch)}
        partners = {}
        for f, (g, (sh, sl, so, ot, ol, oo, block)) in member_of.items():
            partners.setdefault((g, block), []).append(f)
        placed = {}

        def place(node, offset, letters, order, role):
            if node in movable and node not in placed and \
                    offset not in {v[0] for v in placed.values()}:
                placed[node] = (offset, tuple(letters.index(c) for c in order), role)
                return True
            return False
        for (g, block), fs in sorted(partners.items(), key=lambda kv: min(kv[1])):
            sh, sl, so, ot, ol, oo, _ = member_of[fs[0]][1]
            c_off = groups[g]["copy_off"] + block[0]
            a_off = groups[g]["acc_off"] + block[1]
            if len(fs) == 1 and math.prod(shapes[ot][1]) >= math.prod(shapes[sh][1]) \
                    and place(ot, a_off, ol, oo, "partner"):
                continue
            place(sh, c_off, sl, so, "shared")
        return placed

    @staticmethod
    def _fuse_partners(program, shapes, member_of, placed, seq, nbatch):
        """Partners accumulated by their own step: ``({node: (final, permutation)}, first writers)``.

        A group's partner that an interpreter step computes and that nothing else reads
        (not written in place, :meth:`_place_in_stacks`) need not exist on its own: the
        step adds its products, weighted by the final's weights along the term axis,
        straight into the partner's block, ``A += Σ w_t x y`` (``Σ_m w_mt y_{m,t}`` summed
        as it is made) — one pass over the block instead of writing the partner and
        adding it.  The second value maps each accumulated block ``(group, offset)`` to
        the position in `seq` of its first writer (which zeroes it).
        """
        ops = program.ops
        readers = _reader_counts(program)
        fused = {}
        for f, (g, (sh, sl, so, ot, ol, oo, block)) in member_of.items():
            if readers.get(ot) == 1 and ot != sh and ot not in placed and \
                    ops[ot][0] == "step" and not _numpy_step(ops[ot], shapes, nbatch):
                fused[ot] = (f, tuple(ol.index(c) for c in oo))
        where = {(kind, k): pos for pos, (kind, k) in enumerate(seq)}
        acc_first = {}
        for f, (g, (sh, sl, so, ot, ol, oo, block)) in member_of.items():
            pos = where[("op", ot)] if ot in fused else where[("final", f)]
            key = (g, block[1])
            acc_first[key] = min(acc_first.get(key, pos), pos)
        return fused, acc_first

    @staticmethod
    def _fuse_into_finals(program, shapes, member_of, placed, nbatch):
        """Steps multiplied into their final: ``{step: final}``.

        An interpreter step that sums nothing, ``s = x·y`` (an outer or elementwise
        product), read by one final into its kind only (not a group's), need not be
        written: the final ``K += Σ_t w_t s u`` takes ``x`` and ``y`` as operands,
        ``K += Σ_t ((x·y)·u)·w_t`` — one pass instead of writing ``s`` and reading it
        back (at ``(z³ − 3z, 16)``: 24 such steps of 1.04·10⁶ entries, mostly ``p⁴``-sized
        ``M400`` and ``M201`` operands).  One such operand per final (the row has one
        third factor), of at least :data:`FUSE_MIN` entries times the batch (shorter ones,
        runs of 8 at ``p = 8``, made the interpreter 3 % slower: measured).  Same
        products in another order: equal to rounding.
        """
        ops, finals = program.ops, program.finals
        readers = _reader_counts(program)
        fused = {}
        for f, fin in enumerate(finals):
            if f in member_of:
                continue
            for k in fin[1:3]:
                op = ops[k]
                if op[0] != "step" or readers.get(k) != 1 or k in placed or \
                        _numpy_step(op, shapes, nbatch):
                    continue
                xl, yl, zl = _letters(op[1])
                if set(xl + yl) <= set(zl) and math.prod(shapes[k][1]) * nbatch >= FUSE_MIN:
                    fused[k] = f
                    break
        return fused

    def _plan_groups(self, program, shapes, nbatch):
        """The finals grouped by kind and pattern; the groups worth a matrix product.

        Returns the groups (dicts: subscripts, the shared and the accumulated side's
        stack sizes and term counts) and, per final in one, ``(group, (shared node,
        its letters, its order, partner node, its letters, its order, (block in the
        shared stack, block in the accumulated stack)))``.
        """
        perms = {name: _role_perms(roles) for name, roles in self.roles.items()}
        found = {}
        for f, (name, i, j, subs, weights, _, flops) in enumerate(program.finals):
            xs, ys, outs = _letters(subs)
            pattern, perm, swapped = _final_pattern(xs, ys, outs, perms[name])
            if swapped:
                i, j, xs, ys = j, i, ys, xs
            ox, oy = _canonical_order(xs, ys, outs, perm)
            found.setdefault((name, pattern), []).append((f, i, xs, ox, j, ys, oy, flops))
        letters = "abcdefgh"
        groups, member_of = [], {}
        for (name, pattern), members in found.items():
            # share the side whose distinct operands leave the fewest multiply-adds
            # (counting the stacking's elements too chose worse sides: measured)
            best = None
            for side in ("x", "y"):
                distinct = {}
                for f, i, xs, ox, j, ys, oy, flops in members:
                    node, lets, order = (i, xs, ox) if side == "x" else (j, ys, oy)
                    distinct.setdefault((node, _axis_order(lets, order)), flops)
                cost = sum(distinct.values())
                if best is None or cost < best[0]:
                    best = (cost, side, distinct)
            cost, side, distinct = best
            ext_x, ext_y, shared, own_x, own_y = pattern
            if cost * nbatch < VM_STEP or set(ext_x) <= set(ext_y) or set(ext_y) <= set(ext_x):
                # small, or a batch of products with one side a row: every external axis
                # of one operand is in the other, so the product is a (1 × t)(t × J)
                # matmul per entry of the smaller side's axes (a batch of dot products,
                # 0.3 GMAC/s measured at p = 16, when both hold the same axes; 1.2–2.7
                # GMAC/s for `tab, tabcd` and `tabc, tabcd` of z³ − 3z at p = 16, whose
                # accumulated stack of p⁴-sized blocks is written, then read once):
                # weighted interpreter steps into the kind, each partner read once and
                # no stack (the kinds 16.4 → 14.9 ms there, measured)
                continue
            sx = "".join(letters[k] for k in ext_x) + "pqrs"[:shared] + "uv"[:own_x]
            sy = "".join(letters[k] for k in ext_y) + "pqrs"[:shared] + "wx"[:own_y]
            g = {"name": name, "subs": f"...t{sx},...t{sy}->...{letters[:len(self.roles[name])]}",
                 "copy_is_x": side == "x"}
            blocks, copy_size, acc_size, terms = {}, 0, 0, 0
            for f, i, xs, ox, j, ys, oy, flops in members:
                if side == "x":
                    sh, sl, so, ot, ol, oo = i, xs, ox, j, ys, oy
                else:
                    sh, sl, so, ot, ol, oo = j, ys, oy, i, xs, ox
                # a block per node and axis order, by position: finals name a node's axes
                # by their own letters (one node is read under several names)
                key = (sh, _axis_order(sl, so))
                csize = math.prod(shapes[sh][1])
                asize = math.prod(shapes[ot][1])
                t = shapes[sh][1][0]
                if key not in blocks:
                    blocks[key] = (copy_size, acc_size)
                    copy_size += csize
                    acc_size += asize
                    terms += t
                    g["dims_copy"] = tuple(shapes[sh][1][sl.index(c)] for c in so[1:])
                    g["dims_acc"] = tuple(shapes[ot][1][ol.index(c)] for c in oo[1:])
                member_of[f] = (len(groups), (sh, sl, so, ot, ol, oo, blocks[key]))
            g.update(copy_size=copy_size, acc_size=acc_size, terms=terms,
                     shape_copy=(terms,) + g["dims_copy"], shape_acc=(terms,) + g["dims_acc"])
            groups.append(g)
        return groups, member_of

    def run(self, CP, stud, summed, Delta, B):
        """The kinds (a dict of arrays, batch axis first) at the stacked inputs of one chunk."""
        # one workspace buffer is kept for all programs between calls (a fresh one is
        # page-faulted in at every call: ~60 ms of 240 MiB); taken out while in use, so
        # concurrent calls get their own; at most MAX_WORKSPACE elements are kept.  The
        # buffer travels with the views built on it (_step_views, _group_views), so they
        # live exactly as long as it does; at most MAX_VIEWS (executable, batch size)
        # pairs are kept, the oldest dropped (each holds a scratch array of the batch's
        # size: a caller whose batch size changes from call to call would grow it)
        try:
            buf, views = _SPARE.pop()
        except IndexError:
            buf = None
        if buf is None or buf.size < B * self.size:
            buf, views = numpy.empty(B * self.size), {}
        try:
            W = buf[:B * self.size].reshape(B, self.size)
            key = (id(self), B)
            hit = views.get(key)
            if hit is None or hit[0] is not self:
                while len(views) >= MAX_VIEWS:
                    del views[next(iter(views))]
                hit = views[key] = (self, self._step_views(W, B), self._group_views(W, B))
            return self._run(W, CP, stud, summed, Delta, B, hit[1], hit[2])
        finally:
            if buf.size <= MAX_WORKSPACE and not _SPARE:
                _SPARE.append((buf, views))

    def _step_views(self, W, B):
        """Per segment: for a numpy step whose operands and result are views of `W` as
        ``matmul`` reads and writes them, ``(X, Y, Z)``; else None.

        Built once per workspace buffer and batch size (:meth:`run` keeps them with the
        buffer): the step is then one ``matmul(X, Y, out=Z)`` call, the same call
        :func:`_dot_into` makes, without re-deriving the views from the subscripts (a few
        µs of Python per step: ~2 ms of the 509 steps of ``z³ − 3z`` at ``p = 16``).  A
        step whose operand or result is not a view in that layout (laid out for another
        reader) is the same product batched over a letter, on the arrays as they lie
        (:func:`_batched_views`: at ``(z³ − 3z, 16)`` 28 of the 35 such steps, whose
        copies cost ~0.4 ms a call); one that needs a sum or a copy even so stays with
        :func:`_dot_into`.
        """
        out = []
        for seg in self.segments:
            if seg[0] != "step":
                out.append(None)
                continue
            _, subs, x, y, z = seg
            xv = W[:, x[0]:x[0] + math.prod(x[2])].reshape((B,) + x[2])
            yv = W[:, y[0]:y[0] + math.prod(y[2])].reshape((B,) + y[2])
            zv = W[:, z[0]:z[0] + math.prod(z[2])]
            X, Y, batch, (S, I, K, J), _, _ = _matmul_operands(subs, xv, yv)
            Z = zv.reshape(batch + (S, I, J))
            # a reshape that had to copy leaves an array outside the workspace
            views = K > 1 and all(numpy.may_share_memory(v, W) for v in (X, Y, Z))
            # else, where a letter of S, I or J is out of place in one of the three
            # arrays, the same product batched over that letter (_batched_views)
            out.append((X, Y, Z) if views else
                       _batched_views(subs, xv, yv, zv.reshape((B,) + z[2])))
        return out

    def _group_views(self, W, B):
        """Per group: for a whole product (no ordered-pair plan) whose stacks are views of
        `W` as ``matmul`` reads them, ``(X, Y, Z, R, O)``; else None.

        ``matmul(X, Y, out=Z)`` into one scratch array shared by the groups (the largest
        product's size), then ``O += R``: ``R`` the product as a view in the kind's axis
        order, ``O`` the kind's region — the same product and the same addition as
        ``out[name] += _dot(…)``, without deriving the views and allocating the result
        at every call (~0.5 ms of the 41 groups of ``z³ − 3z`` at ``p = 16`` went to that
        and the addition).
        """
        out, pending, largest = [], [], 0
        for (name, subs, co, cs, ao, as_, shc, sha, copy_is_x), plan in zip(self.groups,
                                                                            self.pair_plans):
            if plan is not None:
                out.append(None)
                continue
            S_ = W[:, co:co + cs].reshape((B,) + shc)
            A_ = W[:, ao:ao + as_].reshape((B,) + sha)
            x, y = (S_, A_) if copy_is_x else (A_, S_)
            X, Y, batch, (S, I, K, J), axes, zperm = _matmul_operands(subs, x, y)
            if K < 2 or not all(numpy.may_share_memory(v, W) for v in (X, Y)):
                out.append(None)                # _dot's own path (einsum, or copies)
                continue
            o, shape = self.outputs[name]
            O = W[:, o:o + math.prod(shape)].reshape((B,) + shape)
            largest = max(largest, math.prod(batch) * S * I * J)
            pending.append((len(out), X, Y, batch, (S, I, J), axes, zperm, O))
            out.append(None)
        scratch = numpy.empty(largest)
        for pos, X, Y, batch, (S, I, J), shapes, zperm, O in pending:
            Z = scratch[:math.prod(batch) * S * I * J].reshape(batch + (S, I, J))
            R = Z.reshape(batch + shapes).transpose(zperm)
            out[pos] = (X, Y, Z, R, O)
        return out

    def _weights_at(self, Delta):
        """The finals' weights times ``Δ^power``, computed once per value of ``Δ``.

        ``Δ`` is the model's label-noise variance, the same at every call of one model;
        the power of every weight (~10⁴ of them for ``z² + z³/3``) cost 0.15 ms a call
        (``p = 8``).  Same values as computing them again.
        """
        hit = self._weights_cache
        if hit is None or hit[0] != Delta:
            hit = self._weights_cache = (Delta, self.weights * Delta ** self.powers)
        return hit[1]

    def _run(self, W, CP, stud, summed, Delta, B, views, group_views):
        self._load(W, CP, stud, summed, Delta, B)
        for seg, view in zip(self.segments, views):
            self._segment(W, seg, view, B)
        return self._symmetrised(self._group_products(W, B, group_views))

    # the phases of one call, in the order _run takes them (benchmarks/bench_kernels.py
    # --diffusion-segments times them one by one)
    def _load(self, W, CP, stud, summed, Delta, B):
        """The workspace's inputs, leaves, zeroed accumulators and weights."""
        for key, arr in (("CP", CP), ("stud", stud), ("summed", summed)):
            lo, hi = self.regions[key]
            W[:, lo:hi] = arr.reshape(B, -1)
        W[:, self.regions["one"][0]] = 1.0
        # one compiled loop (3x numpy.take's speed at p = 8, measured; the sources, in the
        # input regions, lie before the leaves' span)
        self.vm.gather(W, self.leaf_src, self.leaf_span[0])
        W[:, self.zero_span[0]:self.zero_span[1]] = 0.0
        W[:, self.w_span[0]:self.w_span[1]] = self._weights_at(Delta)

    def _segment(self, W, seg, view, B):
        """One segment: a run of interpreter rows, or one numpy step (on its prebuilt
        views when it has them)."""
        if seg[0] == "vm":
            self.vm.run(W, self.code, seg[1], seg[2])
        elif view is not None:
            numpy.matmul(view[0], view[1], out=view[2])
        else:
            _, subs, x, y, z = seg
            xv = W[:, x[0]:x[0] + math.prod(x[2])].reshape((B,) + x[2])
            yv = W[:, y[0]:y[0] + math.prod(y[2])].reshape((B,) + y[2])
            _dot_into(subs, xv, yv, W[:, z[0]:z[0] + math.prod(z[2])])

    def _group_products(self, W, B, group_views):
        """The kinds (views of the workspace) with every group's product added in."""
        out = {name: W[:, o:o + math.prod(shape)].reshape((B,) + shape)
               for name, (o, shape) in self.outputs.items()}
        for (name, subs, co, cs, ao, as_, shc, sha, copy_is_x), plan, view in zip(
                self.groups, self.pair_plans, group_views):
            if view is not None:
                X, Y, Z, R, O = view
                numpy.matmul(X, Y, out=Z)
                O += R
                continue
            S = W[:, co:co + cs].reshape((B,) + shc)
            A = W[:, ao:ao + as_].reshape((B,) + sha)
            x, y = (S, A) if copy_is_x else (A, S)
            if plan is None:
                out[name] += _dot(subs, x, y)
            else:
                _pair_product(plan, x, y, out[name])
        return out

    def _symmetrised(self, out):
        return {name: _symmetrise(value, self.roles[name], 1) for name, value in out.items()}


#: Group products of fewer multiply-adds (times the batch) than this are taken whole: the
#: ordered-pair form's gathers and scatter cost more than the multiply-adds it saves
#: (measured at p = 16: 1.8·10⁷ multiply-adds 0.60 → 0.52 ms, 7·10⁶ 0.22 → 0.26 ms).
PAIR_MIN = 2 ** 24


def _group_macs(group):
    """Multiply-adds of one group's whole product (an entry of ``_Executable.groups``)."""
    name, subs, co, cs, ao, as_, shc, sha, copy_is_x = group
    xl, yl, _ = _letters(subs)
    dims = dict(zip(xl, shc if copy_is_x else sha))
    dims.update(zip(yl, sha if copy_is_x else shc))
    return math.prod(dims.values())


def _pair_plan(subs, roles, xshape, yshape):
    r"""How a group's product ``Σ x_{t a b …} y_{t c d …}`` is taken over ordered pairs, or None.

    Applies when the kind has four external axes, ``x`` holds the first two and ``y``
    the last two, and each pair has one role.  The kind is symmetrised over the
    permutations of equal roles (:func:`_symmetrise`, a sum), which include the swaps
    ``a ↔ b`` and ``c ↔ d``; so the product may be replaced by any array with the same
    sums over the orbits of those swaps: with ``x̃_{ab} = x_{ab} + x_{ba}`` for
    ``a < b`` and ``x_{aa}`` on the diagonal (the same for ``y``), the product
    ``Σ_t x̃_{t,(ab)} ỹ_{t,(cd)}`` over ordered pairs ``a ≤ b``, ``c ≤ d`` put at
    ``[a, b, c, d]`` (zero elsewhere) is one.  ``(P × K) @ (K × Q)`` with
    ``P = p(p+1)/2`` instead of ``(p² × K) @ (K × q²)``: about 4× fewer multiply-adds.
    Returns ``(letters, iu, ju, half, iu_y, ju_y, half_y, subscripts, flat_x, flat_y)``.
    """
    xs, ys, outs = _letters(subs)
    if len(outs) != 4 or xs[1:3] != outs[:2] or ys[1:3] != outs[2:]:
        return None
    if any(c in outs for c in xs[3:] + ys[3:]) or roles[0] != roles[1] or roles[2] != roles[3]:
        return None
    pa, pc = xshape[1], yshape[1]
    iu, ju = numpy.triu_indices(pa)
    iv, jv = numpy.triu_indices(pc)
    rest_x, rest_y = xs[3:], ys[3:]
    free = [c for c in "ijklmnoz" if c not in xs + ys][:2]
    sub2 = f"...t{free[0]}{rest_x},...t{free[1]}{rest_y}->...{free[0]}{free[1]}"
    return (outs + "".join(free), iu, ju, numpy.where(iu == ju, 0.5, 1.0), iv, jv,
            numpy.where(iv == jv, 0.5, 1.0), sub2, iu * pa + ju, iv * pc + jv)


def _pair_product(plan, x, y, out):
    """Add a group's product over ordered pairs (:func:`_pair_plan`) into `out` (batch first)."""
    _, iu, ju, hx, iv, jv, hy, sub2, fx, fy = plan

    def pairs(z, i, j, half):
        # z (B, t, a, b, …): the pair axes 2, 3 → one axis of the ordered pairs
        a = z.shape[2]
        flat = z.reshape(z.shape[:2] + (a * a, -1))
        out = flat.take(i * a + j, axis=2)
        out += flat.take(j * a + i, axis=2)
        out *= half[:, None]
        return out.reshape(z.shape[:2] + (len(i),) + z.shape[4:])
    xt, yt = pairs(x, iu, ju, hx), pairs(y, iv, jv, hy)
    B, shape = out.shape[0], out.shape[1:]
    view = out.reshape(B, shape[0] * shape[1], shape[2] * shape[3])
    view[:, fx[:, None], fy[None, :]] += _dot(sub2, xt, yt)


_PROGRAMS: dict = {}
#: The workspace buffer kept between :class:`_Executable` calls (one, at most
#: :data:`MAX_WORKSPACE` elements), with the views built on it
#: (:meth:`_Executable._step_views`, :meth:`_Executable._group_views`, per executable and
#: batch size, at most :data:`MAX_VIEWS` of them).
_SPARE: list = []


def _program(plan, names, p, n):
    key = (id(plan), names, p, n)
    hit = _PROGRAMS.get(key)
    if hit is None or hit[0] is not plan:
        hit = (plan, _Program(plan, names, p, n))
        _PROGRAMS[key] = hit
    return hit[1]


_EXECUTABLES: dict = {}


def _run_program(plan, names, p, n, CP, stud, summed, Delta, batch):
    """The kinds through :class:`_Executable`, the batch in chunks of bounded workspace."""
    nbatch = max(1, math.prod(batch))
    exe = _executable(plan, names, p, n, nbatch)
    chunk = max(1, min(nbatch, MAX_WORKSPACE // max(exe.size, 1)))
    flat = [a.reshape((nbatch,) + a.shape[len(batch):])
            for a in (numpy.broadcast_to(CP, batch + CP.shape[len(batch):]),
                      numpy.broadcast_to(stud, batch + stud.shape[len(batch):]),
                      numpy.broadcast_to(summed, batch + summed.shape[len(batch):]))]
    parts = []
    for lo in range(0, nbatch, chunk):
        hi = min(nbatch, lo + chunk)
        parts.append(exe.run(*(a[lo:hi] for a in flat), Delta, hi - lo))
    if len(parts) == 1:
        # one chunk: its kinds are fresh arrays already (_symmetrise copies), not views of
        # the reused workspace; concatenating copied all of them again (0.15 ms at
        # (z³ − 3z, 16), measured)
        return {name: value.reshape(batch + value.shape[1:]) for name, value in parts[0].items()}
    return {name: numpy.concatenate([part[name] for part in parts]).reshape(
        batch + parts[0][name].shape[1:]) for name in parts[0]}


def _executable(plan, names, p, n, nbatch):
    """The :class:`_Executable` of a plan's program for a batch of `nbatch` states (cached)."""
    bucket = 1 if nbatch <= 1 else 2 ** min(6, math.ceil(math.log2(nbatch)))
    key = (id(plan), names, p, n, bucket)
    hit = _EXECUTABLES.get(key)
    if hit is None or hit[0] is not plan:
        hit = (plan, _Executable(_program(plan, names, p, n), plan["__top__"], bucket))
        _EXECUTABLES[key] = hit
    return hit[1]


def _class_einsum(subscripts, ops, nterms):
    """One class's contraction, as a precomputed sequence of pairwise ``einsum`` calls.

    The order (:func:`_pairwise_plan`) is computed once per subscripts and
    operand shape (batch axes excluded: the order does not depend on them); the steps
    then run without ``einsum``'s per-call planning (which cost ~1 ms per multigraph,
    most of the former route's time).  When the largest intermediate would exceed
    :data:`MAX_INTERMEDIATE` elements the terms are contracted in chunks.
    """
    tails = _TAILS.get(subscripts)
    if tails is None:
        tails = tuple(len(x.replace("...", "")) for x in subscripts.split("->")[0].split(","))
        _TAILS[subscripts] = tails
    core = tuple(o.shape[o.ndim - k:] for o, k in zip(ops, tails))
    hit = _PATHS.get((subscripts, core))
    if hit is None:
        hit = _pairwise_plan(subscripts, core)
        _PATHS[(subscripts, core)] = hit
    steps, largest = hit
    nbatch = max(1, math.prod(ops[-1].shape[:ops[-1].ndim - tails[-1]]))
    chunk = max(1, int(MAX_INTERMEDIATE * nterms // max(largest * nbatch, 1)))
    _CHUNKS[(subscripts, core)] = (chunk, nterms)
    if chunk >= nterms:
        return _run_steps(steps, list(ops))
    total = 0.0
    for start in range(0, nterms, chunk):
        sl = slice(start, start + chunk)
        # every operand but the weights has the term axis right after the batch axes
        part = [ops[0][sl]] + [o[(Ellipsis, sl) + (slice(None),) * (tails[k] - 1)]
                               for k, o in enumerate(ops[1:], start=1)]
        total = total + _run_steps(steps, part)
    return total


_TAILS: dict = {}
#: (subscripts, core shapes) -> (terms per chunk, terms) of the last call (for the tests)
_CHUNKS: dict = {}


def _run_steps(steps, ops):
    nbatch = max(1, math.prod(ops[-1].shape[:-2]))
    for positions, subs, flops in steps:
        args = [ops.pop(i) for i in positions]
        # a large pairwise step may go to BLAS (einsum's planner: ~0.1 ms, worth it there)
        ops.append(numpy.einsum(subs, *args, optimize=flops * nbatch >= LARGE_STEP))
    return ops[0]


_DOTS: dict = {}


def _dot(subscripts, x, y):
    r"""``einsum(subscripts, x, y)`` of two operands as one (batched) ``matmul``.

    The letters are sorted into the shared ones kept in the output (``s``, a batch
    of the product), the contracted ones (``k``; with none, ``c_einsum`` does it), and
    those of one operand only
    (``i``, ``j``; summed first when the output lacks them):
    ``Z_{s i j} = Σ_k X_{s i k} Y_{s k j}`` on ``x`` and ``y`` transposed and reshaped
    to ``(…, S, I, K)`` and ``(…, S, K, J)``, then the result is reshaped and
    transposed to the output's order.  The leading ``...`` axes are batch axes of
    both operands.  Same sum as ``einsum`` in another order of the multiply-adds
    (BLAS), so equal to rounding; the layout is computed once per subscripts and
    number of batch axes.
    """
    nb, plan = _cached_plan(subscripts, x)
    if math.prod(x.shape[k] for k in plan[-1]) < 2 and _c_einsum is not None:
        # nothing contracted (an outer product over shared axes): matmul's batch of
        # (I, 1) × (1, J) products is slower than einsum's loop (6× measured)
        return _c_einsum(subscripts, x, y)
    x, y, batch, (sh_s, sh_i, sh_k, sh_j) = _product_operands(x, y, nb, plan)
    zperm = plan[8]
    S, I, K, J = (math.prod(t) for t in (sh_s, sh_i, sh_k, sh_j))
    X = x.reshape(batch + (S, I, K))
    Y = y.reshape(batch + (S, K, J))
    return numpy.matmul(X, Y).reshape(batch + sh_s + sh_i + sh_j).transpose(zperm)


def _numpy_step(op, shapes, nbatch):
    """Whether a program step runs as a numpy matrix product (else in the interpreter).

    From :data:`VM_STEP` multiply-adds (times the batch), when it contracts something: a
    step that contracts nothing (an outer or elementwise product) is no faster in numpy
    (~0.8 GMAC/s measured at p = 16) and written by the interpreter it can be laid out
    for its reader (:func:`_layouts`).
    """
    _, subs, i, j, flops = op
    if flops * nbatch < VM_STEP:
        return False
    xl, yl, zl = _letters(subs)
    dims = dict(zip(xl, shapes[i][1]))
    dims.update(zip(yl, shapes[j][1]))
    return math.prod(dims[c] for c in xl if c in yl and c not in zl) > 1


def _layouts(ops, finals, seq, shapes, outputs, groups, member_of, nbatch, forced=None):
    r"""The memory order of every node of an :class:`_Executable`, and the products to swap.

    Every node is laid out for its reader of most multiply-adds, decided from the last
    node to the first (a reader's own result is laid out before its inputs):

    * read by an interpreter step (or a final into its kind) ``z = Σ x y``: the letters
      ``z`` keeps innermost, in ``z``'s memory order, the summed ones outside them — a
      run of ``z``'s fastest letters then has unit stride in ``z`` and in the operand,
      one loop of the interpreter (:func:`contraction_vm.encode` merges it), instead of
      a short loop per summed index (``z_{abc} += Σ_k y_{ak} x_{bkc}`` at ``p = 8``:
      loops of 8 entries under a loop over ``k``; laid out ``x_{kbc}``, ``b c`` are one
      loop of 64);
    * read by a numpy step (a matrix product ``(S, I, K) @ (S, K, J)``, see
      :func:`_dot`): ``(S, I, K)`` for its first operand and ``(S, K, J)`` for its
      second, in that step's order (views, no transposed copy);
    * read by the stacking of a group's operand: the stack's order (a contiguous copy).

    A leaf is gathered in any order at no cost and an interpreter step writes any
    order.  A numpy step writes its product's order ``S I J`` — or ``S J I``, its
    operands swapped (``Zᵀ = Yᵀ Xᵀ``) — with the letters within ``S``, ``I``, ``J`` in
    any order: the one closest to what its reader wants (the longest common run of
    fastest letters).  A leaf is gathered again in the order of each interpreter reader
    that wants another one and does at least as many multiply-adds as the leaf has
    entries; an interpreter step's result is copied (one more row) in the order of each
    such reader that does at least :data:`STEP_COPY` times as many.  Returns ``({node:
    permutation of its logical axes}, {numpy steps whose operands are swapped}, {leaf or
    interpreter step: {reader: permutation of its copy}})``, a reader named
    ``("op", step, side)`` or ``("final", final, side)``.  `forced`: nodes whose order
    is fixed (written into a group's stack).  Only layouts change, not the sums: each
    step adds the same products, in an order that may differ (equal to rounding).
    """
    memory, swapped, copies = {}, set(), {}
    readers: dict = {}
    numpy_steps = set()
    for kind, k in seq:
        if kind == "op":
            _, subs, i, j, flops = ops[k]
            xl, yl, zl = _letters(subs)
            if _numpy_step(ops[k], shapes, nbatch):
                numpy_steps.add(k)
                readers.setdefault(i, []).append((flops, xl, ("numpy", k, 0), None))
                readers.setdefault(j, []).append((flops, yl, ("numpy", k, 1), None))
            else:
                readers.setdefault(i, []).append((flops, xl, ("vm", k, zl), ("op", k, 0)))
                readers.setdefault(j, []).append((flops, yl, ("vm", k, zl), ("op", k, 1)))
        else:
            name, i, j, subs, _, _, flops = finals[k]
            xl, yl, zl = _letters(subs)
            if k in member_of:
                shared, s_letters, s_order, other, o_letters, o_order, _ = member_of[k][1]
                readers.setdefault(shared, []).append((flops, s_letters, ("fixed", s_order),
                                                       None))
                readers.setdefault(other, []).append((flops, o_letters, ("fixed", o_order),
                                                      None))
            else:
                readers.setdefault(i, []).append((flops, xl, ("kind", zl), ("final", k, 0)))
                readers.setdefault(j, []).append((flops, yl, ("kind", zl), ("final", k, 1)))

    def in_memory(k, letters):
        return [letters[a] for a in memory.get(k, range(len(letters)))]

    def wanted(letters, how):
        """The order of `letters` that the reader `how` wants."""
        if how[0] == "fixed":
            return [c for c in how[1] if c in letters]
        if how[0] == "numpy":
            k2, side = how[1], how[2]
            xl, yl, zl = _letters(ops[k2][1])
            order = in_memory(k2, zl)
            is_first = (side == 0) != (k2 in swapped)
            first, second = (xl, yl) if (k2 not in swapped) else (yl, xl)
            mine = first if is_first else second
            contracted = [c for c in first if c in second and c not in zl]
            kept = [c for c in order if c in mine]
            s = [c for c in kept if c in first and c in second]
            own = [c for c in kept if c not in s]
            return s + own + contracted if is_first else s + contracted + own
        zl = how[-1]
        zmem = zl if how[0] == "kind" else in_memory(how[1], zl)
        return [c for c in zmem if c in letters]

    for k in range(len(ops) - 1, -1, -1):
        if forced and k in forced:              # written into a group's stack, its order
            perm = list(forced[k])
        elif k in readers:
            _, letters, how, _ = max(readers[k], key=lambda r: r[0])
            order = wanted(letters, how)
            order = [c for c in letters if c not in order] + order
            perm = [letters.index(c) for c in order]      # logical axis positions
        elif k in numpy_steps:
            perm = list(range(len(shapes[k][1])))
        else:
            continue
        if k in readers and (ops[k][0] == "leaf" or k not in numpy_steps):
            # gathered again in the order of each interpreter reader that wants another
            # one, when it does at least as many multiply-adds as the copy has entries (a
            # gather costs about one per entry); an interpreter step's result (written
            # in its main reader's order, or in a group's stack) copied in that order by
            # one more row, when the reader does STEP_COPY times as many
            size = math.prod(shapes[k][1])
            least = size if ops[k][0] == "leaf" else STEP_COPY * size
            for flops2, letters2, how2, rid in readers[k]:
                if rid is None or flops2 < least:
                    continue
                order2 = wanted(letters2, how2)
                order2 = [c for c in letters2 if c not in order2] + order2
                perm2 = tuple(letters2.index(c) for c in order2)
                if perm2 != tuple(perm):
                    copies.setdefault(k, {})[rid] = perm2
        if k in numpy_steps:
            # in the producing step's letters: its product's order closest to `perm`
            xl, yl, zl = _letters(ops[k][1])
            order = [zl[a] for a in perm]
            s = [c for c in order if c in xl and c in yl]
            i_ = [c for c in order if c in xl and c not in yl]
            j_ = [c for c in order if c in yl and c not in xl]

            def common_run(cand, order=order):
                run = 0
                while run < len(cand) and cand[-1 - run] == order[-1 - run]:
                    run += 1
                return run
            if common_run(s + j_ + i_) > common_run(s + i_ + j_):
                order = s + j_ + i_
                swapped.add(k)
            else:
                order = s + i_ + j_
            perm = [zl.index(c) for c in order]
        if perm != list(range(len(perm))):
            memory[k] = tuple(perm)
    return memory, swapped, copies


def _natural_order(xs, ys, zs):
    """The output letters of a pairwise step in its matrix product's order (see :func:`_dot`).

    The letters of both operands kept in the output (the term axis among them) first,
    then those of `xs` only, then those of `ys` only, each in the order of `zs`: written
    in this order, the product needs no transposed copy (:func:`_dot_into`).
    """
    shared = [c for c in zs if c in xs and c in ys]
    only_x = [c for c in zs if c in xs and c not in ys]
    only_y = [c for c in zs if c in ys and c not in xs]
    return "".join(shared + only_x + only_y)


def _dot_into(subscripts, x, y, out):
    """:func:`_dot` written into `out` (batch axes, then the flat result), no result copy.

    `subscripts`' output letters must be in :func:`_natural_order`; the product is
    ``matmul(X, Y, out=…)`` with ``X (…, S, I, K)``, ``Y (…, S, K, J)``, or, where
    nothing is contracted, the broadcast ``X[…, :, None] · Y[…, None, :]``, both written
    straight into `out`'s memory.
    """
    nb, plan = _cached_plan(subscripts, x)
    x, y, batch, (sh_s, sh_i, sh_k, sh_j) = _product_operands(x, y, nb, plan)
    S, I, K, J = (math.prod(t) for t in (sh_s, sh_i, sh_k, sh_j))
    if K == 1:
        # nothing contracted: the broadcast product straight from the transposed views
        # (flattening them first would copy the transposed operand)
        numpy.multiply(x.reshape(batch + sh_s + sh_i + (1,) * len(sh_j)),
                       y.reshape(batch + sh_s + (1,) * len(sh_i) + sh_j),
                       out=out.reshape(batch + sh_s + sh_i + sh_j))
    else:
        Z = out.reshape(batch + (S, I, J))
        numpy.matmul(x.reshape(batch + (S, I, K)), y.reshape(batch + (S, K, J)), out=Z)


def _cached_plan(subscripts, x):
    """``(nb, plan)``: `x`'s number of batch axes and :func:`_dot_plan`, computed once."""
    nb = x.ndim - len(subscripts.split(",")[0].replace("...", ""))
    key = (subscripts, nb)
    plan = _DOTS.get(key)
    if plan is None:
        plan = _DOTS[key] = _dot_plan(subscripts, nb)
    return nb, plan


def _matmul_operands(subscripts, x, y):
    """`x`, `y` as :func:`_dot`'s ``matmul`` operands ``(…, S, I, K)`` and ``(…, S, K, J)``.

    Returns ``(X, Y, batch, (S, I, K, J), axes, zperm)``: ``axes`` the result's shapes
    of its shared, `x`-only and `y`-only letters (``(…, S, I, J)`` reshaped to ``batch +
    axes`` and transposed by ``zperm`` is the output).  Reshapes of transposed views: an
    operand that cannot be viewed so is a copy (the callers that want views check).
    """
    nb, plan = _cached_plan(subscripts, x)
    x, y, batch, (sh_s, sh_i, sh_k, sh_j) = _product_operands(x, y, nb, plan)
    S, I, K, J = (math.prod(t) for t in (sh_s, sh_i, sh_k, sh_j))
    return (x.reshape(batch + (S, I, K)), y.reshape(batch + (S, K, J)), batch, (S, I, K, J),
            sh_s + sh_i + sh_j, plan[8])


def _blasable(a):
    """Whether the last two axes of `a` are a matrix BLAS takes as it is: one of them of
    unit stride, the other a multiple of the element size at least that axis' extent
    (numpy's ``matmul`` calls ``gemm`` on such operands, else its own slow loop)."""
    (m, n), (sm, sn), e = a.shape[-2:], a.strides[-2:], a.itemsize
    return ((sn == e and sm % e == 0 and sm >= n * e)
            or (sm == e and sn % e == 0 and sn >= m * e))


def _batched_views(subscripts, x, y, z):
    r"""``matmul`` operands ``(X, Y, Z)`` of a numpy step, views of `x`, `y`, `z` with more
    batch axes, or None.

    The step ``Z_{s i j} = Σ_k X_{s i k} Y_{s k j}`` (:func:`_dot`) needs each group of
    letters — shared ``s``, `x`'s own ``i``, contracted ``k``, `y`'s own ``j`` — to be one
    axis of each array it is in, i.e. adjacent and in one order in memory; where a node
    is laid out for another reader (:func:`_layouts`: its reader of most multiply-adds)
    or a numpy result is written in its own product's order, one group may not be, and
    :func:`_dot_into` copies an operand (``reshape`` of a transposed view) at every call.
    Here the shared letters stay separate batch axes (no merge needed) and at most one
    letter of ``i`` or ``j`` is moved into the batch too (broadcast, stride 0, in the
    operand that lacks it): ``Z_{s p i' j} = Σ_k X_{s p i' k} Y_{s k j}`` for ``p ∈ i``,
    a batch of smaller products on the arrays as they lie.  Taken only when every
    remaining group is one axis of each array (views of the workspace, no copy) and the
    three matrices are in a layout BLAS takes (:func:`_blasable`); the letter moved is
    the one of fewest entries (fewest ``gemm`` calls).  Not two letters: measured at
    (``z³ − 3z``, 16), the products left are ``(1 × 18)(18 × 16)``, slower than the copy
    (16–22 µs against 11–12).  The same sums over ``k`` as one product, split into
    smaller ``gemm`` calls: equal to rounding (BLAS may block ``k`` differently).

    `x`, `y`, `z`: the operands and the result with one leading batch axis (the
    states), then their letters of `subscripts` (``"...xs,...ys->...zs"``) in order.
    """
    xl, yl, zl = _letters(subscripts)
    if any(c not in zl and not (c in xl and c in yl) for c in xl + yl):
        return None                             # a letter summed alone: needs a sum first
    dims = dict(zip(xl, x.shape[1:]))
    dims.update(zip(yl, y.shape[1:]))
    shared = [c for c in zl if c in xl and c in yl]
    own_x = [c for c in zl if c in xl and c not in yl]
    own_y = [c for c in zl if c in yl and c not in xl]
    summed = [c for c in xl if c in yl and c not in zl]
    if math.prod(dims[c] for c in summed) < 2:
        return None

    def view(arr, letters, batch, rows, cols):
        # the batch letters as axes (broadcast where `arr` lacks one), rows and cols each
        # merged into one axis: a view, or None where merging them would copy
        v = arr.transpose([0] + [1 + letters.index(c) for c in batch + rows + cols
                                 if c in letters])
        v = v[(slice(None),) + tuple(slice(None) if c in letters else None for c in batch)]
        shape = (arr.shape[0],) + tuple(dims[c] for c in batch)
        if v.shape[:len(shape)] != shape:
            v = numpy.broadcast_to(v, shape + v.shape[len(shape):])
        v = v.reshape(shape + (math.prod(dims[c] for c in rows),
                               math.prod(dims[c] for c in cols)))
        return v if numpy.may_share_memory(v, arr) and _blasable(v) else None

    for moved in sorted([()] + [(c,) for c in own_x + own_y],
                        key=lambda m: math.prod(dims[c] for c in m)):
        batch = [c for c in zl if c in shared or c in moved]
        rows = [c for c in own_x if c not in moved]
        cols = [c for c in own_y if c not in moved]
        X = view(x, xl, batch, rows, summed)
        Y = view(y, yl, batch, summed, cols)
        Z = view(z, zl, batch, rows, cols)
        if X is not None and Y is not None and Z is not None:
            return X, Y, Z
    return None


def _product_operands(x, y, nb, plan):
    """`x`, `y` summed over their own dropped axes and transposed to ``(…, s, i, k)`` and
    ``(…, s, k, j)`` (batch axes broadcast); the batch shape and ``(s, i, k, j)`` shapes."""
    xsum, ysum, xperm, yperm, ns, ni, nk = plan[:7]
    if xsum:
        x = x.sum(axis=xsum)
    if ysum:
        y = y.sum(axis=ysum)
    x = x.transpose(xperm)
    y = y.transpose(yperm)
    batch = x.shape[:nb]
    if y.shape[:nb] != batch:                 # (the program's operands share theirs)
        batch = numpy.broadcast_shapes(batch, y.shape[:nb])
        x = numpy.broadcast_to(x, batch + x.shape[nb:])
        y = numpy.broadcast_to(y, batch + y.shape[nb:])
    shapes = (x.shape[nb:nb + ns], x.shape[nb + ns:nb + ns + ni], x.shape[nb + ns + ni:],
              y.shape[nb + ns + nk:])
    return x, y, batch, shapes


def _dot_plan(subscripts, nb):
    """Axis sums and permutations of :func:`_dot` for `subscripts` with `nb` batch axes."""
    ins, out = subscripts.split("->")
    xs, ys = (t.replace("...", "") for t in ins.split(","))
    zs = out.replace("...", "")
    kaxes = tuple(nb + k for k, c in enumerate(xs) if c in ys and c not in zs)
    xsum = tuple(nb + k for k, c in enumerate(xs) if c not in ys and c not in zs)
    ysum = tuple(nb + k for k, c in enumerate(ys) if c not in xs and c not in zs)
    xs = "".join(c for c in xs if c in ys or c in zs)
    ys = "".join(c for c in ys if c in xs or c in zs)
    shared = [c for c in zs if c in xs and c in ys]
    contracted = [c for c in xs if c in ys and c not in zs]
    only_x = [c for c in zs if c in xs and c not in ys]
    only_y = [c for c in zs if c in ys and c not in xs]
    head = tuple(range(nb))
    xperm = head + tuple(nb + xs.index(c) for c in shared + only_x + contracted)
    yperm = head + tuple(nb + ys.index(c) for c in shared + contracted + only_y)
    order = shared + only_x + only_y
    zperm = head + tuple(nb + order.index(c) for c in zs)
    return (xsum, ysum, xperm, yperm, len(shared), len(only_x), len(contracted),
            len(only_y), zperm, kaxes)


#: Pairwise steps of at least this many multiply-adds are left to ``einsum``'s own
#: planner, which can hand them to BLAS; smaller ones run in ``c_einsum`` directly.
LARGE_STEP = 2 ** 18


def _vacuum_pair(letters, sizes, out_letters):
    """``[(i, j)]`` pairing an operand that reduces to one number per term, or ``[]``.

    An operand none of whose letters (the term axis aside) is held by another operand
    or kept in the output — a summed vertex joined to nothing, ``Σ_e w_e φ_j(e)`` — is
    a factor per term: taken first with the smallest other operand it costs that
    operand's size, whereas the greedy rule (which prefers pairs sharing a summed
    letter) took it last, against the largest intermediate (a ``p⁴ n`` term tensor
    built only to be scaled, 5.2·10⁷ of the products of ``z² + z³/3`` at ``p = 16``).
    """
    m = len(letters)
    if m <= 2:
        return []
    for i in range(m):
        if letters[i] & out_letters or any(letters[i] & letters[j] for j in range(m) if j != i):
            continue
        j = min((k for k in range(m) if k != i), key=lambda k: (sizes[k], k))
        return [(min(i, j), max(i, j))]
    return []


def _pairwise_plan(subscripts, core):
    """``(steps, largest)``: a greedy order of pairwise contractions and its largest intermediate.

    ``core`` are the operands' shapes without the batch axes; a step is
    ``(positions popped, subscripts, large)``.  At each step the pair whose result
    is smallest against its inputs (``size(result) − size(x) − size(y)``, then the
    step's multiply-adds) is contracted — numpy's greedy rule, but always pairwise:
    ``einsum_path`` contracts what is left in one multi-operand step once no pair
    shrinks, an ``O(p⁴ n⁴)`` loop for the densest multigraphs (46 s against 1 s for
    ``z³ − 3z`` at p = 16).  ``largest`` is per batch element, in elements.
    """
    inputs, output = subscripts.split("->")
    current = inputs.split(",")
    dims = {}
    for sub, shape in zip(current, core):
        dims.update(zip(sub.replace("...", ""), shape))
    out_letters = frozenset(output.replace("...", ""))
    out_size = math.prod(dims[ch] for ch in out_letters)
    sets = [frozenset(sub.replace("...", "")) for sub in current]
    sizes = [math.prod(dims[ch] for ch in x) for x in sets]
    holders = {}                              # letter -> number of operands holding it
    for x in sets:
        for ch in x:
            holders[ch] = holders.get(ch, 0) + 1
    steps, largest = [], 1
    while len(current) > 1:
        m = len(current)
        summed = [x - {"t"} for x in sets]
        pairs = _vacuum_pair(summed, sizes, out_letters)
        if not pairs:
            pairs = [(i, j) for i in range(m) for j in range(i + 1, m)
                     if summed[i] & summed[j]]            # pairs sharing a summed index
        if not pairs:
            pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
        best = None
        for i, j in pairs:
            si, sj = sets[i], sets[j]
            union = si | sj
            if m == 2:
                size_r = out_size
            else:
                both = si & sj
                size_r = 1
                for ch in union:
                    # held elsewhere: by more operands than the pair's own
                    if ch in out_letters or holders[ch] > (2 if ch in both else 1):
                        size_r *= dims[ch]
            flops = 1
            for ch in union:
                flops *= dims[ch]
            key = (size_r - sizes[i] - sizes[j], flops)
            if best is None or key < best[0]:
                best = (key, i, j, flops)
        _, i, j, flops = best
        letters = list(dict.fromkeys((current[i] + current[j]).replace("...", "")))
        if m == 2:
            result = output
        else:
            both = sets[i] & sets[j]
            ell = "..." if current[i].startswith("...") or current[j].startswith("...") \
                else ""
            result = ell + "".join(ch for ch in letters if ch in out_letters
                                   or holders[ch] > (2 if ch in both else 1))
        steps.append(((j, i), current[j] + "," + current[i] + "->" + result, flops))
        for k in (j, i):
            for ch in sets[k]:
                holders[ch] -= 1
            current.pop(k)
            sets.pop(k)
            sizes.pop(k)
        rset = frozenset(result.replace("...", ""))
        for ch in rset:
            holders[ch] = holders.get(ch, 0) + 1
        current.append(result)
        sets.append(rset)
        sizes.append(math.prod(dims[ch] for ch in rset))
        largest = max(largest, sizes[-1])
    return steps, largest


def _pairwise_plan_strings(subscripts, core):
    """The former :func:`_pairwise_plan` (string tests per pair), kept to check it."""
    inputs, output = subscripts.split("->")
    current = inputs.split(",")
    dims = {}
    for sub, shape in zip(current, core):
        dims.update(zip(sub.replace("...", ""), shape))

    def size(sub):
        return math.prod(dims[ch] for ch in sub.replace("...", ""))
    sizes = [size(sub) for sub in current]
    out_letters = frozenset(output.replace("...", ""))
    steps, largest = [], 1
    while len(current) > 1:
        best = None
        letter_sets = [set(sub.replace("...", "")) - {"t"} for sub in current]
        pairs = _vacuum_pair(letter_sets, sizes, out_letters) or \
            [(i, j) for i in range(len(current)) for j in range(i + 1, len(current))
             if letter_sets[i] & letter_sets[j]]          # pairs sharing a summed index
        if not pairs:
            pairs = [(i, j) for i in range(len(current)) for j in range(i + 1, len(current))]
        for i, j in pairs:
            rest = "".join(current[k] for k in range(len(current)) if k not in (i, j))
            letters = list(dict.fromkeys((current[i] + current[j]).replace("...", "")))
            ell = "..." if current[i].startswith("...") or current[j].startswith("...") \
                else ""
            if len(current) == 2:
                result = output
            else:
                result = ell + "".join(ch for ch in letters if ch in rest or ch in output)
            flops = math.prod(dims[ch] for ch in letters)
            key = (size(result) - sizes[i] - sizes[j], flops)
            if best is None or key < best[0]:
                best = (key, i, j, result, flops)
        _, i, j, result, flops = best
        steps.append(((j, i), current[j] + "," + current[i] + "->" + result, flops))
        largest = max(largest, size(result))
        for k in (j, i):
            current.pop(k)
            sizes.pop(k)
        current.append(result)
        sizes.append(size(result))
    return steps, largest


def tensor_kinds_reference(plan, Q, rho, T, a, b, Delta, names):
    """The kinds ``names`` term by term: one ``einsum`` per multigraph (the reference route).

    Same value as :func:`tensor_kinds` (to rounding); kept as its independent check.

    ``plan[name]`` is ``(roles, ((noise, q, terms), …))``: ``roles`` the
    external vertices (``"d"`` for ``σ'``, ``"x"`` for a field, ``"s"`` for
    ``σ``), then per power ``q`` of the clean error the noise factor
    ``noise = (coefficient, power of Δ)`` and the multigraph terms
    ``((size, |G|), edges, orders)`` (weight ``size/|G|``; ``edges`` as ``((u, v), m)`` pairs,
    ``orders[v]`` the order of vertex ``v``'s vertex function; summed
    vertices come last; one term per orbit of the permutations of the summed
    vertices and of the external vertices of one role, so the weighted sum is
    symmetrised over the latter).  Output axes: students (``p``) for
    ``d``/``s`` vertices, fields (``n``) for ``x`` vertices.
    """
    C, p = _tensor.combine(Q, rho, T)
    w = _tensor.weights(a, b)
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    C = numpy.broadcast_to(C, batch + C.shape[-2:])
    w = numpy.broadcast_to(w, batch + w.shape[-1:])
    D = numpy.diagonal(C, axis1=-2, axis2=-1)
    phi = plan["__phi__"](D, p)
    zero = numpy.zeros(batch + (C.shape[-1],))
    phi = [zero if f is None else numpy.broadcast_to(f, zero.shape) for f in phi]
    top = plan["__top__"]
    phi += [zero] * (top + 2 - len(phi))
    vstud = [f[..., :p] for f in phi]
    vsum = [f * w for f in phi]
    Cp = _tensor._hadamard_powers(C, top)
    n = C.shape[-1]
    out = {}
    for name in names:
        roles, parts = plan[name]
        shape = batch + tuple(p if r in ("d", "s") else n for r in roles)
        total = numpy.zeros(shape)
        for (coeff, dpow), q, terms in parts:
            full = tuple(roles) + ("q",) * q
            acc = numpy.zeros(shape)
            for i, ((size, group), edges, orders) in enumerate(terms):
                subs, ops = _term_operands((edges, orders), full, Cp, vstud, vsum, p)
                acc += (size / group) * _einsum((name, q, i), subs, ops)
            total += (coeff * Delta ** dpow) * acc
        out[name] = _symmetrise(total, roles, len(batch))
    return KindArrays(out)


def _symmetrise(array, roles, nbatch):
    r"""``Σ_π π(array)`` over the permutations of the axes of equal role.

    Taken in stages, one role's axes ``v_1 … v_m`` at a time: every permutation of
    them is one of ``{e, (v_i v_k), i < k}`` after a permutation of ``v_1 … v_{k−1}``
    (the cosets of ``S_{k−1}`` in ``S_k``), so ``Σ_{S_k} = (1 + Σ_{i<k} (v_i v_k)) Σ_{S_{k−1}}``:
    ``m(m−1)/2`` transposed additions instead of ``m! − 1`` (``M400``: 6 instead of 23).
    The same sum in another order (equal to rounding).
    """
    groups = {}
    for v, role in enumerate(roles):
        groups.setdefault(role, []).append(nbatch + v)
    out = array
    for axes in groups.values():
        for k in range(1, len(axes)):
            total = out.copy()
            for i in range(k):
                perm = list(range(array.ndim))
                perm[axes[i]], perm[axes[k]] = axes[k], axes[i]
                total += out.transpose(perm)
            out = total
    return out if out is not array else array.copy()


# ---- entry route: sparse polynomials ----------------------------------------------

def _unblob(text, dtype):
    import base64
    import zlib
    return numpy.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=dtype)


class SparsePolynomials:
    """Many sparse polynomials sharing their monomials: ``P_e(x) = Σ_t c_{et} ∏_v x_v^{E_tv}``.

    The monomials are evaluated once (products of per-generator power tables),
    then every polynomial is a weighted sum of them.  Generators that do not
    describe the state (``T``, the teacher readout, the parameters — every name
    not starting with ``Q_``, ``rho_``, ``inv_Q_`` or, when `trained`, ``a_``) are the same for
    every element of a batch and from call to call: they are substituted once
    per set of values, which merges the monomials that differ only in them
    (the polynomial in the state alone is cached for the last few sets).
    """

    _STATE = ("Q_", "rho_", "a_", "inv_Q_")

    def __init__(self, generators, n_monomials, exponents, rows, columns, numerators,
                 denominators, n_polynomials, trained=True):
        from scipy import sparse
        self.n_gens = len(generators)
        self.exponents = _unblob(exponents, numpy.uint8).reshape(n_monomials, self.n_gens)
        rows = _unblob(rows, numpy.int32)
        cols = _unblob(columns, numpy.int32)
        coeff = _unblob(numerators, numpy.float64) / _unblob(denominators, numpy.float64)
        # (polynomials × monomials), duplicates summed; sparse: Jacobians have ~dim² rows
        self.matrix = sparse.csr_matrix((coeff, (rows, cols)), shape=(n_polynomials, n_monomials))
        state = self._STATE if trained else tuple(x for x in self._STATE if x != "a_")
        self.state = numpy.array([g.startswith(state) for g in generators])
        self.constant = ~self.state
        self._reduced: dict = {}

    def _reduce(self, const_values):
        """Coefficient matrix and state exponents with the constant generators substituted."""
        key = tuple(float(v) for v in const_values)
        hit = self._reduced.get(key)
        if hit is not None:
            return hit
        from scipy import sparse
        E_const = self.exponents[:, self.constant]
        factor = numpy.prod(numpy.asarray(const_values, float)[None, :] ** E_const, axis=1)
        E_state = self.exponents[:, self.state]
        unique, inverse = numpy.unique(E_state, axis=0, return_inverse=True)
        merge = sparse.csr_matrix((factor, (numpy.arange(len(factor)), inverse.ravel())),
                                  shape=(len(factor), len(unique)))
        matrix = (self.matrix @ merge).tocsr()
        if len(self._reduced) >= 8:
            self._reduced.pop(next(iter(self._reduced)))
        self._reduced[key] = (matrix, unique)
        return matrix, unique

    def __call__(self, values):
        """``values`` (..., n_gens) -> the polynomials (..., n_polynomials)."""
        values = numpy.asarray(values, dtype=float)
        flat = values.reshape(-1, self.n_gens)
        const = flat[:, self.constant]
        if len(flat) and numpy.all(const == const[:1]):
            matrix, E = self._reduce(const[0])
            vals = flat[:, self.state]
        else:                      # constants vary across the batch: the full polynomials
            matrix, E, vals = self.matrix, self.exponents, flat
        mono = numpy.ones((len(flat), E.shape[0]))
        for v in range(E.shape[1]):
            e = E[:, v]
            top = int(e.max()) if e.size else 0
            if top == 0:
                continue
            powers = vals[:, v, None] ** numpy.arange(top + 1)
            mono *= powers[:, e]
        out = numpy.asarray((matrix @ mono.T).T)
        return out.reshape(values.shape[:-1] + (matrix.shape[0],))


def entry_generators(generators, Q, rho, T, a, b, params):
    """Values of the entry route's generators (entry symbols, readouts, parameters, inverses)."""
    Q, rho, T, a, b = (numpy.asarray(x, dtype=float) for x in (Q, rho, T, a, b))
    batch = numpy.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2], a.shape[:-1],
                                   b.shape[:-1])
    cols = []
    for name in generators:
        head, _, rest = name.partition("_")
        if name == "inv_batch_size":
            value = 1.0 / params["batch_size"]
        elif name == "sqrt_Delta":
            value = numpy.sqrt(params["Delta"])
        elif name.startswith("inv_Q_"):
            i = int(name.split("_")[2]) - 1
            value = 1.0 / Q[..., i, i]
        elif name in params:
            value = params[name]
        else:
            idx = [int(x) - 1 for x in rest.split("_")]
            value = {"Q": Q, "rho": rho, "T": T, "a": a, "b": b}[head][(Ellipsis,) + tuple(idx)]
        cols.append(numpy.broadcast_to(value, batch))
    return numpy.stack(cols, axis=-1)


def fill_symmetric(values, pairs, dim):
    """The symmetric (..., dim, dim) matrix whose upper-triangle entries ``pairs`` are ``values``."""
    I = numpy.array([i for i, _ in pairs])
    J = numpy.array([j for _, j in pairs])
    D = numpy.empty(values.shape[:-1] + (dim, dim))
    D[..., I, J] = values
    D[..., J, I] = values
    return D
