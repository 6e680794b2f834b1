"""The assembly's mixed terms read in place (diffusion_engine.kind_sum) against other routes.

``kind_sum`` adds ``Σ_t X_t ∘ (r_t c_t)`` into a block, ``X_t`` a moment kind read at the
block's row and column units.  With a :class:`KindArrays` source it reads each kind from its
whole array by a compiled loop (assembly_vm.kind_term); these tests compare that with
(a) an explicit double loop over the block's entries (numpy fancy indexing of the kinds,
sums in float64; the independent route, to 1e-13), and (b) the gathers and
``mixed_sum`` it replaces (the same bits), and check that the compiled loop did run.
The rest of the assembly: ``outer_sum`` against the explicit sum of outer products (and
the former concatenation, bit for bit), ``assemble`` against ``½(D + Dᵀ)`` of the full
matrix of blocks (bit for bit), and ``Kernels.diffusion`` keeping its function.
"""

import numpy as np
import pytest

import symquad as sq
from symquad._generated import diffusion_assembly as assembly
from symquad.numeric.kernels import _diffusion_tensor_module, _params
from symquad.runtime import assembly_vm
from symquad.runtime import diffusion_engine as E


def _kinds(p, ps, rng):
    """Random kind arrays of the shapes the blocks read: students p, fields n = p + ps."""
    n = p + ps
    return E.KindArrays({"M220": rng.standard_normal((p, p, n, n)),
                         "M310": rng.standard_normal((p, p, p, n)),
                         "M400": rng.standard_normal((p, p, p, p))})


def _terms(u, R, C, rng):
    """Reads at mixed units (students, a teacher field) and terms of every factor shape."""
    reads = (("M400", u["K"], u["L"], u["k"], u["l"]), ("M220", u["K"], u["l"], u["L"], u["k"]),
             ("M310", u["L"], u["k"], u["l"], u["K"]), ("M220", u["L"], u["k"], u["K"], u["l"]),
             ("M310", u["K"], u["L"], u["k"], u["l"]))
    terms = ((0, rng.standard_normal((R, 1)), rng.standard_normal((1, C))),
             (1, 0.7, rng.standard_normal((1, C))),
             (2, rng.standard_normal((R, 1)), 1),
             (4, -rng.standard_normal((R, 1)), rng.standard_normal((1, C))),
             (3, np.float64(1.3), -0.4))
    return reads, terms


def _explicit(kinds, reads, terms, R, C):
    """``Σ_t X_t[i, j] r_t[i] c_t[j]`` entry by entry (fancy indexing, one entry at a time)."""
    out = np.zeros((R, C))
    for t, r, c in terms:
        name, *idx = reads[t]
        r, c = np.broadcast_to(r, (R, 1)), np.broadcast_to(c, (1, C))
        for i in range(R):
            for j in range(C):
                at = tuple(int(np.broadcast_to(x, (R, C))[i, j]) for x in idx)
                out[i, j] += kinds.arrays[name][at] * r[i, 0] * c[0, j]
    return out


@pytest.fixture
def calls(monkeypatch):
    """How many times the compiled loop ran (a spy on assembly_vm.kind_term)."""
    count = []
    real = assembly_vm.kind_term

    def spy(*args):
        count.append(args[-1])
        return real(*args)
    monkeypatch.setattr(assembly_vm, "kind_term", spy)
    return count


@pytest.mark.parametrize("p", [1, 3, 5])
def test_kind_sum_equals_the_explicit_sum_and_the_gathered_route(p, calls):
    rng = np.random.default_rng(p)
    u = E.block_units("Q", "Q", p, 2)
    R, C = u["shape"]
    kinds = _kinds(p, 2, rng)
    reads, terms = _terms(u, R, C, rng)
    start = rng.standard_normal((R, C))
    got = E.kind_sum(start.copy(), kinds, reads, terms)
    assert calls == [0, 1, 1, 1, 2]              # the compiled loop, every term, in order
    want = start + _explicit(kinds, reads, terms, R, C)
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))
    # the route it replaces: a plain callable source takes the gathers and mixed_sum
    gathered = E.kind_sum(start.copy(), lambda name, *idx: kinds(name, *idx), reads, terms)
    assert len(calls) == 5
    assert np.array_equal(got, gathered)
    one = E.kind_sum(start.copy(), kinds, reads, terms[:1])
    assert calls[-1] == assembly_vm.ONLY
    assert np.array_equal(one, start + E.mixed_sum(((kinds(*reads[0]),) + terms[0][1:],),
                                                   (R, C)))


