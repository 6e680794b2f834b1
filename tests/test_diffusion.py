"""The diffusion matrix D = Cov[per-sample increments]/b against independent routes.

* the matrix route (σ = c z²) and the tensor route (any polynomial) against the
  entry route (explicit network, Wick's theorem entry by entry) at (p, p*) <= (3, 2),
  every field of the model specification: equal to 1e-12 relative;
* a Monte Carlo of N-dimensional one-step SGD increments (tests/diffusion_mc.py,
  numpy from the definitions) at p = 8 (σ = z²) and p = 3 (z³ − 3z), precision
  asserted first; the check fails for a wrong batch size;
* the hand formula ``rho_diffusion`` (ρ = 0, Q = qI) at p = 64, where σ = z² runs.
"""

import numpy as np
import pytest

import symquad as sq
from conftest import random_overlaps
from diffusion_mc import covariance_with_errors, increments
from symquad.numeric.layout import StateLayout, state_layout


def _point(model, rng, scale=1.0):
    Q, rho, T = random_overlaps(model.p, model.p_star, rng, scale=scale)
    if model.constraint == "sphere":
        d = np.sqrt(np.diag(Q))
        Q, rho = Q / d[:, None] / d[None, :], rho / d[:, None]
    # a trained readout near the default 1/p: the sphere's renormalisation is nonlinear in
    # the step, and with large steps the N-dimensional MC needs N >> 10^4 to reach D
    a = rng.uniform(0.5, 1.5, model.p) / model.p if model.readout_trained else None
    return Q, rho, T, a


def assert_routes_agree(model, form, reference="entries", points=2, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(points):
        Q, rho, T, a = _point(model, rng)
        D = sq.kernels(model, form).diffusion(Q, rho, T, a)
        ref = sq.kernels(model, reference).diffusion(Q, rho, T, a)
        scale = np.max(np.abs(ref))
        assert scale > 1e-4
        assert np.max(np.abs(D - ref)) <= 1e-12 * scale, (model, form)


FIELD_MODELS = [
    sq.Model(1, 1, 0.3),
    sq.Model(2, 1, 0.3, noise=0.5),
    sq.Model(2, 2, 0.4, noise=0.3, batch_size=3, weight_decay=0.1),
    sq.Model(2, 1, 0.3, activation="2*z**2 - 1", readout=(0.4, 0.9), teacher_readout=0.7),
    sq.Model(2, 1, 0.3, lr_readout=0.2),
    sq.Model(2, 1, 0.3, constraint="sphere", lr_readout=0.3, weight_decay=0.1, noise=0.2),
]


@pytest.mark.parametrize("model", FIELD_MODELS, ids=repr)
def test_matrix_route_equals_entry_route(model):
    assert_routes_agree(model, "matrix")


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    sq.Model(3, 2, 0.3, noise=0.4),
    sq.Model(3, 2, 0.3, noise=0.4, batch_size=2, constraint="sphere"),
    sq.Model(3, 1, 0.2, lr_readout=0.3, activation="z**2/2 + 1", teacher_activation="3*z**2"),
], ids=repr)
def test_matrix_route_equals_entry_route_at_3_2(model):
    assert_routes_agree(model, "matrix")


@pytest.mark.parametrize("model", [
    sq.Model(2, 1, 0.3, noise=0.5, activation="z + z**2"),
    sq.Model(2, 1, 0.3, noise=0.5, activation="z**3 - 3*z"),
    sq.Model(2, 1, 0.3, noise=0.5, activation="z**3 - 3*z", lr_readout=0.3, batch_size=2),
], ids=repr)
def test_tensor_route_equals_entry_route(model):
    assert_routes_agree(model, "tensor", points=1)


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    sq.Model(2, 2, 0.3, noise=0.5, activation="z**3", constraint="sphere"),
    sq.Model(3, 2, 0.2, noise=0.2, activation="z + z**2", weight_decay=0.1),
    sq.Model(2, 1, 0.2, activation="z**2", teacher_activation="z**3 - 3*z", lr_readout=0.2),
], ids=repr)
def test_tensor_route_equals_entry_route_slow(model):
    assert_routes_agree(model, "tensor", points=1)


@pytest.mark.parametrize("model", [sq.Model(4, 2, 0.3, noise=0.3),
                                   sq.Model(3, 3, 0.3, constraint="sphere", lr_readout=0.1,
                                            batch_size=2)], ids=repr)
def test_tensor_route_equals_matrix_route_beyond_the_entry_route(model):
    assert_routes_agree(model, "tensor", reference="matrix", points=1)


