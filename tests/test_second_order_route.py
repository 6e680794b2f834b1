"""The kernel route of J, ½∂²f:Σ and f₁ (symquad.numeric.drift_derivatives), any width, any pair.

Two independent references: the symbolic entry route (polynomial activations, small p):
every quantity equal to 1e-12 relative for every field of the specification; and a
Monte Carlo of the exact N-dimensional one-step update (tests/second_order_mc.py, numpy
only) for erf, ReLU and a mixed pair, each source of f₁ on its own.  Statistical checks
assert their precision first.
"""

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.drift_derivatives import (POLY_STEP, SMOOTH_STEP, directions_per_rhs,
                                               drift_degree, moment_degree, stencil_weights)
from symquad.numeric.kernels import _derivatives
from second_order_mc import mean_and_se, one_step_sources

Z = 4.0


def _rel(ref, value):
    return np.max(np.abs(ref - value)) / np.max(np.abs(ref))


def _point(m, singular=None):
    """A generic state of `m` (unit diagonal on the sphere); `singular` makes Ω singular."""
    Q = np.array([[1.0, 0.2], [0.2, 0.8]])
    rho = np.array([[0.5, -0.2], [0.3, 0.4]])[:, :m.p_star]
    T = np.array([[1.0, 0.3], [0.3, 0.9]])[:m.p_star, :m.p_star]
    if m.constraint == "sphere":
        Q = np.array([[1.0, 0.2], [0.2, 1.0]])
    if singular == "teacher":              # T of rank 1, rho in its range
        T = np.ones((2, 2))
        rho = np.array([[0.4, 0.4], [0.1, 0.1]])
    elif singular == "units":              # two collinear students (Q of rank 1)
        Q = np.array([[1.0, 0.9], [0.9, 0.81]])
        rho = np.array([[0.5, 0.1], [0.45, 0.09]])[:, :m.p_star]
    return Q, rho, T


ROUTE_CASES = [
    dict(),
    dict(noise=0.3),
    dict(batch_size=3),
    dict(weight_decay=0.5),
    dict(lr_readout=0.3, noise=0.2),
    dict(readout=(0.7, 0.2), teacher_readout=(0.6, 0.5)),
    dict(constraint="sphere", batch_size=2, weight_decay=0.5, noise=0.1),
    # the entry route's sphere derivation grows as dim^4.2 (46 s at dim 7): slow
    pytest.param(dict(constraint="sphere", lr_readout=0.2), marks=pytest.mark.slow),
    pytest.param(dict(loss="correlation", constraint="sphere", noise=0.2),
                 marks=pytest.mark.slow),
    dict(loss="correlation", lr_readout=0.2, batch_size=2),
    dict(teacher_activation="z**3 - 3*z", lr_readout=0.2, noise=0.1),
    dict(activation="z**3 - 3*z", teacher_activation="z**2", batch_size=2, weight_decay=0.3),
]


@pytest.mark.parametrize("kw", ROUTE_CASES,
                         ids=lambda kw: ",".join(kw) if isinstance(kw, dict) and kw else "classic")
def test_equal_to_the_entry_route(kw):
    """f₁, ∂²f, ½∂²f:Σ, J, ∇ε, ∇²ε: kernel route = symbolic entry route (1e-12)."""
    m = sq.Model(2, 2 if "teacher_readout" in kw else 1, 0.4, **kw)
    Q, rho, T = _point(m)
    a = np.array([0.6, 0.3]) if m.readout_trained else None
    ke, kn = sq.kernels(m, form="entries"), sq.kernels(m)
    assert kn.form != "entries"
    f1e, He = ke.second_order(Q, rho, T, a)
    f1n, Hn = kn.second_order(Q, rho, T, a)
    assert _rel(f1e, f1n) < 1e-12 and _rel(He, Hn) < 1e-12
    for name in ("jacobian", "risk_gradient", "risk_hessian"):
        assert _rel(getattr(ke, name)(Q, rho, T, a), getattr(kn, name)(Q, rho, T, a)) < 1e-12, name
    # the contraction along Σ's eigenvectors, without the full Hessian
    rng = np.random.default_rng(1)
    dim = kn.layout.dim
    W = rng.standard_normal((dim, dim))
    S = W @ W.T / dim
    x = kn.layout.pack(Q, rho, a)
    _, J, curv = _derivatives(m, None).curvature(x, T, S, kn.params_at())
    assert _rel(0.5 * np.einsum("ijk,jk->i", He, S), curv) < 1e-12
    assert _rel(ke.jacobian(Q, rho, T, a), J) < 1e-12


