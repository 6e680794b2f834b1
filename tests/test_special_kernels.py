"""The tensor kernels of erf(z/√2), ReLU and mixed activation pairs (issue 17, phase 2).

``sq.kernels(Model(..., activation="erf"))`` evaluates the moment kinds G, Gt, B,
R of symquad.symbolic.moments from the generated closed forms (and the ReLU
quadrature) by symquad.runtime.special_engine.  Second routes, at the kernel level:

* erf: the formulas of Saad & Solla (1995) for I2, J2, I3, I4, typed here from
  the paper (Λ-determinant form), summed naively over every index combination —
  to 1e-12 relative for (p, p*) <= (3, 3) and at p = 12; and a tensor-product
  Gauss–Hermite quadrature of the defining expectations (no closed form at all),
  to its own accuracy (the difference of two node counts);
* ReLU and the mixed pairs: Monte Carlo of the defining expectations
  E[σ'(λ_k) u_j δ], E[σ'σ' δ²] (label noise included), E[σ(λ_k) δ] and
  ½E[δ²], within 4.5 standard errors after asserting them, at p = 2 and p = 8;
* the right-hand side against the index-sum formula of the ODE (docs/user-guide.md, the tensor route)
  (an assembly independent of the generated one).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import special as sps

import symquad as sq
from symquad.numeric import kernels as K


def random_cov(n, rng, df=None):
    G = rng.standard_normal((n, df or n + 2))
    return G @ G.T / (df or n + 2)


def split(C, p):
    return C[:p, :p], C[:p, p:], C[p:, p:]


def weights(model, a=None):
    a = np.array([float(c) for c in model.readout]) if a is None else a
    return np.concatenate([a, -np.array([float(c) for c in model.teacher_readout])])


# ---- erf: Saad & Solla's formulas, typed from the paper -----------------------------

def ss_I2(C, a, b):
    return 2 / np.pi * np.arcsin(C[a, b] / np.sqrt((1 + C[a, a]) * (1 + C[b, b])))


def ss_J2(C, k, l):
    return 2 / np.pi / np.sqrt(1 + C[k, k] + C[l, l] + C[k, k] * C[l, l] - C[k, l] ** 2)


def ss_I3(C, k, j, a):
    L3 = (1 + C[k, k]) * (1 + C[a, a]) - C[k, a] ** 2
    return 2 / np.pi / np.sqrt(L3) * (C[j, a] * (1 + C[k, k]) - C[k, j] * C[k, a]) / (1 + C[k, k])


def ss_I4(C, k, l, a, b):
    c11, c22, c33, c44 = C[k, k], C[l, l], C[a, a], C[b, b]
    c12, c13, c14, c23, c24, c34 = C[k, l], C[k, a], C[k, b], C[l, a], C[l, b], C[a, b]
    L4 = (1 + c11) * (1 + c22) - c12 ** 2
    L0 = L4 * c34 - c23 * c24 * (1 + c11) - c13 * c14 * (1 + c22) + c12 * c13 * c24 \
        + c12 * c14 * c23
    L1 = L4 * (1 + c33) - c23 ** 2 * (1 + c11) - c13 ** 2 * (1 + c22) + 2 * c12 * c13 * c23
    L2 = L4 * (1 + c44) - c24 ** 2 * (1 + c11) - c14 ** 2 * (1 + c22) + 2 * c12 * c14 * c24
    return 4 / np.pi ** 2 / np.sqrt(L4) * np.arcsin(L0 / np.sqrt(L1 * L2))


def saad_solla_moments(C, p, w, noise):
    """(G, Gt, B, R, risk) as plain sums of the typed formulas over every index."""
    n = len(C)
    k = np.arange(p)[:, None, None]
    j = np.arange(n)[None, :, None]
    a = np.arange(n)[None, None, :]
    G = (ss_I3(C, k, j, a) * w[None, None, :]).sum(-1)
    k4, l4 = np.arange(p)[:, None, None, None], np.arange(p)[None, :, None, None]
    a4, b4 = np.arange(n)[None, None, :, None], np.arange(n)[None, None, None, :]
    B = (ss_I4(C, k4, l4, a4, b4) * w[:, None] * w[None, :]).sum((-1, -2))
    kk, ll = np.arange(p)[:, None], np.arange(p)[None, :]
    B = B + noise * ss_J2(C, kk, ll)
    aa, bb = np.arange(n)[:, None], np.arange(n)[None, :]
    I2 = ss_I2(C, aa, bb)
    R = I2[:p] @ w
    return G[:, :p], G[:, p:], B, R, 0.5 * w @ I2 @ w


def rel(x, y):
    return np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300)


@pytest.mark.parametrize("p,pk", [(1, 1), (2, 1), (1, 3), (3, 2), (3, 3), (12, 4)])
def test_erf_moments_equal_saad_solla_sums(p, pk):
    """Every moment kind and the risk, non-uniform readouts and label noise, 1e-12 relative."""
    rng = np.random.default_rng(7 * p + pk)
    C = random_cov(p + pk, rng)
    a = rng.uniform(-1, 1, p)
    m = sq.Model(p=p, p_star=pk, lr=0.3, noise=0.2, activation="erf", lr_readout=0.5,
                 teacher_readout=tuple(rng.uniform(0.2, 1, pk).round(3)))
    k = sq.kernels(m)
    assert k.form == "tensor" and k.source == "symquad._generated.special_erf_erf"
    got = k.moments(*split(C, p), a=a)
    ref = saad_solla_moments(C, p, weights(m, a), m.noise)
    for name, x, y in zip(("G", "Gt", "B", "R"), got, ref):
        assert x.shape == y.shape and rel(x, y) < 1e-12, name
    assert abs(k.risk(*split(C, p), a=a) - ref[4]) < 1e-12 * abs(ref[4])


def test_erf_rhs_equals_the_index_sum_formula():
    """dQ, dρ of the default erf model against docs/user-guide.md's formula (own assembly)."""
    p, pk = 4, 2
    rng = np.random.default_rng(3)
    C = random_cov(p + pk, rng)
    m = sq.Model(p=p, p_star=pk, lr=0.7, noise=0.05, activation="erf")
    dQ, drho = sq.kernels(m).rhs(*split(C, p))
    w = weights(m)
    G, Gt, B, _, _ = saad_solla_moments(C, p, w, m.noise)
    a, eta = w[:p], m.eta
    ref_dQ = -eta * (a[:, None] * G + (a[:, None] * G).T) + eta ** 2 * np.outer(a, a) * B
    ref_drho = -eta * a[:, None] * Gt
    assert rel(dQ, ref_dQ) < 1e-12 and rel(drho, ref_drho) < 1e-12