# ---- Monte Carlo of N-dimensional one-step increments -------------------------------

def mc_check(model, n, seed, N=1000, precision=0.08, compare_with=None, scale=1.0):
    """Max |Cov_MC − D| in standard errors, after asserting the MC resolves D."""
    rng = np.random.default_rng(seed)
    Q, rho, T, a = _point(model, rng, scale)
    F = increments(model, Q, rho, T, n, rng, N=N, a=a)
    cov, se = covariance_with_errors(F)
    D = sq.kernels(compare_with or model).diffusion(Q, rho, T, a)
    scale = np.max(np.abs(D))
    assert np.max(se) < precision * scale, f"MC too imprecise: {np.max(se) / scale:.3f}"
    # entries that vanish identically (Q_kk on the sphere) have no spread in the MC
    flat = se < 1e-9 * scale
    assert np.all(np.abs(D[flat]) < 1e-9 * scale) and np.all(np.abs(cov[flat]) < 1e-9 * scale)
    z = np.abs(cov - D)[~flat] / se[~flat]
    return float(np.max(z))


@pytest.mark.parametrize("model", [sq.Model(8, 2, 0.3, noise=0.3)], ids=repr)
def test_diffusion_matches_monte_carlo_at_p8(model):
    # 1378 entries: the max of |z| over them stays below 5 with probability ~0.999
    assert mc_check(model, n=100_000, seed=11) < 5


def test_monte_carlo_check_has_power():
    """The same Monte Carlo against D of a batch size 2 (the η² part and 1/b) fails."""
    model = sq.Model(8, 2, 0.3, noise=0.3)
    assert mc_check(model, n=100_000, seed=11, compare_with=model.replace(batch_size=2)) > 10


@pytest.mark.parametrize("model, n, scale", [
    (sq.Model(4, 2, 0.3, noise=0.3, lr_readout=0.5, constraint="sphere"), 60_000, 1.0),
    (sq.Model(3, 2, 0.2, noise=0.3, activation="z + z**2", batch_size=2, weight_decay=0.2),
     100_000, 1.0),
], ids=repr)
def test_diffusion_matches_monte_carlo_every_field(model, n, scale):
    assert mc_check(model, n=n, seed=12, precision=0.1, scale=scale) < 5


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    sq.Model(8, 2, 0.3, noise=0.3, batch_size=3, weight_decay=0.2),
    sq.Model(8, 2, 0.2, constraint="sphere", lr_readout=0.3),
], ids=repr)
def test_diffusion_matches_monte_carlo_large(model):
    assert mc_check(model, n=400_000, seed=13, N=4000, precision=0.05) < 5


@pytest.mark.slow
def test_diffusion_matches_monte_carlo_hermite():
    # z³ − 3z: the covariances are of degree-20 polynomials (heavy tails); 3·10⁶ draws of
    # this seed's stream left the largest standard error at 0.104 of max |D|, above the
    # check's own precision bar (measured 6 December 2026: 0.081 with 4·10⁶, max z 3.9)
    model = sq.Model(2, 1, 0.05, noise=0.3, activation="z**3 - 3*z", batch_size=2,
                     weight_decay=0.2)
    assert mc_check(model, n=4_000_000, seed=14, precision=0.1, scale=0.5) < 5


# ---- wide networks, the hand formula, structure -------------------------------------

@pytest.mark.parametrize("p, dim", [
    (48, 1272),
    pytest.param(64, 2208, marks=pytest.mark.slow),
])
def test_quadratic_diffusion_runs_at_p64_and_matches_the_plateau_formula(p, dim):
    """At ρ = 0, Q = qI the ρ block is diagonal with the hand formula rho_diffusion.

    p = 64 (a state of 2208 entries; one D there costs ~4 s of CPU on the shared 2-core
    machine) with ``-m slow``; the default run at p = 48 (0.7 s per D) makes the same
    checks on a state of 1272 entries, still a width where the kernels run their products
    on one BLAS thread (p + p* >= BLAS_LIMIT_FIELDS = 48).
    """
    from symquad.numeric.kernels import BLAS_LIMIT_FIELDS
    from symquad.numeric.landscape import rho_diffusion
    model = sq.Model(p, 2, 0.5, noise=0.2)
    assert p + 2 >= BLAS_LIMIT_FIELDS
    q = 0.8
    D = sq.kernels(model).diffusion(q * np.eye(p), np.zeros((p, 2)), np.eye(2))
    lay = state_layout(model)
    assert D.shape == (lay.dim, lay.dim) == (dim, dim)
    block = D[lay.slices()["rho"], lay.slices()["rho"]]
    expected = rho_diffusion(model, q)
    assert expected > 0
    np.testing.assert_allclose(np.diag(block), expected, rtol=1e-12)
    assert np.max(np.abs(block - np.diag(np.diag(block)))) <= 1e-12 * expected
    # the ρ–Q cross covariance vanishes there (odd in ν)
    assert np.max(np.abs(D[lay.slices()["Q"], lay.slices()["rho"]])) <= 1e-12 * np.max(np.abs(D))
    # at a generic point of this width: symmetric, positive semi-definite
    Q, rho, T = random_overlaps(p, 2, np.random.default_rng(3), scale=0.5)
    D = sq.kernels(model).diffusion(Q, rho, T)
    assert np.array_equal(D, D.T)
    assert np.linalg.eigvalsh(D).min() >= -1e-10 * np.abs(D).max()