def test_kind_sum_with_a_shared_read_takes_the_gathered_route(calls):
    rng = np.random.default_rng(11)
    u = E.block_units("Q", "Q", 3, 2)
    R, C = u["shape"]
    kinds = _kinds(3, 2, rng)
    reads, terms = _terms(u, R, C, rng)
    terms = terms + ((0, rng.standard_normal((R, 1)), rng.standard_normal((1, C))),)
    got = E.kind_sum(np.zeros((R, C)), kinds, reads, terms)
    assert calls == []
    want = _explicit(kinds, reads, terms, R, C)
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))


def test_kind_sum_with_a_batch_takes_the_gathered_route(calls):
    rng = np.random.default_rng(7)
    p = 3
    u = E.block_units("Q", "rho", p, 2)
    R, C = u["shape"]
    single = [_kinds(p, 2, rng) for _ in range(2)]
    batched = E.KindArrays({k: np.stack([s.arrays[k] for s in single]) for k in single[0].arrays})
    reads = (("M220", u["K"], u["k"], u["l"], u["tM"]), ("M310", u["K"], u["k"], u["l"], u["tM"]))
    terms = ((0, rng.standard_normal((2, R, 1)), rng.standard_normal((2, 1, C))),
             (1, rng.standard_normal((2, R, 1)), 0.5))
    got = E.kind_sum(np.zeros((2, R, C)), batched, reads, terms)
    assert calls == []
    for b in range(2):
        each = tuple((t, r[b], c if np.ndim(c) == 0 else c[b]) for t, r, c in terms)
        want = _explicit(single[b], reads, each, R, C)
        assert np.max(np.abs(got[b] - want)) <= 1e-13 * np.max(np.abs(want))


@pytest.mark.parametrize("constraint", ["none", "sphere"])
def test_generated_assembly_reads_kinds_in_place_with_the_gathered_routes_bits(constraint,
                                                                               calls):
    model = sq.Model(3, 2, 0.3, activation="z**3 - 3*z", lr_readout=0.2, noise=0.1,
                     constraint=constraint)
    rng = np.random.default_rng(3)
    G = rng.standard_normal((5, 7)) / np.sqrt(7)
    Cov = G @ G.T
    Q, rho, T = Cov[:3, :3], Cov[:3, 3:], Cov[3:, 3:]
    a, b = rng.uniform(0.5, 1.5, 3) / 3, np.ones(2)
    names = assembly.KINDS[(constraint, True)]
    kinds = _diffusion_tensor_module(model).kinds(Q, rho, T, a, b, model.noise, names)
    fn = assembly.DIFFUSION[constraint]
    D = fn(Q, rho, a, kinds, _params(model), True, ())
    assert len(calls) > 0
    plain = fn(Q, rho, a, lambda name, *idx: kinds(name, *idx), _params(model), True, ())
    assert np.array_equal(D, plain)


# ---- the rest of the assembly: outer products, the blocks into D, the function kept -----

@pytest.mark.parametrize("batch", [(), (2,)])
def test_outer_sum_is_the_matrix_product_of_the_stacked_factors(batch):
    rng = np.random.default_rng(5)
    R, C = 7, 5
    rows = [rng.standard_normal(batch + (R, 1)), 0.5, rng.standard_normal((R, 1)), 2]
    cols = [rng.standard_normal(batch + (1, C)), rng.standard_normal((1, C)), -1.5, 0.25]
    got = E.outer_sum(rows, cols, batch + (R, C))
    want = sum(np.broadcast_to(r, batch + (R, 1)) * np.broadcast_to(c, batch + (1, C))
               for r, c in zip(rows, cols))
    assert got.shape == batch + (R, C)
    assert np.max(np.abs(got - want)) <= 1e-14 * np.max(np.abs(want))
    # the former construction (concatenated broadcast views, one matmul): the same bits
    left = np.concatenate([np.broadcast_to(r, batch + (R, 1)) for r in rows], axis=-1)
    right = np.concatenate([np.broadcast_to(c, batch + (1, C)) for c in cols], axis=-2)
    assert np.array_equal(got, np.matmul(left, right))