@pytest.mark.parametrize("singular", ["teacher", "units"])
def test_singular_covariance(singular):
    """A singular Ω (T of rank 1; two collinear units): the cross term's Ω⁺ is exact there."""
    m = sq.Model(2, 2, 0.4, batch_size=3, noise=0.1, teacher_activation="z**2 + z")
    Q, rho, T = _point(m, singular)
    C = np.block([[Q, rho], [rho.T, T]])
    assert np.min(np.linalg.eigvalsh(C)) > -1e-12 and np.linalg.matrix_rank(C, 1e-10) < 4
    f1e, _ = sq.kernels(m, form="entries").second_order(Q, rho, T)
    der = _derivatives(m, None)
    src = der.f1_sources(der.lay.pack(Q, rho), T, der.k._params)
    assert _rel(f1e, src["total"]) < 1e-10
    assert np.max(np.abs(src["cross"])) > 1e-3 * np.max(np.abs(src["total"]))


def test_stencil_weights_are_exact_for_polynomials():
    for m in (1, 2, 4, 6):
        nodes = tuple(range(-m, m + 1))
        w1, w2 = stencil_weights(nodes)
        t = np.arange(-m, m + 1, dtype=float)
        for d in range(2 * m + 1):             # 2m + 1 nodes: exact up to degree 2m
            tol1, tol2 = (1e-14 * (np.abs(w) @ np.abs(t) ** d) + 1e-14 for w in (w1, w2))
            assert abs(w1 @ t ** d - (d == 1)) < tol1 and abs(w2 @ t ** d - 2 * (d == 2)) < tol2
        assert abs(w2 @ t ** (2 * m + 1)) < 1e-10     # and f'' one beyond, by parity
    # and not beyond: a wrong degree is not hidden
    w1, w2 = stencil_weights((-1, 0, 1))
    assert abs(w2 @ np.array([-1.0, 0, 1]) ** 4) > 1
    with pytest.raises(ValueError, match="distinct"):
        stencil_weights((0, 0, 1))


def test_degrees_bound_the_drift():
    """The drift along a line is a polynomial of degree drift_degree: the next finite
    difference of that order vanishes (and the one below does not)."""
    for kw in (dict(), dict(lr_readout=0.3), dict(teacher_activation="z**3 - 3*z")):
        m = sq.Model(2, 1, 0.4, noise=0.1, **kw)
        der = _derivatives(m, None)
        Q, rho, T = _point(m)
        x = der.lay.pack(Q, rho, np.array([0.6, 0.3]) if m.readout_trained else None)
        v = np.random.default_rng(0).standard_normal(x.size)
        d = drift_degree(m)
        ts = np.arange(d + 2) * 0.3
        F = der.drift(x + ts[:, None] * v, T, der.k._params)
        diffs = np.diff(F, n=d + 1, axis=0)
        assert np.max(np.abs(diffs)) < 1e-9 * np.max(np.abs(F))
        assert moment_degree(m) >= 1 and directions_per_rhs(m, x.size) > x.size


def test_smooth_stencil_accuracy_on_a_polynomial_model():
    """The Richardson nodes (erf/ReLU) against the exact interpolant: the stated 1e-8."""
    m = sq.Model(2, 2, 0.4, noise=0.1, lr_readout=0.3, teacher_activation="z**3 - 3*z")
    der = _derivatives(m, None)
    Q, rho, T = _point(m)
    x = der.lay.pack(Q, rho, np.array([0.6, 0.3]))
    S = np.diag(np.linspace(0.1, 1.0, x.size))
    exact = der.curvature(x, T, S, der.k._params)
    der.poly, nodes = False, der.drift_nodes
    der.drift_nodes = (-1, -0.5, 0, 0.5, 1)
    try:
        smooth = der.curvature(x, T, S, der.k._params)
    finally:
        der.poly, der.drift_nodes = True, nodes
    assert _rel(exact[1], smooth[1]) < 1e-8 and _rel(exact[2], smooth[2]) < 1e-8
    assert SMOOTH_STEP < POLY_STEP


def _against_mc(m, Q, rho, T, N, n, seed, names, precision, a=None):
    der = _derivatives(m, None)
    x = der.lay.pack(Q, rho, a)
    Du = None
    if m.constraint == "sphere":
        from symquad.numeric.kernels import _diffusion_function
        Du = _diffusion_function(m, "tensor", both=True)(
            Q, rho, T, der.k._readout if a is None else a, der.k._params)[1]
    th = der.f1_sources(x, T, der.k._params, Du)
    parts = one_step_sources(m, Q, rho, T, N, n, np.random.default_rng(seed), a=a)
    for name in names:
        mc, se = mean_and_se(parts[name])
        ref = th[name]
        scale = np.max(np.abs(ref))
        assert scale > 0, name
        assert np.max(se) < precision * scale, (name, np.max(se), scale)
        z = np.abs(mc - ref) / np.maximum(se, 1e-12 * scale)
        assert np.max(z) < Z, (name, mc, ref, se)
    return th, parts