def test_quadratic_diffusion_is_permutation_equivariant():
    model = sq.Model(12, 2, 0.2, noise=0.1)
    rng = np.random.default_rng(3)
    Q, rho, T = random_overlaps(12, 2, rng, scale=0.5)
    k = sq.kernels(model)
    D = k.diffusion(Q, rho, T)
    # relabelling the student units permutes the state
    perm = rng.permutation(12)
    Dp = k.diffusion(Q[np.ix_(perm, perm)], rho[perm], T)
    lay = state_layout(model)
    where = {name: i for i, name in enumerate(lay.names)}
    index = []
    for block, i, j in lay.entries:
        if block == "Q":
            a, b = sorted((perm[i], perm[j]))
            index.append(where[f"Q_{a + 1}_{b + 1}"])
        else:
            index.append(where[f"rho_{perm[i] + 1}_{j + 1}"])
    index = np.array(index)
    np.testing.assert_allclose(Dp, D[np.ix_(index, index)], rtol=1e-10,
                               atol=1e-12 * np.abs(D).max())


def test_batched_diffusion_equals_single_calls():
    model = sq.Model(3, 2, 0.3, noise=0.2, lr_readout=0.2)
    rng = np.random.default_rng(4)
    pts = [_point(model, rng) for _ in range(3)]
    Q, rho, T, a = (np.stack(x) for x in zip(*pts))
    for form in ("matrix", "tensor"):
        k = sq.kernels(model, form)
        Db = k.diffusion(Q, rho, T, a)
        for i in range(3):
            np.testing.assert_allclose(Db[i], k.diffusion(Q[i], rho[i], T[i], a[i]),
                                       rtol=1e-13, atol=1e-15)


def test_diffusion_is_positive_semidefinite_at_random_points():
    for model in (sq.Model(4, 3, 0.4, noise=0.1), sq.Model(3, 2, 0.2, activation="z**3 - 3*z")):
        k = sq.kernels(model)
        rng = np.random.default_rng(5)
        for _ in range(3):
            D = k.diffusion(*random_overlaps(model.p, model.p_star, rng))
            assert np.linalg.eigvalsh(D).min() >= -1e-10 * np.abs(D).max()


def test_state_layout_packs_and_unpacks():
    lay = StateLayout(3, 2, True)
    assert lay.dim == 6 + 6 + 3
    assert lay.names[:4] == ("Q_1_1", "Q_1_2", "Q_1_3", "Q_2_2")
    assert lay.names[6:8] == ("rho_1_1", "rho_1_2") and lay.names[-1] == "a_3"
    rng = np.random.default_rng(0)
    A = rng.standard_normal((5, 3, 3))
    Q = A + np.swapaxes(A, 1, 2)
    rho, a = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3))
    x = lay.pack(Q, rho, a)
    assert x.shape == (5, lay.dim)
    Q2, rho2, a2 = lay.unpack(x)
    np.testing.assert_array_equal(Q2, Q)
    np.testing.assert_array_equal(rho2, rho)
    np.testing.assert_array_equal(a2, a)
    assert lay.index("rho_2_1") == 8
    with pytest.raises(ValueError, match="no state entry"):
        lay.index("Q_4_4")
    with pytest.raises(ValueError, match="trained readout"):
        lay.pack(Q, rho)
    assert sq.kernels(sq.Model(3, 2, 0.1, lr_readout=0.1)).layout == lay


