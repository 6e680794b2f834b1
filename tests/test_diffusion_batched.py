"""The class-batched tensor-route diffusion kinds equal the term-by-term reference.

:func:`symquad.runtime.diffusion_engine.tensor_kinds` contracts all multigraphs of one
edge set together (a term axis) through precomputed pairwise steps;
:func:`~symquad.runtime.diffusion_engine.tensor_kinds_reference` is the former route,
one ``einsum`` per multigraph.  Both sum the same terms in a different order, so they
agree to rounding: 1e-14 relative to the largest entry of each kind, on random
states, batched over replicas, and with the terms forced into chunks.
"""

import copy

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.kernels import _diffusion_tensor_module
from symquad.runtime import diffusion_engine as E

NAMES = ("M001", "M002", "M110", "M111", "M200", "M201", "M220", "M310", "M400")


def _states(p, ps, replicas, rng):
    n = p + ps
    G = rng.standard_normal((replicas, n, n + 2))
    C = G @ np.swapaxes(G, -1, -2) / (n + 2)
    a = rng.uniform(-1.0, 1.0, (replicas, p))
    return C[:, :p, :p], C[:, :p, p:], C[0, p:, p:], a, rng.uniform(0.3, 1.2, ps)


def _max_rel(x, y):
    out = 0.0
    for name in NAMES:
        scale = np.max(np.abs(y.arrays[name]))
        assert scale > 0, name
        out = max(out, float(np.max(np.abs(x.arrays[name] - y.arrays[name])) / scale))
    return out


def _check(model, replicas=3, seed=0):
    plan = _diffusion_tensor_module(model).PLAN
    rng = np.random.default_rng(seed)
    Q, rho, T, a, b = _states(model.p, model.p_star, replicas, rng)
    new = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    ref = E.tensor_kinds_reference(plan, Q, rho, T, a, b, 0.3, NAMES)
    assert _max_rel(new, ref) <= 1e-14
    # the replica axis is a batch axis: one vectorised call equals per-replica calls
    for r in range(replicas):
        one = E.tensor_kinds(plan, Q[r], rho[r], T, a[r], b, 0.3, NAMES)
        for name in NAMES:
            assert np.array_equal(one.arrays[name].shape, new.arrays[name][r].shape)
            scale = np.max(np.abs(new.arrays[name][r]))
            assert np.max(np.abs(one.arrays[name] - new.arrays[name][r])) <= 1e-14 * scale
    return plan, (Q, rho, T, a, b), ref


@pytest.mark.parametrize("activation,p,ps", [("z**2", 3, 2), ("z**2", 5, 1), ("z + z**2", 3, 2),
                                             ("z**3 - 3*z", 3, 2)])
def test_batched_kinds_equal_the_reference(activation, p, ps):
    _check(sq.Model(p, ps, 0.3, activation=activation, lr_readout=0.2))


def test_chunked_terms_equal_the_reference(monkeypatch):
    # the class route (the program switched off) with every class in chunks of terms
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_CHUNKS", {})
    monkeypatch.setattr(E, "USE_PROGRAM", False)
    monkeypatch.setattr(E, "MAX_INTERMEDIATE", 64)      # every class in chunks of terms
    plan, args, ref = _check(model, replicas=2, seed=3)
    assert any(chunk < nterms for chunk, nterms in E._CHUNKS.values())   # chunks were used
    assert _max_rel(E.tensor_kinds(plan, *args[:5], 0.3, NAMES), ref) <= 1e-14


def test_reference_check_has_power():
    # a wrong plan (one weight changed) is caught by the same comparison
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = dict(_diffusion_tensor_module(model).PLAN)
    roles, parts = plan["M400"]
    (noise, q, terms), *rest = parts
    (size, group), edges, orders = terms[0]
    plan["M400"] = (roles, ((noise, q, (((size + 1, group), edges, orders),) + terms[1:]),
                            *rest))
    rng = np.random.default_rng(1)
    Q, rho, T, a, b = _states(3, 2, 2, rng)
    wrong = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    right = E.tensor_kinds_reference(_diffusion_tensor_module(model).PLAN, Q, rho, T, a, b,
                                     0.3, NAMES)
    assert _max_rel(wrong, right) > 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("activation,teacher", [("z**2 + z**3/3", None),
                                                ("z**2", "z**3 - 3*z")])
