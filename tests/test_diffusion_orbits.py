"""The orbit-wise multigraph generation of the tensor-route diffusion equals the labelled one.

:func:`symquad.symbolic.diffusion_tensor.kind_terms` generates one representative per
orbit of the multigraphs of a kind (under the permutations of the summed vertices and
of the external vertices of one role) with the orbit's size;
:func:`~symquad.symbolic.diffusion_tensor._kind_terms_labelled` enumerates every
labelled multigraph and canonicalises it.  Both are mapped to the labelled route's
canonical form (the smallest sorted edge list over the external permutations of
:func:`~symquad.symbolic.diffusion_tensor._canonical`), which must give the same orbits
with the same sizes; then the kinds evaluated from both plans must agree to rounding.
"""

from fractions import Fraction

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.kernels import _diffusion_tensor_module
from symquad.runtime import diffusion_engine as E
from symquad.symbolic import diffusion_tensor as dt
from symquad.symbolic.diffusion import parse_kind, used_kinds
from symquad.symbolic.tensor import derive_tensor_form

CUBIC = (0, -3, 0, 1)                       # z³ − 3z
MIXED = (0, 0, 1, Fraction(1, 3))           # z² + z³/3
SQUARE = (0, 0, 1)


def _labelled_canonical(tf, roles, q, edges):
    """The labelled route's representative of the orbit of ``edges`` (independent of labels)."""
    full = tuple(roles) + ("q",) * q
    V, n_ext = len(full), len(roles)
    _, _, shift = dt._vertex_rules(tf, full)
    pairs = [(u, v) for u in range(V) for v in range(u + 1, V)]
    best = None
    for perm in dt._role_permutations(roles):
        relabel = list(perm) + list(range(n_ext, V))
        m = {(min(relabel[u], relabel[v]), max(relabel[u], relabel[v])): k for (u, v), k in edges}
        deg = [0] * V
        for (u, v), k in m.items():
            deg[u] += k
            deg[v] += k
        orders = tuple(None if shift[v] is None else deg[v] + shift[v] for v in range(V))
        key = dt._canonical([m.get(uv, 0) for uv in pairs], pairs, n_ext, V, orders)
        best = key if best is None or key < best else best
    return best


def _orbits(tf, roles, q, terms):
    """``{canonical edges: (size, |G|)}``, asserting one representative per orbit."""
    out = {}
    for size, edges, orders in terms:
        key = _labelled_canonical(tf, roles, q, edges)
        assert key not in out, (roles, q, edges)
        out[key] = size
        # the orders follow the degrees (the representative is a consistent term)
        deg = {}
        for (u, v), k in edges:
            deg[u] = deg.get(u, 0) + k
            deg[v] = deg.get(v, 0) + k
        full = tuple(roles) + ("q",) * q
        _, allowed, shift = dt._vertex_rules(tf, full)
        for v, role in enumerate(full):
            assert deg.get(v, 0) in allowed[v], (roles, q, edges)
            assert orders[v] == (None if shift[v] is None else deg.get(v, 0) + shift[v])
    return out


def _compare(student, teacher, max_labelled_q, skip=()):
    tf = derive_tensor_form(student, teacher)
    checked = 0
    for name in used_kinds():
        nd, nx, ns = parse_kind(name)
        roles = ("d",) * nd + ("x",) * nx + ("s",) * ns
        for q in range(nd + ns, -1, -2):
            if q > max_labelled_q or (name, q) in skip:
                continue
            new = dt.kind_terms(tf, roles, q)
            ref = dt._kind_terms_labelled(tf, roles, q)
            assert _orbits(tf, roles, q, new) == _orbits(tf, roles, q, ref), (name, q)
            checked += 1
    return checked


@pytest.mark.parametrize("student,teacher,max_q,skip", [
    (CUBIC, CUBIC, 3, ()),
    (SQUARE, SQUARE, 4, ()),
    (SQUARE, CUBIC, 3, ()),
    (MIXED, MIXED, 2, (("M400", 2),)),
    ((0, 1, 1), (0, 0, 1), 4, ()),
])
def test_orbit_generation_equals_labelled_enumeration(student, teacher, max_q, skip):
    assert _compare(student, teacher, max_q, skip) >= 9


@pytest.mark.slow
@pytest.mark.parametrize("student,teacher,max_q", [(CUBIC, CUBIC, 4), (MIXED, MIXED, 3),
                                                   (CUBIC, SQUARE, 4)])
def test_orbit_generation_equals_labelled_enumeration_largest_kinds(student, teacher, max_q):
    assert _compare(student, teacher, max_q) >= 9


def test_known_orbit_counts():
    """The largest kind of ``z³ − 3z``: 127285 labelled multigraphs in 563 orbits (labelled route)."""
    tf = derive_tensor_form(CUBIC, CUBIC)
    terms = dt.kind_terms(tf, ("d",) * 4, 4)
    assert len(terms) == 563
    assert sum(size for (size, _), _, _ in terms) == 127285
    assert {group for (_, group), _, _ in terms} == {24}


def _check_kinds(activation, teacher, p, ps):
    """The kinds from the orbit-wise plan equal those from the labelled plan (to rounding)."""
    model = sq.Model(p, ps, 0.3, activation=activation, teacher_activation=teacher,
                     lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    kinds, top = dt._plans(model.activation, model.teacher_activation,
                           dt._kind_terms_labelled)
    assert top == plan["__top__"]
    labelled = {**plan, **kinds}
    assert {k for k in plan if not k.startswith("__")} == set(kinds)
    rng = np.random.default_rng(1)
    n = p + ps
    G = rng.standard_normal((n, n + 2))
    C = G @ G.T / (n + 2)
    a, b = rng.uniform(-1, 1, p), rng.uniform(0.3, 1.2, ps)
    names = tuple(kinds)
    new = E.tensor_kinds_reference(plan, C[:p, :p], C[:p, p:], C[p:, p:], a, b, 0.3, names)
    ref = E.tensor_kinds_reference(labelled, C[:p, :p], C[:p, p:], C[p:, p:], a, b, 0.3, names)
    for name in names:
        scale = np.max(np.abs(ref.arrays[name]))
        assert scale > 0, name
        assert np.max(np.abs(new.arrays[name] - ref.arrays[name])) <= 1e-13 * scale, name


def test_kinds_equal_from_labelled_plan():
    _check_kinds("z + z**2", "z**2", 3, 2)


@pytest.mark.slow
def test_kinds_equal_from_labelled_plan_cubic():
    _check_kinds("z**3 - 3*z", "z**3 - 3*z", 3, 2)


def test_pairwise_plan_equals_the_string_route(monkeypatch):
    """The set-based pairwise planner chooses the same steps as the former string route."""
    calls = []
    planner = E._pairwise_plan

    def spy(subscripts, core):
        calls.append((subscripts, core))
        return planner(subscripts, core)
    monkeypatch.setattr(E, "_pairwise_plan", spy)
    plans, top = dt.kind_plans(CUBIC)
    E._Program({**plans, "__top__": top}, tuple(plans), 3, 5)
    assert len(calls) > 1000
    for subscripts, core in calls[::4]:                 # every fourth: the test stays cheap
        assert planner(subscripts, core) == E._pairwise_plan_strings(subscripts, core)