@pytest.mark.parametrize("batch, trained", [((), True), ((3,), True), ((), False)])
def test_assemble_places_the_blocks_and_symmetrises_the_diagonal_ones(batch, trained):
    rng = np.random.default_rng(6)
    p, ps = 3, 2
    n = {"Q": 6, "rho": 6, "a": 3}
    blocks = {(x, y): rng.standard_normal(batch + (n[x], n[y])) for x, y in E.BLOCK_PAIRS}
    D = E.assemble(blocks, p, ps, trained, batch)
    names = ("Q", "rho", "a") if trained else ("Q", "rho")
    # independently: the full matrix of blocks and transposes, symmetrised as a whole
    grid = [[blocks[(x, y)] if (x, y) in blocks else np.swapaxes(blocks[(y, x)], -1, -2)
             for y in names] for x in names]
    full = np.concatenate([np.concatenate(row, axis=-1) for row in grid], axis=-2)
    assert np.array_equal(D, 0.5 * (full + np.swapaxes(full, -1, -2)))
    assert np.array_equal(D, np.swapaxes(D, -1, -2))


def test_kernels_make_their_diffusion_function_once(monkeypatch):
    from symquad.numeric import kernels as kmod
    model = sq.Model(2, 1, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
    k = sq.kernels(model, "tensor")
    made = []
    original = kmod._diffusion_function

    def counting(*args, **kwargs):
        made.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(kmod, "_diffusion_function", counting)
    Q, rho, T = np.eye(2), np.full((2, 1), 0.1), np.eye(1)
    first = k.diffusion(Q, rho, T, np.ones(2))
    second = k.diffusion(Q, rho, T, np.full(2, 0.5))
    assert len(made) == 1
    # the kept function still reads its arguments: another readout, another D
    assert not np.allclose(first, second)
    assert np.array_equal(second, original(model, "tensor")(Q, rho, T, np.full(2, 0.5),
                                                            k.params_at()))


def test_the_sphere_pair_keeps_its_own_function(monkeypatch):
    # _diffusion_pair(both=True) returns (D, D^u): a function of its own, kept beside
    # diffusion()'s (which returns D alone), each made once
    from symquad.numeric import kernels as kmod
    model = sq.Model(2, 1, 0.3, activation="z**3 - 3*z", constraint="sphere")
    k = sq.kernels(model, "tensor")
    made = []
    original = kmod._diffusion_function

    def counting(*args, **kwargs):
        made.append(kwargs.get("both", False))
        return original(*args, **kwargs)
    monkeypatch.setattr(kmod, "_diffusion_function", counting)
    Q, rho, T = np.eye(2), np.full((2, 1), 0.1), np.eye(1)
    for _ in range(2):
        D, Du = k._diffusion_pair(Q, rho, T, both=True)
        D1 = k.diffusion(Q, rho, T)
    assert sorted(made) == [False, True]
    assert np.array_equal(D, D1)
    assert not np.allclose(D, Du)           # the sphere's projection: another matrix
    assert np.array_equal(Du, original(model, "tensor", both=True)(
        *k._arrays(Q, rho, T, None), k.params_at())[1])


@pytest.mark.parametrize("units", [("K", "L", "K", "L"), ("k", "l", "k", "l")])
def test_kind_sum_reads_not_of_the_blocks_shape_take_the_gathered_route(units, calls):
    # index arrays that broadcast to (1, C) or (R, 1) (a read at column or row units only)
    # or to another block's shape: the compiled loop, which reads its offsets
    # unchecked at every (i, j), must not take them (it read past the offsets' end: a
    # segfault or garbage); the gathered route broadcasts them
    rng = np.random.default_rng(13)
    p, ps = 3, 2
    u = E.block_units("Q", "Q", p, ps)
    R, C = u["shape"]
    kinds = _kinds(p, ps, rng)
    reads = (("M400",) + tuple(u[x] for x in units),)
    terms = ((0, rng.standard_normal((R, 1)), rng.standard_normal((1, C))),)
    assert E._in_place_terms(np.zeros((R, C)), kinds, reads, terms) is None
    got = E.kind_sum(np.zeros((R, C)), kinds, reads, terms)
    assert calls == []
    want = _explicit(kinds, reads, terms, R, C)
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))
    # the units of another pair's block: refused by the gathered route, not read past its end
    w = E.block_units("Q", "a", p, ps)                  # (6, 3) against the (6, 6) block
    wide = (("M400", w["K"], w["k"], w["l"], w["K"]),)
    with pytest.raises(ValueError):
        E.kind_sum(np.zeros((R, C)), kinds, wide, terms)