def test_batched_kinds_equal_the_reference_mixed_degree(activation, teacher):
    model = sq.Model(3, 2, 0.3, activation=activation, lr_readout=0.2,
                     teacher_activation=teacher or activation)
    _check(model)


def test_program_shares_steps_and_equals_the_class_route(monkeypatch):
    # the straight-line program (one step per distinct sub-contraction) against the
    # class route (forced by a zero intermediate limit): same sum, fewer steps
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    prog = E._program(plan, NAMES, 3, 5)
    class_steps = sum(len(edges) + len(vertices) - 1 for name in NAMES
                      for _, _, _, classes in E._compiled(plan, name)
                      for _, edges, vertices, _, _, _ in classes)
    assert prog.n_steps < 0.5 * class_steps
    Q, rho, T, a, b = _states(3, 2, 2, np.random.default_rng(5))
    fast = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    monkeypatch.setattr(E, "USE_PROGRAM", False)
    classes = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    assert _max_rel(fast, classes) <= 1e-14


@pytest.mark.parametrize("vm_step,one_state", [(1, False), (10 ** 12, False), (2 ** 9, True)])
def test_program_paths_equal_the_reference(monkeypatch, vm_step, one_state):
    # every step as a numpy matrix product and every final in a stacked group, then
    # everything in the compiled interpreter, then a mix with the batch run one state
    # at a time: each path of _Executable against the term-by-term
    # reference, batched
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "_CHUNKS", {})
    monkeypatch.setattr(E, "VM_STEP", vm_step)
    plan = _diffusion_tensor_module(model).PLAN
    if one_state:           # room for one state's workspace: the replicas one at a time
        monkeypatch.setattr(E, "MAX_WORKSPACE", max(E._executable(plan, NAMES, 3, 5, b).size
                                                    for b in (1, 2)))
    sizes = []
    run = E._Executable.run
    monkeypatch.setattr(E._Executable, "run",
                        lambda self, *a: sizes.append(a[-1]) or run(self, *a))
    _check(model, replicas=2, seed=7)
    assert not E._CHUNKS                                # the program ran, not the classes
    assert set(sizes) == ({1} if one_state else {1, 2})   # batch chunks of one state
    exe = E._executable(plan, NAMES, 3, 5, 2)
    n_numpy = sum(1 for seg in exe.segments if seg[0] == "step")
    program = E._program(plan, NAMES, 3, 5)
    steps = program.n_steps
    # the steps that contract a letter of size > 1 (the others, outer and elementwise
    # products, stay in the interpreter at any VM_STEP)
    shapes = program.shapes()
    contracting = 0
    for op in program.ops:
        if op[0] == "step":
            xs, ys, zs = E._letters(op[1])
            dims = dict(zip(xs, shapes[op[2]][1]))
            dims.update(zip(ys, shapes[op[3]][1]))
            contracting += any(dims[c] > 1 for c in xs if c in ys and c not in zs)
    assert 0 < contracting < steps
    assert n_numpy == (contracting if vm_step == 1 else 0 if vm_step > 10 ** 9 else n_numpy)
    assert 0 < n_numpy < contracting or vm_step == 1 or vm_step > 10 ** 9
    assert bool(exe.groups) == (vm_step < 10 ** 9)
    # with groups, results written straight into the stacks (shared operands, lone
    # partners) and partners accumulated by their own steps, were checked
    assert all(exe.placed.values()) == (vm_step < 10 ** 9)
    # leaves gathered again in another order for an interpreter reader were used, and
    # interpreter results copied in another order (STEP_COPY)
    assert exe.leaf_copies > 0 or vm_step == 1
    assert exe.step_copies > 0
    # small matrix products ran in the register kernel (contraction_vm._axpy_rows)
    from symquad.runtime import contraction_vm
    kernels = [contraction_vm.kernel_of(row) for row in exe.code]
    assert kernels.count("rows") > 0 or vm_step == 1


