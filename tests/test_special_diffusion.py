"""The diffusion matrix of erf models (symquad/runtime/special_diffusion.py) and the erf Jacobian.

Independent routes:

* the four-erf moment (Price path, 24 Gauss–Legendre nodes) against a tensor
  Gauss–Hermite quadrature of its definition and against itself with 200 nodes
  (the stated accuracy), the one-variable E[erf⁴] against scipy's adaptive quad;
* every moment kind against a Monte Carlo of its defining expectation (written here
  from the definitions, numpy), and the drift kinds against the drift kernels;
* D against the covariance of N-dimensional one-step SGD increments
  (tests/diffusion_mc.py) at p = 4 and p = 8, every field of the model, precision
  asserted first; the same check fails for a wrong batch size;
* the numerical Jacobian helper against the exact Jacobian of a polynomial model,
  and the erf risk gradient against the closed derivative ∂I₂/∂C_ab = J₂.
"""

import numpy as np
import pytest
from scipy.special import erf

import symquad as sq
from conftest import random_overlaps
from symquad.runtime import special_diffusion as sd
from test_diffusion import mc_check


def _gauss_hermite_four(C, m):
    """E[∏ erf(u_i/√2)] for a 4 × 4 covariance by an m⁴-node Gauss–Hermite rule.

    u = L z with L Lᵀ = C and z ~ N(0, I₄) on the product rule's nodes; the nodes and
    weights are broadcast along four axes (an m × m × m × m grid) instead of stacked into
    an (m⁴, 4) table, the same rule at a tenth of the CPU (m = 40: 0.17 s, was 1.5–2 s)."""
    x, w = np.polynomial.hermite_e.hermegauss(m)
    w = w / w.sum()
    lam, V = np.linalg.eigh(C)
    L = V * np.sqrt(np.clip(lam, 0, None)) / np.sqrt(2)
    along = [np.reshape(v, [-1 if k == a else 1 for k in range(4)])
             for v in (x, w) for a in range(4)]
    z, weights = along[:4], along[4:]
    total = weights[0] * weights[1] * weights[2] * weights[3]
    for i in range(4):
        total = total * erf(sum(L[i, a] * z[a] for a in range(4)))
    return float(total.sum())


def test_four_erf_equals_gauss_hermite():
    rng = np.random.default_rng(3)
    eye = np.eye(4)
    for trial in range(3):
        G = rng.standard_normal((4, 5))
        C = G @ G.T / 5 * (0.5, 1.0, 1.0)[trial]
        if trial == 2:                                  # coincident fields (singular C)
            C[1], C[:, 1] = C[0], C[:, 0]
        value = sd.four_erf(C, *(eye[i][None] for i in range(4)))[0]
        # the rule's own error: the difference of 32 and 40 nodes (below 1e-8 here)
        ref, ref2 = _gauss_hermite_four(C, 40), _gauss_hermite_four(C, 32)
        assert abs(ref - ref2) < 1e-8
        assert abs(value) > 1e-3
        assert abs(value - ref) < 1e-10 + 2 * abs(ref - ref2)


@pytest.mark.parametrize("v", [0.05, 1.0, 3.0, 10.0])
def test_erf_fourth_moment_equals_adaptive_quadrature(v):
    from scipy.integrate import quad
    ref = quad(lambda x: erf(x / np.sqrt(2)) ** 4 * np.exp(-x * x / (2 * v))
               / np.sqrt(2 * np.pi * v), -np.inf, np.inf, epsabs=1e-14, epsrel=1e-14)[0]
    assert abs(sd.erf_fourth_moment(v) - ref) < 1e-13


@pytest.mark.parametrize("scale", [1.5, 4.0, 12.0, 30.0])
def test_price_quadrature_meets_stated_accuracy(scale):
    """The node table's rule against 200 nodes, relative to (Σ|w|)⁴: 1e-11 (stated)."""
    rng = np.random.default_rng(5)
    n = 6
    for trial in range(6):
        G = rng.standard_normal((n, n + 1))
        C = G @ G.T
        if trial % 3 == 0:
            C[1], C[:, 1] = C[0], C[:, 0]
        C *= scale / np.max(np.diag(C))          # the largest variance at a table bound
        w = rng.standard_normal(n)[None]
        value = sd.four_erf(C, w, w, w, w)[0]
        ref = sd.four_erf(C, w, w, w, w, nodes=200)[0]
        assert abs(value - ref) <= 1e-11 * np.sum(np.abs(w)) ** 4
        assert abs(sd.four_erf(C, w, w, w, w, nodes=4)[0] - ref) > 1e-11 * np.sum(np.abs(w)) ** 4


# ---- the moment kinds against their definitions --------------------------------------

def _kinds_point(p=3, ps=2, seed=0):
    rng = np.random.default_rng(seed)
    Q, rho, T = random_overlaps(p, ps, rng)
    a, b = rng.uniform(0.5, 1.5, p), rng.uniform(0.5, 1.5, ps)
    return Q, rho, T, a, b