# ---- erf: tensor-product Gauss–Hermite quadrature of the definitions ----------------

def gauss_hermite_moments(C, p, w, nodes):
    """(G, Gt, B, R, risk) by an n-dimensional Gauss–Hermite rule (n = p + p* <= 4)."""
    n = len(C)
    x, wt = np.polynomial.hermite_e.hermegauss(nodes)
    wt = wt / wt.sum()
    grid = np.stack(np.meshgrid(*([x] * n), indexing="ij"), -1).reshape(-1, n)
    weight = np.prod(np.stack(np.meshgrid(*([wt] * n), indexing="ij"), -1).reshape(-1, n), -1)
    vals, vecs = np.linalg.eigh(C)
    u = grid @ (vecs * np.sqrt(np.maximum(vals, 0))).T          # u ~ N(0, C)
    sig = sps.erf(u / math.sqrt(2))
    dsig = math.sqrt(2 / math.pi) * np.exp(-u[:, :p] ** 2 / 2)
    delta = sig @ w
    E = lambda f: np.tensordot(weight, f, axes=(0, 0))          # noqa: E731
    G = E(dsig[:, :, None] * u[:, None, :] * delta[:, None, None])
    B = E(dsig[:, :, None] * dsig[:, None, :] * delta[:, None, None] ** 2)
    R = E(sig[:, :p] * delta[:, None])
    return G[:, :p], G[:, p:], B, R, 0.5 * E(delta ** 2)