@pytest.mark.parametrize("replicas", [1, 2])
def test_numpy_steps_on_prebuilt_views_equal_the_derived_ones(monkeypatch, replicas):
    # every step a numpy matrix product (VM_STEP = 1): those whose operands and result
    # are views of the workspace run as one matmul on views built once per buffer
    # (_Executable._step_views), and so do the group products (_group_views: the product
    # into a scratch array, added into the kind through a view in its order); the same
    # kinds, bit for bit, as when every step and group derives its views from the
    # subscripts again (_dot_into, _dot), and both equal the reference
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "VM_STEP", 1)
    monkeypatch.setattr(E, "_SPARE", [])
    plan = _diffusion_tensor_module(model).PLAN
    rng = np.random.default_rng(5)
    Q, rho, T, a, b = _states(3, 2, 2, rng)
    if replicas == 1:
        Q, rho, a = Q[0], rho[0], a[0]
    built, built_groups, batched = [], [], []
    step_views, group_views = E._Executable._step_views, E._Executable._group_views
    batched_views = E._batched_views
    monkeypatch.setattr(E, "_batched_views",
                        lambda *a: batched.append(batched_views(*a)) or batched[-1])
    monkeypatch.setattr(E._Executable, "_step_views",
                        lambda self, W, B: built.append(step_views(self, W, B)) or built[-1])
    monkeypatch.setattr(E._Executable, "_group_views",
                        lambda self, W, B: built_groups.append(group_views(self, W, B))
                        or built_groups[-1])
    fast = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    again = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    assert len(built) == len(built_groups) == 1     # built once, kept with the buffer
    n_steps = sum(1 for v in built[0] if v is not None)
    exe = E._executable(plan, NAMES, 3, 5, replicas)
    assert 0 < n_steps <= sum(1 for seg in exe.segments if seg[0] == "step")
    assert 0 < sum(1 for v in built_groups[0] if v is not None) <= len(exe.groups)
    # some steps whose operands are not views in the product's layout run batched over a
    # letter on views (_batched_views), compared below with the copies of _dot_into too
    assert 0 < sum(1 for v in batched if v is not None) < len(batched)
    monkeypatch.setattr(E._Executable, "_step_views",
                        lambda self, W, B: [None] * len(self.segments))
    monkeypatch.setattr(E._Executable, "_group_views",
                        lambda self, W, B: [None] * len(self.groups))
    monkeypatch.setattr(E, "_SPARE", [])
    derived = E.tensor_kinds(plan, Q, rho, T, a, b, 0.3, NAMES)
    ref = E.tensor_kinds_reference(plan, Q, rho, T, a, b, 0.3, NAMES)
    for name in NAMES:
        assert np.array_equal(fast.arrays[name], derived.arrays[name]), name
        assert np.array_equal(again.arrays[name], fast.arrays[name]), name
    assert _max_rel(fast, ref) <= 1e-14


def test_a_reused_workspace_buffer_keeps_few_views_and_none_stale(monkeypatch):
    # the views built on the workspace buffer are kept with it per (executable, batch
    # size); one buffer serving batches of 4, 2, 1, 3, 4, 3 states (three executables:
    # batch buckets 4, 2, 1) with MAX_VIEWS = 2: at most 2 pairs are kept (the oldest
    # dropped: a caller whose batch size changes would otherwise grow them without
    # bound), and a batch size seen again — its views kept or built again — gives the
    # same kinds, bit for bit, as the first time, and the reference's to rounding (the
    # second 4 finds bucket 4's views built for 3 states: keyed without the batch size,
    # the fourth state's kinds would be stale)
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "VM_STEP", 1)               # numpy steps: views to build
    monkeypatch.setattr(E, "_SPARE", [])
    monkeypatch.setattr(E, "MAX_VIEWS", 2, raising=False)
    plan = _diffusion_tensor_module(model).PLAN
    Q, rho, T, a, b = _states(3, 2, 4, np.random.default_rng(13))
    ref = E.tensor_kinds_reference(plan, Q, rho, T, a, b, 0.3, NAMES).arrays
    first, buffers = {}, set()
    for B in (4, 2, 1, 3, 4, 3):
        got = E.tensor_kinds(plan, Q[:B], rho[:B], T, a[:B], b, 0.3, NAMES)
        buf, views = E._SPARE[0]
        buffers.add(id(buf))
        assert len(views) <= 2, sorted(k[1] for k in views)
        if B in first:
            for name in NAMES:
                assert np.array_equal(got.arrays[name], first[B].arrays[name]), (B, name)
        else:
            first[B] = got
            for name in NAMES:                         # the states are independent
                want = ref[name][:B]
                assert np.max(np.abs(got.arrays[name] - want)) <= 1e-14 * np.max(
                    np.abs(want)), (B, name)
    assert len(buffers) == 1                           # one buffer served every call
    assert any(v is not None for entry in views.values() for v in entry[1])