def test_drift_kinds_equal_the_drift_kernels():
    p, ps = 3, 2
    Q, rho, T, a, b = _kinds_point(p, ps)
    m = sq.Model(p, ps, 0.5, activation="erf", teacher_activation="erf", readout=tuple(a),
                 teacher_readout=tuple(b), noise=0.1, lr_readout=0.1)
    K = sd.erf_diffusion_kinds(Q, rho, T, a, b, 0.1, ("M110", "M200", "M001")).arrays
    G, Gt, B, R = sq.kernels(m).moments(Q, rho, T, a)
    for mine, ref in ((K["M110"][:, :p], G), (K["M110"][:, p:], Gt), (K["M200"], B),
                      (K["M001"], R)):
        assert np.max(np.abs(mine - ref)) < 1e-13 * np.max(np.abs(ref))


def test_kinds_equal_monte_carlo_of_their_definitions():
    p, ps, Delta = 3, 2, 0.1
    n = p + ps
    Q, rho, T, a, b = _kinds_point(p, ps)
    names = ("M220", "M310", "M400", "M111", "M201", "M002")
    K = sd.erf_diffusion_kinds(Q, rho, T, a, b, Delta, names).arrays
    rng = np.random.default_rng(1)
    C = np.block([[Q, rho], [rho.T, T]])
    S = 400_000
    u = rng.multivariate_normal(np.zeros(n), C, size=S)
    f = erf(u / np.sqrt(2))
    fp = np.sqrt(2 / np.pi) * np.exp(-u ** 2 / 2)
    d = f @ np.concatenate([a, -b]) - np.sqrt(Delta) * rng.standard_normal(S)
    cases = [  # (kind value, samples of the defining product); coincident indices included
        (K["M400"][0, 1, 1, 2], fp[:, 0] * fp[:, 1] ** 2 * fp[:, 2] * d ** 4),
        (K["M400"][2, 2, 2, 2], fp[:, 2] ** 4 * d ** 4),
        (K["M310"][0, 0, 1, 3], fp[:, 0] ** 2 * fp[:, 1] * u[:, 3] * d ** 3),
        (K["M310"][0, 1, 2, 1], fp[:, 0] * fp[:, 1] * fp[:, 2] * u[:, 1] * d ** 3),
        (K["M220"][0, 1, 2, 4], fp[:, 0] * fp[:, 1] * u[:, 2] * u[:, 4] * d ** 2),
        (K["M220"][1, 1, 1, 1], fp[:, 1] ** 2 * u[:, 1] ** 2 * d ** 2),
        (K["M111"][0, 3, 2], fp[:, 0] * u[:, 3] * f[:, 2] * d ** 2),
        (K["M111"][1, 1, 1], fp[:, 1] * u[:, 1] * f[:, 1] * d ** 2),
        (K["M201"][0, 1, 1], fp[:, 0] * fp[:, 1] * f[:, 1] * d ** 3),
        (K["M201"][2, 2, 0], fp[:, 2] ** 2 * f[:, 0] * d ** 3),
        (K["M002"][0, 2], f[:, 0] * f[:, 2] * d ** 2),
        (K["M002"][1, 1], f[:, 1] ** 2 * d ** 2),
    ]
    for value, x in cases:
        mean, se = x.mean(), x.std() / np.sqrt(S)
        assert se < 0.02 * abs(mean) + 1e-3            # the MC resolves the kind
        assert abs(value - mean) < 4.5 * se, (value, mean, se)   # 12 checks, Bonferroni-safe


# ---- D against N-dimensional one-step increments -------------------------------------

ERF = dict(activation="erf", teacher_activation="erf")


@pytest.mark.parametrize("model, n, precision", [
    (sq.Model(4, 2, 0.8, noise=0.3, **ERF), 100_000, 0.08),
    (sq.Model(4, 2, 0.6, noise=0.2, batch_size=3, weight_decay=0.1, lr_readout=0.5,
              readout=(0.6, 0.9, 1.1, 1.3), teacher_readout=(1.0, 0.7), **ERF), 50_000, 0.1),
    (sq.Model(4, 2, 0.6, noise=0.2, constraint="sphere", lr_readout=0.3, **ERF), 60_000, 0.1),
], ids=repr)
def test_erf_diffusion_matches_monte_carlo_p4(model, n, precision):
    # up to 378 entries: the max |z| stays below 5 with probability > 0.999
    assert mc_check(model, n=n, seed=21, precision=precision) < 5


def test_erf_diffusion_matches_monte_carlo_p8():
    model = sq.Model(8, 2, 0.8, noise=0.3, **ERF)
    assert mc_check(model, n=100_000, seed=22) < 5


def test_erf_monte_carlo_check_has_power():
    model = sq.Model(4, 2, 0.8, noise=0.3, **ERF)
    assert mc_check(model, n=100_000, seed=21, compare_with=model.replace(batch_size=2)) > 10


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    sq.Model(8, 2, 0.6, noise=0.3, batch_size=3, weight_decay=0.2, **ERF),
    sq.Model(8, 2, 0.5, constraint="sphere", lr_readout=0.3, noise=0.1, **ERF),
    sq.Model(8, 3, 0.6, lr_readout=0.4, readout=tuple(np.linspace(0.5, 1.5, 8)), **ERF),
], ids=repr)
def test_erf_diffusion_matches_monte_carlo_large(model):
    assert mc_check(model, n=400_000, seed=23, N=4000, precision=0.05) < 5


