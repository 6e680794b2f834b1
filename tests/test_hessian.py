"""Weight-space Hessian of the population risk at the critical points (issue 5, parts 1-2).

Three routes are compared:

* exact reduced blocks from the risk that ``sq.derive`` derives (chain rule in the
  effective coordinates, :func:`symquad.symbolic.hessian.hessian_blocks`);
* hand-derived closed forms in ``(p, p*, N)`` (:func:`spectrum_formulas`);
* the Hessian of the actual ``p·N``-dimensional risk (kernel risk at ``WWᵀ/N``,
  Richardson central differences) at randomly oriented critical weights.
"""

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from symquad.numeric import landscape as L
from symquad.symbolic import hessian as H

# p < p*, p = p*, p > p* (and p* = 1, 2, 3)
SIZES = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (2, 3), (4, 1)]
NUMERIC_CASES = [(1, 1, 4), (1, 2, 6), (2, 2, 7), (3, 2, 8), (2, 3, 9), (4, 1, 9), (3, 3, 8)]


def _model(p, k):
    return sq.Model(p=p, p_star=k, lr=0.1)


@pytest.mark.parametrize("p,k", SIZES)
@pytest.mark.parametrize("point", H.POINTS)
def test_exact_blocks_match_closed_forms(p, k, point):
    m = _model(p, k)
    blocks = H.hessian_blocks(m, point)
    for N in (p + k + 1, p + k + 5):
        assert blocks.spectrum(N) == H.formula_spectrum(m, point, N)
        regime = None if point != "minimum" else ("over" if p >= k else "under")
        counts = H.count_formulas(point, regime)
        sub = {H.P_SYM: p, H.P_STAR_SYM: k, H.N_SYM: N}
        expected = tuple(int(counts[s].subs(sub)) for s in ("negative", "zero", "positive"))
        assert blocks.counts(N) == expected
        assert sum(expected) == p * N


@pytest.mark.parametrize("p,k,N", NUMERIC_CASES)
@pytest.mark.parametrize("point", H.POINTS)
def test_numeric_hessian_matches_symbolic(p, k, N, point):
    m = _model(p, k)
    W, Wstar = L.critical_weights(m, point, N, seed=p + 10 * k + 100 * N)
    Hn = L.weight_hessian(m, W, Wstar)
    assert np.allclose(Hn, Hn.T)
    ev = np.linalg.eigvalsh(Hn)
    ev_sym = sq.hessian_spectrum(m, point, N)
    assert ev_sym.shape == (p * N,)
    scale = np.max(np.abs(ev_sym))
    assert np.max(np.abs(ev - ev_sym)) < 1e-8 * scale
    assert L.sign_counts(ev) == H.hessian_blocks(m, point).counts(N)


@pytest.mark.parametrize("p,k,N", NUMERIC_CASES[:5])
@pytest.mark.parametrize("point", H.POINTS)
def test_constructed_points_are_critical(p, k, N, point):
    """Central differences (Richardson) give the exact gradient of the quartic risk."""
    m = _model(p, k)
    W, Wstar = L.critical_weights(m, point, N, seed=3)
    x0 = W.ravel()

    def grad(h):
        E = np.eye(x0.size) * h
        plus = L.weight_risk(m, (x0 + E).reshape(-1, *W.shape), Wstar)
        minus = L.weight_risk(m, (x0 - E).reshape(-1, *W.shape), Wstar)
        return (plus - minus) / (2 * h)

    g = (4 * grad(0.05) - grad(0.1)) / 3
    assert np.max(np.abs(g)) < 1e-10
    # and a non-critical point is detected as such (the check can fail)
    Wbad = W + 0.1 * np.random.default_rng(0).standard_normal(W.shape)
    x0 = Wbad.ravel()
    assert np.max(np.abs((4 * grad(0.05) - grad(0.1)) / 3)) > 1e-4


@pytest.mark.parametrize("p,k", [(1, 1), (2, 1), (3, 2), (2, 3), (4, 2)])
def test_plateau_escape_direction_gives_gradient_flow_rate(p, k):
    """−η N λ_min at the plateau equals the O(η) growth rate of ρ from the ODE kernel."""
    m = _model(p, k)
    lam_min = min(H.hessian_blocks(m, "plateau").parallel_eigenvalues)   # = N λ_min
    fp = L.plateau(m)
    assert abs(-m.eta * float(lam_min) - fp.rate_gradient_flow) < 1e-10
    # the plateau norm of the Hessian point is the ODE's gradient-flow plateau
    X, _, _ = H.effective_point(m, "plateau")
    assert abs(float(X[0, k]) ** 2 - fp.q_gradient_flow) < 1e-10