def test_weights_at_a_new_noise_level_are_computed_again(monkeypatch):
    # the finals' weights times Δ^power are kept per value of Δ (_weights_at): a call at
    # another Δ must not reuse them (the noise's powers enter the kinds), a call at the
    # same Δ does
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    plan = _diffusion_tensor_module(model).PLAN
    Q, rho, T, a, b = _states(3, 2, 2, np.random.default_rng(9))
    for Delta in (0.3, 0.7, 0.3):
        got = E.tensor_kinds(plan, Q, rho, T, a, b, Delta, NAMES)
        ref = E.tensor_kinds_reference(plan, Q, rho, T, a, b, Delta, NAMES)
        assert _max_rel(got, ref) <= 1e-14
    exe = E._executable(plan, NAMES, 3, 5, 2)
    assert exe.powers.max() > 0                     # Δ enters some weights
    assert exe._weights_at(0.3) is exe._weights_at(0.3)
    assert np.array_equal(exe._weights_at(0.7), exe.weights * 0.7 ** exe.powers)


def test_group_products_over_ordered_pairs_equal_the_reference(monkeypatch):
    # every group whose two operands hold two externals of one role each, taken over the
    # ordered pairs a <= b, c <= d only (PAIR_MIN = 0; _pair_plan), against the
    # term-by-term reference, batched; the plans are used (M400, M220 have such groups)
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "VM_STEP", 1)
    monkeypatch.setattr(E, "PAIR_MIN", 0)
    _check(model, replicas=2, seed=11)
    exe = E._executable(_diffusion_tensor_module(model).PLAN, NAMES, 3, 5, 2)
    used = {g[0] for g, plan in zip(exe.groups, exe.pair_plans) if plan is not None}
    assert {"M400", "M220"} <= used
    # and without them the same groups are whole products (the default at small sizes)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "PAIR_MIN", 2 ** 62)
    assert not any(E._executable(_diffusion_tensor_module(model).PLAN, NAMES, 3, 5,
                                 2).pair_plans)


def test_finals_with_nested_external_axes_are_not_stacked(monkeypatch):
    # a final whose operand's external axes are all among the other's (`tab, tabcd`) is a
    # batch of (1 × t)(t × J) products: it runs as a weighted interpreter step into its
    # kind, never as a stacked group (_Executable._plan_groups; measured 1.2-2.7 GMAC/s
    # as groups at p = 16).  Every group allowed (VM_STEP = 1); the program has such
    # finals (else this would check nothing), and the kinds equal the reference.
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "VM_STEP", 1)
    plan = _diffusion_tensor_module(model).PLAN
    program = E._program(plan, NAMES, 3, 5)
    perms = {name: E._role_perms(roles) for name, roles in program.roles.items()}
    nested = 0
    for name, i, j, subs, *_ in program.finals:
        ext_x, ext_y = E._final_pattern(*E._letters(subs), perms[name])[0][:2]
        nested += set(ext_x) <= set(ext_y) or set(ext_y) <= set(ext_x)
    assert nested > 0
    exe = E._executable(plan, NAMES, 3, 5, 2)
    assert exe.groups
    for group in exe.groups:
        xs, ys, _ = E._letters(group[1])
        ex, ey = ({c for c in s if c in "abcdefgh"} for s in (xs, ys))
        assert not (ex <= ey or ey <= ex), group[1]
    _check(model, replicas=2, seed=13)


