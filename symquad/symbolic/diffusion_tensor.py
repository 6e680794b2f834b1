r"""Tensor-route moment kinds of the diffusion for any polynomial activations.

A kind of :mod:`symquad.symbolic.diffusion`,

.. math::  M_{dxs} = E\Big[\prod_{i=1}^{d} σ'(u_{v_i}) \prod_{j=1}^{x} u_{v_{d+j}}
           \prod_{k=1}^{s} σ(u_{v_{d+x+k}})\; δ^{r}\Big], \qquad r = d + s,

with ``δ = Σ_a w_a σ_a(u_a) − √Δ ξ`` (``w = (a, −b)``, ``σ_a`` the student's or the
teacher's polynomial), is evaluated in two steps:

1. the label noise is integrated out exactly,
   ``E_ξ[δ^r] = Σ_{t even} binom(r, t) (t−1)!! Δ^{t/2} δ_c^{r−t}``;
2. ``δ_c^q = Σ_{a_1..a_q} ∏ w_{a_i} σ_{a_i}(u_{a_i})`` adds ``q`` *summed* vertices,
   and the multigraph expansion of :mod:`symquad.symbolic.tensor` turns the
   ``(d + x + s + q)``-point function into a sum over loop-free multigraphs
   (edge multiplicities ``m_uv``) of ``∏ C_uv^{m_uv}/m_uv! ∏_v φ_{v, j_v}(D_v)``:
   ``j_v = deg(v) + 1`` at a ``σ'`` vertex, ``deg(v)`` at a ``σ`` or summed vertex, an
   identity vertex has exactly one edge and factor 1.  A term is dropped when one of
   its vertex functions vanishes identically.

The summed vertices are interchangeable, and so are the external vertices of
one role (the kind is symmetric in them): the terms are collected into orbits
under these permutations, and the runtime sums one representative per orbit,
weighted, and symmetrises over the external permutations.  The orbits are
generated directly, one canonical representative with its size each
(:func:`kind_terms`), not by enumerating and canonicalising every labelled
multigraph (:func:`_kind_terms_labelled`, the tests' reference).  Each remaining term is one
tensor contraction over ``≤ 4`` external and ``≤ 4`` summed indices, cost up to
``O(p⁴ n⁴)`` (:func:`symquad.runtime.diffusion_engine.tensor_kinds`).  The number of
terms grows fast with the degree: for ``σ = σ* = z³ − 3z`` the largest kind
(``M400``, ``q = 4``) has 127285 multigraphs in 563 orbits, ``z²`` 1706 in 17; degree 4 is refused
(:data:`symquad.numeric.kernels.MAX_TENSOR_DIFFUSION_DEGREE`).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import permutations, product
from math import comb, factorial

from .diffusion import parse_kind, used_kinds
from .tensor import derive_tensor_form

__all__ = ["kind_plans", "kind_terms"]


def _double_factorial(k: int) -> int:
    out = 1
    while k > 1:
        out *= k
        k -= 2
    return out


def _enumerate(caps, allowed):
    """Edge multiplicities of loop-free multigraphs with vertex degrees in ``allowed[v]``.

    Pairs are filled row by row, so vertex ``v`` is complete after its row:
    its degree is checked there (pruning the rest of the search).
    """
    V = len(caps)
    pairs = [(u, v) for u in range(V) for v in range(u + 1, V)]
    last_of_row = {}
    for i, (u, v) in enumerate(pairs):
        last_of_row[u] = i
    deg = [0] * V
    chosen = [0] * len(pairs)

    def rec(i):
        if i == len(pairs):
            if deg[V - 1] in allowed[V - 1]:
                yield tuple(chosen)
            return
        u, v = pairs[i]
        top = min(caps[u] - deg[u], caps[v] - deg[v])
        for m in range(top + 1):
            deg[u] += m
            deg[v] += m
            chosen[i] = m
            if last_of_row.get(u) != i or deg[u] in allowed[u]:
                yield from rec(i + 1)
            deg[u] -= m
            deg[v] -= m
        chosen[i] = 0
    if V == 1:
        if 0 in allowed[0]:
            yield ()
        return
    yield from rec(0)


def _canonical(mult, pairs, n_ext, V, orders):
    """Representative of a multigraph under permutations of the summed vertices ``n_ext..V−1``.

    The summed vertices are ordered by their signature (order, multiplicities to the
    external vertices); only vertices of equal signature are permuted, and the
    smallest sorted edge list over those permutations is the representative.  The
    edges among external vertices do not move and are sorted once.
    """
    m = {}
    for (u, v), k in zip(pairs, mult):
        if k:
            m[(u, v)] = k
    if V - n_ext <= 1:
        return tuple(sorted(m.items()))
    sig = {s: (orders[s],) + tuple(m.get((e, s), 0) for e in range(n_ext))
           for s in range(n_ext, V)}
    ordered = sorted(range(n_ext, V), key=sig.__getitem__)
    groups, current = [], [ordered[0]]
    for s in ordered[1:]:
        if sig[s] == sig[current[-1]]:
            current.append(s)
        else:
            groups.append(current)
            current = [s]
    groups.append(current)
    fixed = [(uv, k) for uv, k in m.items() if uv[1] < n_ext]
    moving = [(uv, k) for uv, k in m.items() if uv[1] >= n_ext]
    if all(len(g) == 1 for g in groups):      # one candidate: no search
        relabel = list(range(V))
        for i, old in enumerate(ordered):
            relabel[old] = n_ext + i
        return tuple(sorted(fixed + [((min(relabel[u], relabel[v]), max(relabel[u], relabel[v])),
                                       k) for (u, v), k in moving]))
    fixed.sort()
    best = None
    relabel = list(range(V))
    for choice in product(*[permutations(g) for g in groups]):
        i = n_ext
        for g in choice:
            for old in g:
                relabel[old] = i
                i += 1
        key = sorted(((min(relabel[u], relabel[v]), max(relabel[u], relabel[v])), k)
                     for (u, v), k in moving)
        if best is None or key < best:
            best = key
    return tuple(sorted(fixed + best))


def _vertex_rules(tf, full):
    """Per vertex of roles ``full``: the degree cap, the allowed degrees and the order shift.

    A ``σ'`` vertex (``"d"``) of degree ``k`` carries ``φ_{k+1}`` (shift 1), a ``σ``
    (``"s"``) or summed (``"q"``) vertex ``φ_k``; a degree whose vertex function
    vanishes identically is not allowed (its terms are zero).  An identity vertex
    (``"x"``) has exactly one edge and no order (``None``).
    """
    ds = len(tf.activation) - 1
    d = tf.degree
    student_nz = [f != 0 for f in tf.phi] + [False] * 8
    any_nz = list(tf.nonzero) + [False] * 8
    caps, allowed, shift = [], [], []
    for role in full:
        if role == "d":
            caps.append(ds - 1)
            allowed.append({k for k in range(ds) if student_nz[k + 1]})
            shift.append(1)
        elif role == "s":
            caps.append(ds)
            allowed.append({k for k in range(ds + 1) if student_nz[k]})
            shift.append(0)
        elif role == "x":
            caps.append(1)
            allowed.append({1})
            shift.append(None)
        else:
            caps.append(d)
            allowed.append({k for k in range(d + 1) if any_nz[k]})
            shift.append(0)
    return caps, allowed, shift


def kind_terms(tf, roles, q):
    r"""Orbit representatives ``(((size, |G|), edges, orders), ...)`` of one kind at ``δ_c^q``.

    The orbits are those of ``H = G × S_q``: ``G`` the role-preserving
    permutations of the external vertices, ``S_q`` those of the summed ones; the
    weight ``size/|G|`` is the orbit's size (its number of labelled multigraphs)
    over ``|G|``, so that the kind is ``Σ_{π∈G} π(Σ weight · term)`` (the runtime
    symmetrises).

    The orbits are generated directly, one canonical representative each, in
    three layers:

    1. the multigraph ``E`` among the external vertices, kept when its
       multiplicity vector is the smallest of its ``G``-orbit; ``A ⊂ G`` its
       stabiliser;
    2. the *columns* ``c_s = (m_{e s})_e`` of the summed vertices, as a sorted
       tuple ``c_1 ≤ … ≤ c_q`` (this fixes ``S_q`` up to equal columns), kept when
       no ``a ∈ A`` (acting as ``(a·c)_{a(e)} = c_e``) sorts it into a smaller tuple;
       ``L`` the pairs ``(a, σ)``, ``a ∈ A`` fixing the tuple and ``σ ∈ S_q`` with
       ``c_{σ(s)} = a·c_s`` — the stabiliser of ``(E, c_1, …, c_q)`` in ``H``;
    3. the multigraph ``S`` among the summed vertices, every labelled one, kept
       when it is the smallest of its ``L``-orbit.

    Two kept triples in one ``H``-orbit are equal (each layer is the minimum of
    its orbit under the stabiliser of the layers before), and every orbit has
    one; its stabiliser in ``H`` is ``{l ∈ L : l·S = S}``, so its size is
    ``|H| / |{l ∈ L : l·S = S}|``.  The work is of the order of the number of
    orbits (563 for the largest kind of ``σ = z³ − 3z``) rather than of labelled
    multigraphs (127285): :func:`_kind_terms_labelled` is the labelled route, the
    tests' reference.  Vertex labels: externals ``0 … n_ext − 1``, summed vertex
    ``s`` is ``n_ext + s`` in the order of its sorted column.
    """
    full = tuple(roles) + ("q",) * q
    caps, allowed, shift = _vertex_rules(tf, full)
    n_ext = len(roles)
    ext_perms = _role_permutations(roles)
    group_order = len(ext_perms) * factorial(q)
    cap_q, allowed_q = (caps[-1], allowed[-1]) if q else (0, {0})
    out = []
    for E, E_deg, A in _external_graphs(caps[:n_ext], ext_perms):
        room = [caps[e] - E_deg[e] for e in range(n_ext)]
        ext_edges = [((u, v), k) for (u, v), k in zip(_pairs(n_ext), E) if k]
        for cols, L in _column_tuples(q, room, cap_q, E_deg, allowed[:n_ext], A):
            col_edges = [((e, n_ext + s), c[e]) for s, c in enumerate(cols)
                         for e in range(n_ext) if c[e]]
            used = [sum(c) for c in cols]
            ext_deg = [E_deg[e] + sum(c[e] for c in cols) for e in range(n_ext)]
            inner_allowed = [{k - u for k in allowed_q if k >= u} for u in used]
            for S, stab in _summed_graphs(q, [cap_q - u for u in used], inner_allowed, L):
                edges = ext_edges + col_edges + [
                    ((n_ext + s, n_ext + t), k) for (s, t), k in zip(_pairs(q), S) if k]
                edges.sort()
                deg = ext_deg + used
                for (s, t), k in zip(_pairs(q), S):
                    deg[n_ext + s] += k
                    deg[n_ext + t] += k
                orders = tuple(None if shift[v] is None else deg[v] + shift[v]
                               for v in range(len(full)))
                out.append(((group_order // stab, len(ext_perms)), tuple(edges), orders))
    out.sort(key=lambda term: term[1])
    return tuple(out)


@lru_cache(maxsize=None)
def _pairs(V):
    """The vertex pairs ``u < v`` of ``V`` vertices, row by row (the multiplicity vectors' order)."""
    return tuple((u, v) for u in range(V) for v in range(u + 1, V))


def _pair_map(perm):
    """Position of the image pair ``{perm(u), perm(v)}`` for every pair of :func:`_pairs`."""
    pairs = _pairs(len(perm))
    index = {uv: i for i, uv in enumerate(pairs)}
    return tuple(index[tuple(sorted((perm[u], perm[v])))] for u, v in pairs)


def _image(mult, pmap):
    """The multiplicity vector of a relabelled multigraph (``pmap`` from :func:`_pair_map`)."""
    new = [0] * len(mult)
    for i, k in zip(pmap, mult):
        new[i] = k
    return tuple(new)


def _external_graphs(caps, perms):
    """``(E, degrees, A)``: the multigraphs among the externals smallest in their ``G``-orbit.

    ``E`` is a multiplicity vector over :func:`_pairs` within the degree caps,
    ``A`` its stabiliser in ``G`` (``perms``).  The allowed degrees are checked
    later, with the columns added.
    """
    n = len(caps)
    maps = [_pair_map(perm) for perm in perms]
    for mult in _enumerate(caps, [set(range(c + 1)) for c in caps]):
        images = [_image(mult, pm) for pm in maps]
        if min(images) < mult:
            continue
        deg = [0] * n
        for (u, v), k in zip(_pairs(n), mult):
            deg[u] += k
            deg[v] += k
        yield mult, deg, [perm for perm, im in zip(perms, images) if im == mult]


def _column_tuples(q, room, cap_q, E_deg, allowed, A):
    """``(cols, L)``: sorted column tuples of the summed vertices smallest under ``A``.

    A column ``c`` (multiplicities to the externals) has ``|c| ≤ cap_q``; the
    columns together use at most ``room[e]`` edges of external ``e``, and every
    external ends with an allowed degree.  ``L`` lists the permutations ``σ`` of
    the summed vertices of the stabiliser of ``(E, cols)`` in ``H``, one entry per
    element ``(a, σ)`` (so a ``σ`` may repeat).
    """
    n = len(room)
    candidates = [c for c in product(*[range(min(cap_q, r) + 1) for r in room])
                  if sum(c) <= cap_q]
    inverses = [tuple(sorted(range(n), key=perm.__getitem__)) for perm in A]
    chosen = []
    used = [0] * n

    def finish():
        cols = tuple(chosen)
        if any(E_deg[e] + used[e] not in allowed[e] for e in range(n)):
            return None
        keep = []
        for inv in inverses:
            image = sorted(tuple(c[inv[f]] for f in range(n)) for c in cols)
            image = tuple(image)
            if image < cols:
                return None
            if image == cols:
                keep.append(inv)
        return cols, _summed_permutations(cols, keep)

    def rec(start):
        if len(chosen) == q:
            hit = finish()
            if hit is not None:
                yield hit
            return
        for i in range(start, len(candidates)):
            c = candidates[i]
            if any(used[e] + c[e] > room[e] for e in range(n)):
                continue
            for e in range(n):
                used[e] += c[e]
            chosen.append(c)
            yield from rec(i)
            chosen.pop()
            for e in range(n):
                used[e] -= c[e]
    yield from rec(0)


def _summed_permutations(cols, inverses):
    """The ``σ`` with ``cols[σ(s)] = a·cols[s]``, for every ``a`` (given by its inverse) fixing ``cols``."""
    n = len(cols[0]) if cols else 0
    positions: dict = {}
    for s, c in enumerate(cols):
        positions.setdefault(c, []).append(s)
    out = []
    for inv in inverses:
        image = [tuple(c[inv[f]] for f in range(n)) for c in cols]
        sources: dict = {}
        for s, c in enumerate(image):
            sources.setdefault(c, []).append(s)
        keys = list(sources)
        for choice in product(*[permutations(positions[c]) for c in keys]):
            sigma = [0] * len(cols)
            for c, targets in zip(keys, choice):
                for s, t in zip(sources[c], targets):
                    sigma[s] = t
            out.append(tuple(sigma))
    return out


def _summed_graphs(q, caps, allowed, L):
    """``(S, |{l ∈ L : l·S = S}|)`` for the multigraphs among the summed vertices smallest under ``L``."""
    if q == 0:
        yield (), len(L)
        return
    maps = [_pair_map(sigma) for sigma in L]
    identity = all(sigma == tuple(range(q)) for sigma in L)
    for mult in _enumerate(caps, allowed):
        if identity:
            yield mult, len(L)
            continue
        stab = 0
        for pm in maps:
            image = _image(mult, pm)
            if image < mult:
                break
            stab += image == mult
        else:
            yield mult, stab

def _kind_terms_labelled(tf, roles, q):
    """:func:`kind_terms` by enumerating every labelled multigraph (the reference route).

    Every labelled multigraph is enumerated (:func:`_enumerate`) and
    canonicalised (:func:`_canonical`), then the classes are merged under the
    external permutations: the same orbits and sizes as :func:`kind_terms`, with
    another choice of representative, at the cost of the labelled count
    (134431 multigraphs for ``σ = z³ − 3z``, 1888184 for ``z² + z³/3``).
    Kept as the independent check of the orbit-wise generation (tests).

    Orbit representatives ``(((size, |G|), edges, orders), ...)`` of one kind at ``δ_c^q``.

    The orbits are those of the permutations of the summed vertices and of
    the external vertices of one role; the weight ``size/|G|`` is the orbit's
    size over the number of role-preserving permutations ``G`` of the
    external vertices, so that the
    kind is ``Σ_{π∈G} π(Σ weight · term)`` (the runtime symmetrises).
    """
    full = tuple(roles) + ("q",) * q
    caps, allowed, shift = _vertex_rules(tf, full)
    V = len(full)
    n_ext = len(roles)
    pairs = [(u, v) for u in range(V) for v in range(u + 1, V)]
    counts: dict = {}
    for mult in _enumerate(caps, allowed):
        deg = [0] * V
        for (u, v), k in zip(pairs, mult):
            deg[u] += k
            deg[v] += k
        orders = tuple(None if shift[v] is None else deg[v] + shift[v] for v in range(V))
        key = (_canonical(mult, pairs, n_ext, V, orders), orders)
        # the orders of the summed vertices follow their degrees: canonical edges fix them
        counts[key[0]] = counts.get(key[0], 0) + 1
    # external vertices of one role are interchangeable too (the kind is symmetric in
    # them): collect the orbits under both groups; the runtime symmetrises the sum
    ext_perms = _role_permutations(roles)
    merged: dict = {}
    for edges, count in counts.items():
        best = None
        for perm in ext_perms:
            relabel = {**{v: perm[v] for v in range(n_ext)}, **{v: v for v in range(n_ext, V)}}
            m = {(min(relabel[u], relabel[v]), max(relabel[u], relabel[v])): k
                 for (u, v), k in edges}
            mult = [m.get(pq, 0) for pq in pairs]
            deg = [0] * V
            for (u, v), k in m.items():
                deg[u] += k
                deg[v] += k
            orders = tuple(None if shift[v] is None else deg[v] + shift[v] for v in range(V))
            key = _canonical(mult, pairs, n_ext, V, orders)
            if best is None or key < best:
                best = key
        merged[best] = merged.get(best, 0) + count
    out = []
    for edges, count in sorted(merged.items()):
        deg = [0] * V
        for (u, v), k in edges:
            deg[u] += k
            deg[v] += k
        orders = tuple(None if shift[v] is None else deg[v] + shift[v] for v in range(V))
        out.append(((count, len(ext_perms)), edges, orders))
    return tuple(out)


def _role_permutations(roles):
    """Permutations of the external vertices that keep every vertex's role."""
    groups = {}
    for v, role in enumerate(roles):
        groups.setdefault(role, []).append(v)
    out = []
    for choice in product(*[permutations(g) for g in groups.values()]):
        perm = {}
        for g, images in zip(groups.values(), choice):
            perm.update(dict(zip(g, images)))
        out.append(tuple(perm[v] for v in range(len(roles))))
    return out


@lru_cache(maxsize=16)
def kind_plans(activation, teacher_activation=None):
    """``({kind: (roles, parts)}, top)`` for every kind of the diffusion (see the module docstring).

    ``parts`` is ``(((coefficient, power of Δ), q, terms), ...)`` over the
    powers ``q`` of the clean error; ``top`` is the largest vertex order or
    edge multiplicity (Hadamard powers and vertex functions needed).
    """
    activation = tuple(activation)
    teacher_activation = activation if teacher_activation is None else tuple(teacher_activation)
    return _plans(activation, teacher_activation, kind_terms)


def _plans(activation, teacher_activation, terms_of):
    """:func:`kind_plans` with the orbits of each kind from ``terms_of`` (:func:`kind_terms`
    or, in the tests, the labelled route :func:`_kind_terms_labelled`)."""
    tf = derive_tensor_form(activation, teacher_activation)
    plans = {}
    top = 1
    for name in used_kinds():
        nd, nx, ns = parse_kind(name)
        roles = ("d",) * nd + ("x",) * nx + ("s",) * ns
        r = nd + ns
        parts = []
        for t in range(0, r + 1, 2):
            terms = terms_of(tf, roles, r - t)
            if not terms:
                continue
            for _, edges, orders in terms:
                top = max([top] + [k for _, k in edges] + [j for j in orders if j is not None])
            parts.append(((comb(r, t) * _double_factorial(t - 1), t // 2), r - t, terms))
        plans[name] = (roles, tuple(parts))
    return plans, top