@pytest.mark.parametrize("p,pk", [(2, 1), (1, 2), (2, 2), (3, 1)])
def test_erf_moments_match_gauss_hermite_quadrature(p, pk):
    """The definitions integrated numerically; agreement within the rule's own error.

    The Hermite coefficients of erf(√λ x/√2) decay like (λ/(1+λ))^(m/2), so the
    covariance is scaled to eigenvalues ~1 (at most 1.04 here) to keep the rule
    accurate with 16–32 nodes per dimension.
    """
    rng = np.random.default_rng(11 * p + pk)
    C = 0.3 * random_cov(p + pk, rng)
    m = sq.Model(p=p, p_star=pk, lr=0.2, activation="erf", lr_readout=0.1)
    a = rng.uniform(-1, 1, p)
    w = weights(m, a)
    nodes = (24, 32) if p + pk <= 3 else (16, 22)
    coarse = gauss_hermite_moments(C, p, w, nodes[0])
    fine = gauss_hermite_moments(C, p, w, nodes[1])
    got = sq.kernels(m).moments(*split(C, p), a=a) + (sq.kernels(m).risk(*split(C, p), a=a),)
    for name, c, f, g in zip(("G", "Gt", "B", "R", "risk"), coarse, fine, got):
        accuracy = np.max(np.abs(c - f)) + 1e-13
        assert accuracy < 1e-6, name                               # the rule resolves it
        assert np.max(np.abs(np.asarray(g) - f)) < 10 * accuracy, name


# ---- ReLU and mixed pairs: Monte Carlo of the definitions ---------------------------

ACT = {"erf": (lambda u: sps.erf(u / math.sqrt(2)),
               lambda u: math.sqrt(2 / math.pi) * np.exp(-u ** 2 / 2)),
       "relu": (lambda u: np.maximum(u, 0.0), lambda u: (u > 0).astype(float))}


def poly_act(coeffs):
    c = [float(x) for x in coeffs]
    return (lambda u: sum(ci * u ** i for i, ci in enumerate(c)),
            lambda u: sum(i * ci * u ** (i - 1) for i, ci in enumerate(c) if i))


def mc_moments(model, C, a, samples, seed, chunk=50_000):
    """Means and standard errors of the moment kinds and the risk, from samples of u and ξ."""
    p, n = model.p, len(C)
    act = lambda x: ACT[x] if isinstance(x, str) else poly_act(x)     # noqa: E731
    (s, ds), (t, _) = act(model.activation), act(model.teacher_activation)
    w = weights(model, a)
    L = np.linalg.cholesky(C)
    rng = np.random.default_rng(seed)
    acc = {}
    for start in range(0, samples, chunk):
        u = rng.standard_normal((chunk, n)) @ L.T
        xi = math.sqrt(model.noise) * rng.standard_normal(chunk)
        f = np.concatenate([s(u[:, :p]), t(u[:, p:])], axis=1)
        d = ds(u[:, :p])
        delta = f @ w
        noisy = delta - xi
        terms = {"G": d[:, :, None] * u[:, None, :p] * delta[:, None, None],
                 "Gt": d[:, :, None] * u[:, None, p:] * delta[:, None, None],
                 "B": d[:, :, None] * d[:, None, :] * noisy[:, None, None] ** 2,
                 "R": f[:, :p] * delta[:, None], "risk": 0.5 * delta ** 2}
        for key, x in terms.items():
            s1, s2 = acc.get(key, (0.0, 0.0))
            acc[key] = (s1 + x.sum(0), s2 + (x * x).sum(0))
    out = {}
    for key, (s1, s2) in acc.items():
        mean = s1 / samples
        out[key] = (mean, np.sqrt(np.maximum(s2 / samples - mean ** 2, 0) / samples))
    return out