def test_steps_multiplied_into_their_finals_equal_the_reference(monkeypatch):
    # a step that sums nothing read by one interpreter final only is never written: the
    # final reads its two operands, K += ((x·y)·u)·w (_Executable._fuse_into_finals,
    # contraction_vm._inner3).  At p = 3 every such step is below FUSE_MIN: with the
    # threshold at 0 they are all fused; the kinds equal the term-by-term reference
    # (batched and per replica) and, to rounding, the kinds without fusion
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "FUSE_MIN", 0)
    _, state, _ = _check(model, replicas=2, seed=17)
    fused = E.tensor_kinds(plan, *state, 0.3, NAMES)
    exe = E._executable(plan, NAMES, 3, 5, 2)
    from symquad.runtime import contraction_vm
    three = sum(contraction_vm.kernel_of(row) == "three" for row in exe.code)
    assert exe.fused_finals > 10 and three == exe.fused_finals
    monkeypatch.setattr(E, "_EXECUTABLES", {})
    monkeypatch.setattr(E, "FUSE_MIN", 2 ** 62)
    assert E._executable(plan, NAMES, 3, 5, 2).fused_finals == 0
    assert _max_rel(fused, E.tensor_kinds(plan, *state, 0.3, NAMES)) <= 1e-14


@pytest.mark.parametrize("subscripts,shapes", [
    ("...tab,...tbc->...tac", ((2, 3, 4, 5), (2, 3, 5, 6))),
    ("...tabc,...tcdb->...tabcd", ((3, 2, 3, 4), (3, 4, 5, 3))),      # nothing contracted
    ("...ta,...tcdb->...abcd", ((3, 2), (3, 4, 5, 6))),               # the term axis summed
    ("...tqa,...tb->...tab", ((2, 7, 3), (2, 4))),                    # q of one operand only
    ("...tab,...tbc->...ca", ((2, 3, 4), (2, 4, 5))),
    ("...tab,...tbc->...tac", ((1, 2, 3, 4), (5, 2, 4, 6))),          # broadcast batch
])
def test_dot_equals_einsum(subscripts, shapes):
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(s) for s in shapes)
    want = np.einsum(subscripts, x, y)
    got = E._dot(subscripts, x, y)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))


def test_program_is_deterministic_and_its_kept_workspace_is_not_stale():
    # the executable keeps its workspace between calls: a call at another state in
    # between leaves the numbers of a repeated call bit for bit the same
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    rng = np.random.default_rng(11)
    one = _states(3, 2, 1, rng)
    other = _states(3, 2, 1, rng)
    first = E.tensor_kinds(plan, *one, 0.3, NAMES)
    kept = {name: first.arrays[name].copy() for name in NAMES}
    E.tensor_kinds(plan, *other, 0.3, NAMES)
    # the kinds returned are the caller's, not views of the kept workspace (one chunk
    # returns its arrays without a copy: _run_program)
    for name in NAMES:
        assert np.array_equal(first.arrays[name], kept[name]), name
    again = E.tensor_kinds(plan, *one, 0.3, NAMES)
    for name in NAMES:
        assert np.array_equal(first.arrays[name], again.arrays[name])
    assert _max_rel(first, E.tensor_kinds_reference(plan, *one, 0.3, NAMES)) <= 1e-14


def test_a_workspace_above_the_limit_takes_the_class_route(monkeypatch):
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    monkeypatch.setattr(E, "MAX_WORKSPACE", 16)
    monkeypatch.setattr(E, "_CHUNKS", {})
    args = _states(3, 2, 2, np.random.default_rng(12))
    got = E.tensor_kinds(plan, *args, 0.3, NAMES)
    assert E._CHUNKS                                    # the class route ran
    assert _max_rel(got, E.tensor_kinds_reference(plan, *args, 0.3, NAMES)) <= 1e-14


def test_a_vertex_joined_to_nothing_is_summed_first_against_the_smallest_operand():
    # 'te' (a summed vertex with no edge: one number per term) is paired first, with the
    # smallest other operand ('tb'), instead of last against the 4-index product
    subscripts = "...tca,...tb,...tcd,...te->...tabd"
    core = ((3, 5, 4), (3, 4), (3, 5, 4), (3, 6))
    plan = E._pairwise_plan(subscripts, core)
    steps = plan[0]
    assert steps[0][1] == "...te,...tb->...tb"
    assert plan == E._pairwise_plan_strings(subscripts, core)
    # the same contraction as einsum, and fewer multiply-adds than without the rule
    rng = np.random.default_rng(4)
    ops = [rng.standard_normal(s) for s in core]
    vals = list(ops)
    for positions, subs, _ in steps:
        args = [vals.pop(i) for i in positions]
        vals.append(np.einsum(subs, *args))
    want = np.einsum(subscripts, *ops)
    assert np.max(np.abs(vals[0] - want)) <= 1e-13 * np.max(np.abs(want))
    assert sum(f for _, _, f in steps) < 3 * 4 * 4 * 4 * 6