@pytest.mark.parametrize("p,k", SIZES)
def test_zero_modes_tangent_and_extra(p, k):
    N = p + k + 3
    plateau = H.hessian_blocks(_model(p, k), "plateau").zero_modes(N)
    # every plateau zero mode is a rotation: the plateau manifold is a Stiefel orbit
    assert plateau == {"tangent": p * (N - k) - p * (p + 1) // 2, "extra": 0}
    minimum = H.hessian_blocks(_model(p, k), "minimum").zero_modes(N)
    if p >= k:
        # tangent = dimension of the zero-risk manifold computed by the invariants module
        assert minimum["tangent"] == sq.manifold_dimension(p, k)
        assert minimum["extra"] == (p - k) * (N - k)
    else:
        assert minimum == {"tangent": p * k - p * (p + 1) // 2, "extra": 0}
    assert H.hessian_blocks(_model(p, k), "origin").zero_modes(N) == {"tangent": 0, "extra": 0}


def test_signs_of_the_theory():
    """docs/model.md §8.5: max at 0, saddle at the plateau, marginal minima."""
    for p, k in SIZES:
        N = p + k + 2
        neg, zero, pos = H.hessian_blocks(_model(p, k), "origin").counts(N)
        assert (neg, zero, pos) == (p * N, 0, 0)
        neg, zero, pos = H.hessian_blocks(_model(p, k), "plateau").counts(N)
        assert neg == p * k and zero > 0 and pos > 0   # p·p* negative: independent of N
        neg, zero, pos = H.hessian_blocks(_model(p, k), "minimum").counts(N)
        assert neg == 0 and pos > 0
        # docs/model.md §8.3: for p >= p* the manifold is positive-dimensional iff p > 1;
        # for p < p* the minima form a Stiefel orbit of dimension p p* − p(p+1)/2 > 0
        assert (zero > 0) == (p > 1 if p >= k else True)


def test_under_parameterised_minimum_is_a_minimum():
    """For p < p*, local minimisation of the N-dimensional risk from nearby random
    starts ends at the risk of the constructed point (not lower)."""
    from scipy.optimize import minimize
    m = _model(1, 3)
    eps_min = L.minimum_risk(m)
    rng = np.random.default_rng(5)
    W0, Wstar = L.critical_weights(m, "minimum", 6, seed=1)
    for _ in range(3):
        x0 = (W0 + 0.3 * rng.standard_normal(W0.shape)).ravel()
        res = minimize(lambda x: float(L.weight_risk(m, x.reshape(W0.shape), Wstar)), x0,
                       method="BFGS", options={"gtol": 1e-10})
        assert res.fun == pytest.approx(eps_min, rel=1e-7)
    assert eps_min > 0


def test_bad_input():
    m = _model(2, 1)
    with pytest.raises(ValueError, match="point"):
        sq.hessian_spectrum(m, "saddle", 5)
    with pytest.raises(ValueError, match="N must be"):
        sq.hessian_spectrum(m, "plateau", 2)
    with pytest.raises(ValueError, match="N must be"):
        L.critical_weights(m, "plateau", 2)
    with pytest.raises(ValueError, match="activation"):
        H.hessian_blocks(sq.Model(p=2, p_star=1, lr=0.1, activation=(0, 1, 1)), "origin")
    with pytest.raises(ValueError, match="regime"):
        H.spectrum_formulas("minimum")


def test_exact_eigenvalues_are_exact():
    """Exact rational eigenvalues (not floats), and multiplicities add up."""
    b = H.hessian_blocks(_model(3, 2), "plateau")
    assert all(isinstance(v, sp.Rational) for v in b.parallel_eigenvalues)
    assert sum(b.parallel_eigenvalues.values()) == 3 * b.r
    assert sum(b.perp_eigenvalues.values()) == 3


@pytest.mark.parametrize("p,k,lr,conv", [(3, 2, 0.1, "fixed"), (4, 1, 0.1, "width")])
def test_ode_plateau_is_not_a_critical_point_of_the_risk(p, k, lr, conv):
    """The ODE's plateau (η² term included) has q > p/(p+2): the risk gradient does not
    vanish there (it balances the η² term), yet −η N ∂²ε along a teacher direction is
    still the ODE's growth rate of ρ at that point."""
    m = sq.Model(p=p, p_star=k, lr=lr, lr_scaling=conv)
    fp = L.plateau(m)
    N = p + k + 2
    rng = np.random.default_rng(0)
    O, _ = np.linalg.qr(rng.standard_normal((N, N)))
    O = O.T
    Wstar = np.sqrt(N) * O[:k]
    W = np.sqrt(N * fp.q) * O[k:k + p]

    def risk_along(V, s):
        return float(L.weight_risk(m, W + s * V, Wstar))

    radial = W / np.linalg.norm(W)
    h = 1e-3
    slope = (risk_along(radial, h) - risk_along(radial, -h)) / (2 * h)
    assert slope > 1e-3                      # not critical: the risk wants smaller q
    V = np.zeros_like(W)
    V[0] = O[0]                              # unit 1 toward teacher direction 1
    curv = (risk_along(V, h) - 2 * risk_along(V, 0) + risk_along(V, -h)) / h ** 2
    assert -m.eta * N * curv == pytest.approx(fp.rate, rel=1e-5)
    assert fp.q > fp.q_gradient_flow