PAIRS = {"erf": dict(activation="erf"),
         "relu": dict(activation="relu", teacher_activation="relu"),
         "z2_erf": dict(activation="z**2", teacher_activation="erf")}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_sources_against_the_one_step_monte_carlo(pair):
    """|x|²/N, the batch cross terms and weight decay, each on its own (batch 3, λ = 0.5):
    exact at any N without a constraint, so N = 20."""
    m = sq.Model(2, 2, 0.5, noise=0.2, batch_size=3, weight_decay=0.5, **PAIRS[pair])
    Q, rho, T = _point(m)
    th, parts = _against_mc(m, Q, rho, T, 20, 150_000, 7, ("norm", "cross", "decay"), 0.08)
    # power: the cross source of batch 1 (zero) is rejected by the same data
    mc, se = mean_and_se(parts["cross"])
    assert np.max(np.abs(mc[se > 0]) / se[se > 0]) > 2 * Z


@pytest.mark.parametrize("pair", ["erf", "z2_erf"])
def test_sphere_source_against_the_one_step_monte_carlo(pair):
    """The sphere's renormalisation (with the unconstrained D of the cubature or the erf
    closed forms), batch 2: the whole f₁ at N = 200, where the O(1/N) remainder is small."""
    m = sq.Model(2, 1, 0.3, noise=0.2, constraint="sphere", batch_size=2, **PAIRS[pair])
    Q, rho, T = _point(m)
    th, parts = _against_mc(m, Q, rho, T, 200, 60_000, 3, (), 1.0)
    mc, se = mean_and_se(parts["total"])
    keep = np.abs(th["total"]) > 0
    assert np.max(se[keep]) < 0.3 * np.max(np.abs(th["total"]))
    assert np.max(np.abs(mc - th["total"])[keep] / se[keep]) < Z
    assert np.max(np.abs(th["sphere"])) > 0.1 * np.max(np.abs(th["total"]))


def test_erf_curvature_against_differences():
    """½∂²f:Σ and J of an erf model (Richardson nodes) against plain second differences
    of the kernels' drift with another step."""
    m = sq.Model(3, 2, 0.4, noise=0.1, lr_readout=0.2, activation="erf", batch_size=2)
    k = sq.kernels(m)
    rng = np.random.default_rng(4)
    W = rng.standard_normal((5, 12))
    C = W @ W.T / 12
    Q, rho, T = C[:3, :3], C[:3, 3:], C[3:, 3:]
    a = np.array([0.5, 0.3, 0.2])
    lay = k.layout
    x = lay.pack(Q, rho, a)
    S = np.diag(rng.uniform(0.1, 1.0, lay.dim))
    _, J, curv = _derivatives(m, None).curvature(x, T, S, k.params_at())

    def f(y):
        Qy, ry, ay = lay.unpack(y)
        return lay.pack(*k.rhs(Qy, ry, T, ay))
    h = 2e-3
    E = np.eye(lay.dim)
    fd2 = sum(S[i, i] * (f(x + h * E[i]) - 2 * f(x) + f(x - h * E[i])) / h ** 2
              for i in range(lay.dim)) / 2
    fd1 = np.stack([(f(x + h * E[i]) - f(x - h * E[i])) / (2 * h) for i in range(lay.dim)], 1)
    assert _rel(fd2, curv) < 1e-4 and _rel(fd1, J) < 1e-5


@pytest.mark.parametrize("kw", [dict(activation="z**2 + 1", teacher_activation="z**3 - 3*z",
                                     lr_readout=0.2),
                                dict(activation="erf", teacher_activation="z**2 - 1",
                                     lr_readout=0.2)], ids=["poly", "erf"])
def test_risk_hessian_pattern(kw):
    """The risk's Hessian over the coupled pairs only (fields of J and K at most two) equals
    the one over every pair, with a trained readout and activation constants (κ ≠ 0)."""
    m = sq.Model(4, 2, 0.3, **kw)
    der = _derivatives(m, None)
    rng = np.random.default_rng(3)
    W = rng.standard_normal((6, 12))
    C = W @ W.T / 12
    x = der.lay.pack(C[:4, :4], C[:4, 4:], np.array([0.4, 0.3, 0.2, 0.1]))
    T = C[4:, 4:]
    sparse = der.risk_hessian(x, T)
    J, K = np.triu_indices(der.lay.dim, 1)
    assert len(der.risk_pairs()[0]) < 0.6 * len(J)
    der._pairs = (J, K)
    try:
        full = der.risk_hessian(x, T)
    finally:
        der._pairs = None
    assert _rel(full, sparse) < (1e-12 if m.is_polynomial else 1e-8)
    # and the contraction along Σ's eigenvectors
    S = np.cov(rng.standard_normal((3 * x.size, x.size)), rowvar=False)
    assert abs(der.risk_curvature(x, T, S) - 0.5 * np.sum(full * S)) < 1e-8 * np.sum(np.abs(full * S))