@pytest.mark.parametrize("roles", [("d", "d", "d", "d"), ("d", "x", "d", "d"), ("x", "x", "s"),
                                   ("d", "s", "x")])
def test_staged_symmetrisation_equals_the_sum_over_all_permutations(roles):
    # _symmetrise takes S_k as cosets of S_{k-1} (k(k-1)/2 transposed additions per role);
    # here the sum over every permutation of equal-role axes, written out, with a batch axis
    import itertools
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2,) + (4,) * len(roles))
    groups = {}
    for v, role in enumerate(roles):
        groups.setdefault(role, []).append(v)
    want, count = np.zeros_like(x), 0
    for perm in itertools.permutations(range(len(roles))):
        if all(roles[perm[v]] == roles[v] for v in range(len(roles))):
            want += np.transpose(x, (0,) + tuple(1 + v for v in perm))
            count += 1
    assert count == np.prod([float(np.prod(range(1, len(g) + 1))) for g in groups.values()])
    got = E._symmetrise(x, roles, 1)
    assert np.max(np.abs(got - want)) <= 1e-14 * np.max(np.abs(want))
    assert not np.shares_memory(got, x)


def _renamed(subscripts):
    # the test's own renaming: the letters other than the term axis t, in order of first
    # appearance, mapped onto a, b, c, … (str.translate instead of the engine's loop)
    seen = "".join(dict.fromkeys(c for c in subscripts if c.isalpha() and c != "t"))
    return subscripts.translate(str.maketrans(seen, "abcdefghijklmnopqrsuvwxyz"[:len(seen)]))


def test_program_names_steps_independently_of_their_letters(monkeypatch):
    # two classes that contract the same two nodes the same way under other letters
    # ("...tae,...te->...ta" and "...tce,...te->...tc": a summed vertex joined to
    # different externals) share one step: no two steps of the program are the same
    # contraction of the same inputs up to a renaming of letters
    assert E._step_name("...tcb,...tb->...tc") == E._step_name("...tae,...te->...ta") \
        == "...tab,...tb->...ta"
    assert E._step_name("...tab,...ta->...tb") != E._step_name("...tab,...tb->...ta")
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN

    def duplicates(prog):
        steps = [op for op in prog.ops if op[0] == "step"]
        return len(steps) - len({(_renamed(s), i, j) for _, s, i, j, _ in steps})
    monkeypatch.setattr(E, "_PROGRAMS", {})
    prog = E._program(plan, NAMES, 3, 5)
    assert duplicates(prog) == 0
    # power: named by their spelling, the same program repeats many steps
    monkeypatch.setattr(E, "_PROGRAMS", {})
    monkeypatch.setattr(E, "_step_name", lambda subscripts: subscripts)
    spelled = E._program(plan, NAMES, 3, 5)
    # (3444 steps against 1230; a repeated step makes its readers repeat too, so fewer
    # are duplicates of one level)
    assert duplicates(spelled) > 0 and spelled.n_steps > 2 * prog.n_steps


@pytest.mark.parametrize("kind", ["C", "s", "q"])
def test_a_leaf_outside_its_input_is_refused(kind):
    # the leaves' gather (contraction_vm.gather) checks no index: the executable checks
    # every leaf's sources lie in its own input (C^{∘m}/m! up to the plan's top order,
    # φ_j / wφ_j up to top + 1).  A leaf one order past its input read the next input's
    # entries (the sources still lay before the leaves' span, the former check): refused
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    plan = _diffusion_tensor_module(model).PLAN
    top = plan["__top__"]
    program = E._program(plan, NAMES, 3, 5)
    E._Executable(program, top, 1)                     # as built: accepted
    k, spec = next((k, op[1]) for k, op in enumerate(program.ops)
                   if op[0] == "leaf" and op[1][0] == kind)
    past = (top + 1) if kind == "C" else (top + 2)       # one order past the input
    bad = (kind, (past,) * len(spec[1])) + tuple(spec[2:])
    wrong = copy.copy(program)
    wrong.ops = list(program.ops)
    wrong.ops[k] = ("leaf", bad)
    with pytest.raises(AssertionError, match="outside its input"):
        E._Executable(wrong, top, 1)