def assert_matches_mc(model, C, a, samples, seed, zcrit=4.5, se_rel=0.015):
    """Every moment kind within `zcrit` standard errors, after asserting that the errors
    resolve each kind to `se_rel` of its largest entry."""
    k = sq.kernels(model)
    G, Gt, B, R = k.moments(*split(C, model.p), a=a)
    got = {"G": G, "Gt": Gt, "B": B, "R": R, "risk": k.risk(*split(C, model.p), a=a)}
    ref = mc_moments(model, C, a, samples, seed)
    for key, value in got.items():
        mean, se = ref[key]
        assert np.max(se) < se_rel * np.max(np.abs(mean)), key    # the Monte Carlo resolves it
        z = np.abs(np.asarray(value) - mean) / np.maximum(se, 1e-12)
        assert np.max(z) < zcrit, (key, float(np.max(z)))


@pytest.mark.parametrize("student,teacher", [("relu", "relu"), ("relu", "erf"),
                                             ("erf", "relu"), ("z**2/2 + z", "relu"),
                                             ("z**2", "erf"), ("erf", "z**3")])
def test_special_pairs_match_monte_carlo_at_p2(student, teacher):
    p, pk = 2, 2
    rng = np.random.default_rng(5)
    C = random_cov(p + pk, rng)
    m = sq.Model(p=p, p_star=pk, lr=0.1, noise=0.1, activation=student,
                 teacher_activation=teacher, lr_readout=0.3, readout=(0.7, -0.4))
    assert_matches_mc(m, C, np.array([0.7, -0.4]), 400_000, seed=2)


@pytest.mark.parametrize("teacher", ["relu", "erf"])
def test_relu_student_matches_monte_carlo_at_p8(teacher):
    """p = 8: the quadrature's four-point sums over every index (symmetries used) and the
    closed two- and three-point sums."""
    p, pk = 8, 2
    rng = np.random.default_rng(8)
    C = random_cov(p + pk, rng)
    m = sq.Model(p=p, p_star=pk, lr=0.1, noise=0.05, activation="relu",
                 teacher_activation=teacher, lr_readout=0.1)
    a = rng.uniform(0.05, 0.3, p)
    assert_matches_mc(m, C, a, 300_000, seed=3)


def test_batch_dimensions_give_the_unbatched_numbers():
    rng = np.random.default_rng(9)
    for act, teacher in (("erf", "erf"), ("relu", "erf"), ("z**2", "relu")):
        m = sq.Model(p=3, p_star=2, lr=0.2, noise=0.1, activation=act,
                     teacher_activation=teacher)
        k = sq.kernels(m)
        Cs = np.stack([random_cov(5, rng) for _ in range(3)])
        Q, rho, T = Cs[:, :3, :3], Cs[:, :3, 3:], Cs[:, 3:, 3:]
        batched = k.rhs(Q, rho, T)
        risks = k.risk(Q, rho, T)
        for i in range(3):
            single = k.rhs(Q[i], rho[i], T[i])
            for x, y in zip(batched, single):
                assert np.array_equal(x[i], y)
            assert risks[i] == k.risk(Q[i], rho[i], T[i])