def test_sizes_are_checked_before_any_work():
    with pytest.raises(ValueError, match="degree <= 3"):
        sq.kernels(sq.Model(2, 1, 0.1, activation="z**4")).diffusion(
            np.eye(2), np.zeros((2, 1)), np.eye(1))
    with pytest.raises(ValueError, match="O\\(p\\^4"):
        sq.kernels(sq.Model(64, 2, 0.1, activation="z**3")).diffusion(
            np.eye(64), np.zeros((64, 2)), np.eye(2))
    from symquad.symbolic.diffusion import check_entry_diffusion_size
    with pytest.raises(ValueError, match="entry-by-entry diffusion"):
        check_entry_diffusion_size(sq.Model(8, 4, 0.1))


def test_matrix_route_symmetric_kinds_are_symmetric():
    """The kinds that the matrix module reads once per set of index arrays (``_SYMMETRIC``,
    found by the generator on the recipes) are symmetric in their vertices, evaluated
    directly (no sharing) at a random state and permuted index arrays; they are the kinds
    without a σ vertex (every leg linear for σ' = 2c z), and a kind left out (M111, whose
    σ vertex is special) does change under a permutation (the check has power).  M001 and
    M002 (only σ vertices) are symmetric too."""
    from itertools import permutations
    from symquad._generated import diffusion_matrix as dm
    from symquad.symbolic.diffusion import parse_kind
    assert set(dm._SYMMETRIC) == {k for k in dm._KINDS if parse_kind(k)[2] == 0} | {"M001",
                                                                                      "M002"}
    rng = np.random.default_rng(3)
    Q, rho, T = random_overlaps(3, 2, rng)
    a, b = rng.uniform(0.5, 1.5, 3), np.array([0.7, 1.1])
    source = dm.kinds(Q, rho, T, a, b, 0.3, 1.3, 0.8, 0.2, -0.1)
    # fresh index arrays at every read: the source's sharing (by identity) cannot apply
    idx = [rng.integers(0, 5, (4, 1)), rng.integers(0, 5, (1, 6)), rng.integers(0, 3, (4, 6)),
           rng.integers(0, 5, (1, 1))]

    def fresh(name, order):
        return source(name, *[idx[i].copy() for i in order])
    for name in dm._KINDS:
        size = sum(parse_kind(name))
        base = fresh(name, range(size))
        scale = np.max(np.abs(base))
        diffs = [np.max(np.abs(fresh(name, perm) - base)) for perm in permutations(range(size))]
        if name in dm._SYMMETRIC:
            assert max(diffs) <= 1e-13 * scale, name
        elif name == "M111":
            assert max(diffs) > 1e-3 * scale


@pytest.mark.parametrize("batch", [(), (3,)])
def test_word_pairs_equal_the_double_sum(batch, monkeypatch):
    """WordGather.pairs (rank-J product, four-index array, per word) against the double sum
    Σ_{J,J'} H[J, J'] W_J[u, v] W_J'[w, x] by plain indexing, at the (Q, Q) block's units
    (both structures) and at units that need the per-word path; also with the four-index
    array refused by its size bound."""
    from symquad.runtime import diffusion_engine as engine
    rng = np.random.default_rng(5)
    n, p = 6, 4
    words = [rng.standard_normal(batch + (n, n)) for _ in range(4)]
    words = [w + np.swapaxes(w, -1, -2) for w in words]
    H = rng.standard_normal(batch + (4, 3))
    u = engine.block_units("Q", "Q", p, 2)
    odd = rng.integers(0, n, (5, 1)), rng.integers(0, n, (5, 7))

    def direct(a, b, c, d, H=H):
        return sum(H[..., J, K, None, None] * words[J][..., a, b] * words[K][..., c, d]
                   for J in range(4) for K in range(3))
    cases = [(u["K"], u["L"], u["k"], u["l"]), (u["k"], u["l"], u["K"], u["L"]),
             (u["K"], u["k"], u["L"], u["l"]), (u["K"], u["l"], u["L"], u["k"]),
             (odd[0], odd[1], u["k"][:5], odd[1])]
    for limit in (engine.MAX_PAIR_TENSOR, 1):
        monkeypatch.setattr(engine, "MAX_PAIR_TENSOR", limit)
        for case in cases:
            got = engine.WordGather(words).pairs(H, *case)
            ref = direct(*case)
            assert got.shape == ref.shape
            assert np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))
    # one source, two matrices read alternately: the four-index buffer (one at a time,
    # kept between sources) is never read stale
    monkeypatch.setattr(engine, "MAX_PAIR_TENSOR", 2 ** 22)
    H2 = 2.0 * H + 1.0
    words_source = engine.WordGather(words)
    case = cases[2]
    for h in (H, H2, H, H2):
        got = words_source.pairs(h, *case)
        assert np.max(np.abs(got - direct(*case, H=h))) <= 1e-13 * np.max(np.abs(got))