@pytest.mark.parametrize("subscripts, xs, ys, nbatch", [
    # x's own letters c, a lie as a, c in x: the product batched over t and a
    ("...teac,...tde->...tcad", (2, 5, 4, 3), (2, 3, 5), 2 * 4),
    # the shared letters c, d not adjacent in x: kept as separate batch axes t, c, d
    ("...tcbde,...tcde->...tcdb", (2, 3, 4, 3, 5), (2, 3, 3, 5), 2 * 3 * 3),
    # y's own letters b, d lie as d, b in y: batched over b (over d, the smaller, z's
    # matrix (a, b) would have no unit-stride axis)
    ("...tag,...tdbg->...tabd", (2, 4, 5), (2, 3, 6, 5), 2 * 6),
    # two letters summed, x's own letters a, c lie as c, a: batched over c
    ("...tcahg,...thgd->...tacd", (2, 3, 4, 5, 6), (2, 5, 6, 3), 2 * 3),
])
def test_batched_views_are_views_of_the_workspace_and_equal_einsum(subscripts, xs, ys,
                                                                   nbatch):
    # numpy steps whose operands are not views in matmul's (S, I, K)(S, K, J) layout
    # (_matmul_operands copies one) run batched over letters on views of the arrays as
    # they lie (_batched_views): written through Z into the workspace, equal to einsum
    xl, yl, zl = E._letters(subscripts)
    dims = dict(zip(xl, xs))
    dims.update(zip(yl, ys))
    zs = tuple(dims[c] for c in zl)
    sizes = [int(np.prod(s)) for s in (xs, ys, zs)]
    W = np.zeros((1, sum(sizes)))
    rng = np.random.default_rng(3)
    W[:, :sizes[0] + sizes[1]] = rng.standard_normal(sizes[0] + sizes[1])
    x = W[:, :sizes[0]].reshape((1,) + xs)
    y = W[:, sizes[0]:sizes[0] + sizes[1]].reshape((1,) + ys)
    z = W[:, sizes[0] + sizes[1]:].reshape((1,) + zs)
    X, Y, _, _, _, _ = E._matmul_operands(subscripts, x, y)
    Z = z.reshape((1,) + (-1,))
    assert not (np.may_share_memory(X, W) and np.may_share_memory(Y, W))
    views = E._batched_views(subscripts, x, y, z)
    assert views is not None
    X, Y, Z = views
    assert all(np.may_share_memory(v, W) for v in views)
    assert int(np.prod(Z.shape[:-2])) == nbatch
    np.matmul(X, Y, out=Z)
    want = np.einsum(subscripts, x, y)
    assert np.abs(z - want).max() <= 1e-14 * np.abs(want).max()


def test_batched_views_refuse_what_needs_a_copy_or_a_sum():
    W = np.zeros((1, 10000))
    x = W[:, :2 * 4 * 5].reshape(1, 2, 4, 5)
    y = W[:, 100:100 + 2 * 5 * 6 * 3].reshape(1, 2, 5, 6, 3)
    # no one letter moved leaves three matrices BLAS takes (b: z's (a, c) has no
    # unit-stride axis; c: y's (e, b) has none; a: y's (e, c b) is not one axis): a copy
    # stays with _dot_into.  (Two letters are not moved — a speed rule, (1 × e)(e × c)
    # products, measured slower than the copy — which no value can show.)
    z = W[:, 1000:1000 + 2 * 4 * 3 * 6].reshape(1, 2, 4, 3, 6)
    assert E._batched_views("...tae,...tebc->...tacb", x, y, z) is None
    # a letter of y summed alone (not in x nor z) needs a sum first
    z2 = W[:, 1000:1000 + 2 * 4 * 3].reshape(1, 2, 4, 3)
    assert E._batched_views("...tae,...tebc->...tac", x, y, z2) is None