def test_coincident_students_and_teachers():
    """Rank-deficient C (a student equal to a teacher, two equal students): finite moments
    that agree with Monte Carlo (the closed forms and the quadrature cover coincidences)."""
    rng = np.random.default_rng(12)
    Y = rng.standard_normal((3, 5)) / math.sqrt(5)
    # students: rows 0, 1 (equal) and 2; teachers: row 3 (= student 2) and 4
    X = np.vstack([Y[0], Y[0], Y[1], Y[1], Y[2]])
    C = X @ X.T + 1e-14 * np.eye(5)
    for act, teacher in (("erf", "erf"), ("relu", "relu")):
        m = sq.Model(p=3, p_star=2, lr=0.1, activation=act, teacher_activation=teacher)
        G, Gt, B, _ = sq.kernels(m).moments(*split(C, 3))
        assert all(np.isfinite(x).all() for x in (G, Gt, B))
        ref = mc_moments(m, C, None, 200_000, seed=4)
        for key, value in (("G", G), ("B", B)):
            mean, se = ref[key]
            assert np.max(np.abs(value - mean) / np.maximum(se, 1e-12)) < 4.5, (act, key)


# ---- refusals, costs, routing ---------------------------------------------------------

def test_unsupported_pair_and_forms_are_refused_by_name():
    m = sq.Model(p=2, p_star=1, lr=0.1, activation="relu", teacher_activation="z**2")
    with pytest.raises(ValueError, match=r"activation='relu' with teacher_activation='z\*\*2'.*not "
                                         r"implemented"):
        sq.kernels(m)
    erf = sq.Model(p=2, p_star=1, lr=0.1, activation="erf")
    for form in ("matrix", "entries"):
        with pytest.raises(ValueError, match="needs polynomial activations"):
            sq.kernels(erf, form=form)


def test_cost_is_checked_before_computing():
    big = sq.Model(p=400, p_star=4, lr=0.1, activation="relu")
    assert K.special_rhs_seconds(big) > K.SPECIAL_REFUSE_SECONDS
    with pytest.raises(ValueError, match=r"would take about .* s"):
        sq.kernels(big)
    mid = sq.Model(p=48, p_star=4, lr=0.1, activation="relu")
    assert K.SPECIAL_WARN_SECONDS < K.special_rhs_seconds(mid) < K.SPECIAL_REFUSE_SECONDS
    with pytest.warns(RuntimeWarning, match="will take about"):
        sq.kernels(mid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sq.kernels(sq.Model(p=16, p_star=4, lr=0.1, activation="erf"))


# ---- against the field: Saad & Solla's symmetric plateau ------------------------------

@pytest.mark.parametrize("K", [2, 3])
def test_saad_solla_symmetric_plateau(K):
    """The soft committee machine (readouts 1, K = M, T = I): the η → 0 fixed point of the
    unspecialised (symmetric) subspace Q_ij = q, ρ_in = r is q = 1/(2K−1), r = 1/√(K(2K−1))
    with the plateau error ε = (K/π)(π/6 − K arcsin(1/(2K))) (Saad & Solla, Phys. Rev. E
    52, 4225 (1995); 0.0203 at K = 3) — found here by a root search on the kernels'
    gradient-flow drift from a generic start of that subspace."""
    from scipy.optimize import fsolve
    m = sq.Model(p=K, p_star=K, lr=1e-9, activation="erf", readout=1, teacher_readout=1)
    k = sq.kernels(m)
    T = np.eye(K)

    def drift(x):
        Q, rho = np.full((K, K), x[0]), np.full((K, K), x[1])
        dQ, drho = k.rhs(Q, rho, T)
        # the subspace is invariant: every entry moves alike
        assert np.ptp(dQ) < 1e-9 * m.eta and np.ptp(drho) < 1e-9 * m.eta
        return [dQ[0, 0] / m.eta, drho[0, 0] / m.eta]
    x = fsolve(drift, [0.5, 0.5])
    assert np.max(np.abs(drift(x))) < 1e-12
    np.testing.assert_allclose(x, [1 / (2 * K - 1), 1 / math.sqrt(K * (2 * K - 1))],
                               rtol=0, atol=1e-9)
    eps = K / math.pi * (math.pi / 6 - K * math.asin(1 / (2 * K)))
    assert abs(k.risk(np.full((K, K), x[0]), np.full((K, K), x[1]), T) - eps) < 1e-9