def test_erf_diffusion_is_psd_symmetric_and_batched():
    model = sq.Model(3, 2, 0.5, noise=0.1, lr_readout=0.2, **ERF)
    rng = np.random.default_rng(7)
    pts = [random_overlaps(3, 2, rng) for _ in range(3)]
    Q, rho, T = (np.stack(x) for x in zip(*pts))
    a = rng.uniform(0.5, 1.5, (3, 3))
    k = sq.kernels(model)
    D = k.diffusion(Q, rho, T, a)
    for i in range(3):
        Di = k.diffusion(Q[i], rho[i], T[i], a[i])
        assert np.max(np.abs(D[i] - Di)) < 1e-13 * np.max(np.abs(Di))
        assert np.allclose(Di, Di.T, rtol=0, atol=0)
        assert np.min(np.linalg.eigvalsh(Di)) > -1e-12 * np.max(np.abs(Di))


def test_unsupported_pairs_are_refused_by_name_before_work():
    # ReLU and mixed pairs have the field-space rule (tests/test_sampled_diffusion.py);
    # a polynomial of degree > 2 with erf is refused
    for act, teacher in (("z**3", "erf"), ("erf", "z**3 - 3*z")):
        model = sq.Model(2, 1, 0.5, activation=act, teacher_activation=teacher)
        Q, rho, T = np.eye(2), np.zeros((2, 1)), np.eye(1)
        with pytest.raises(ValueError, match="not derived"):
            sq.kernels(model).diffusion(Q, rho, T)
        with pytest.raises(ValueError, match="not derived"):
            sq.fluctuations(model, Q, rho, T, 1000, [1.0])


def test_erf_diffusion_cost_is_checked_first():
    from symquad.numeric.kernels import check_erf_diffusion_cost
    with pytest.raises(ValueError, match="erf diffusion matrix"):
        check_erf_diffusion_cost(sq.Model(40, 4, 0.5, **ERF))
    assert check_erf_diffusion_cost(sq.Model(4, 2, 0.5, **ERF)) < 1.0


# ---- the numerical Jacobian ------------------------------------------------------------

def test_numeric_jacobian_helper_equals_the_exact_jacobian_of_a_polynomial_model():
    from symquad.numeric.special_derivatives import numeric_jacobian_function
    model = sq.Model(3, 2, 0.5, noise=0.1, lr_readout=0.2, weight_decay=0.01)
    k = sq.kernels(model)
    Q, rho, T = random_overlaps(3, 2, np.random.default_rng(1))
    a = np.array([1.0, 0.8, 1.2])
    num = numeric_jacobian_function(k)(Q, rho, T, a)
    for i, (exact, tol) in enumerate(((k.jacobian, 1e-10), (k.risk_gradient, 1e-10),
                                      (k.risk_hessian, 1e-8))):
        ref = exact(Q, rho, T, a)
        assert np.max(np.abs(num[i] - ref)) < tol * np.max(np.abs(ref)), i


def test_erf_risk_gradient_equals_the_closed_derivative():
    """∂ε/∂C_ab = w_a w_b E[σ'(u_a)σ'(u_b)] off the diagonal (Price), J₂ in closed form."""
    p, ps = 3, 2
    Q, rho, T, a, b = _kinds_point(p, ps, seed=2)
    model = sq.Model(p, ps, 0.5, readout=tuple(a), teacher_readout=tuple(b), **ERF)
    g = sq.kernels(model).risk_gradient(Q, rho, T)
    lay = model_layout = sq.kernels(model).layout
    C = np.block([[Q, rho], [rho.T, T]])
    w = np.concatenate([a, -b])

    def J2(i, j):
        return 2 / np.pi / np.sqrt((1 + C[i, i]) * (1 + C[j, j]) - C[i, j] ** 2)
    checked = 0
    for idx, name in enumerate(model_layout.names):
        kind, _, rest = name.partition("_")
        i, j = (int(x) - 1 for x in rest.split("_"))
        if kind == "Q" and i != j:
            ref = w[i] * w[j] * J2(i, j)
        elif kind == "rho":
            ref = w[i] * w[p + j] * J2(i, p + j)
        else:
            continue
        assert abs(g[idx] - ref) < 1e-9 * max(1.0, abs(ref)), name
        checked += 1
    assert checked == 3 + 6 and lay.dim == 12


def test_a_state_outside_the_cone_gives_nan_not_an_exception():
    """I + C_FF singular (far outside the covariances, a diverging SDE run): NaN, reported."""
    C = np.array([[-1.0, 0.0], [0.0, 1.0]])
    factor, A = sd.fold(C, np.array([[0]]))
    assert np.all(np.isnan(factor)) and np.all(np.isnan(A))
