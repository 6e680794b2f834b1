"""ODE fixed points: the plateau, its rate, the zero-risk manifold (issue 5, part 3)."""

import subprocess
import sys

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from symquad.numeric import landscape as L
from symquad.symbolic import fixed_points as F
from symquad.symbolic.symbols import ETA, NOISE, P, P_STAR

MODELS = [
    sq.Model(p=1, p_star=1, lr=0.1),
    sq.Model(p=3, p_star=2, lr=0.1),
    sq.Model(p=2, p_star=3, lr=0.05, noise=0.3),
    sq.Model(p=4, p_star=2, lr=0.05, lr_scaling="width"),
    sq.Model(p=5, p_star=1, lr=0.02, lr_scaling="width", noise=1.0),
]


@pytest.mark.parametrize("m", MODELS, ids=repr)
def test_numeric_plateau_matches_closed_form(m):
    """Numeric (kernels, root finding, finite-difference Jacobian) vs SymPy closed form."""
    exact = F.plateau_solution(m)
    fp = L.plateau(m)
    assert fp.q == pytest.approx(float(exact.q), rel=1e-12)
    assert fp.risk == pytest.approx(float(exact.risk), rel=1e-12)
    assert fp.rate == pytest.approx(float(exact.rate), rel=1e-9)
    assert fp.q_gradient_flow == pytest.approx(float(exact.q_gradient_flow), rel=1e-12)
    assert fp.rate_gradient_flow == pytest.approx(float(exact.rate_gradient_flow), rel=1e-9)
    # Jacobian spectrum: κ (p p* times), λ_iso (once), λ_traceless (p(p+1)/2 − 1 times)
    p, k = m.p, m.p_star
    expected = np.sort(np.array([float(exact.rate)] * (p * k) + [float(exact.lambda_iso)]
                                + [float(exact.lambda_traceless)] * (p * (p + 1) // 2 - 1)))
    got = np.sort(fp.jacobian_eigenvalues.real)
    assert np.max(np.abs(fp.jacobian_eigenvalues.imag)) < 1e-9
    assert np.allclose(got, expected, rtol=1e-8, atol=1e-11)
    # the plateau is stable in Q and unstable in ρ (a saddle of the ODE)
    assert float(exact.lambda_iso) < 0 and float(exact.lambda_traceless) < 0 and fp.rate > 0


@pytest.mark.parametrize("m", MODELS[:4], ids=repr)
def test_symmetric_ansatz_consistent_and_routes_agree(m):
    """Entry-form ODE at Q = qI, ρ = 0, T = I: dQ ∝ I, dρ = 0, and the same S(q) as the
    width-independent matrix-form reduction."""
    check = F.check_symmetric_ansatz(m)
    assert check["offdiag_zero"] and check["diag_equal"] and check["drho_zero"]
    S = F.isotropic_reduction()["S"].subs({P: m.p, P_STAR: m.p_star})
    eq_eta, eq_noise = sq.derive(m).eta, sq.derive(m).noise
    assert sp.expand(check["S"] - S.subs({ETA: eq_eta, NOISE: eq_noise})) == 0


def test_gradient_flow_limit_closed_form():
    """Hand-derived gradient-flow values: q = p/(p+2), κ = 4η/(p p*), and η = lr·p
    removes p from the rate."""
    gen = F.plateau_solution()
    assert sp.simplify(gen.q_gradient_flow - P / (P + 2)) == 0
    assert sp.simplify(gen.rate_gradient_flow - 4 * ETA / (P * P_STAR)) == 0
    lr = sp.Symbol("lr", positive=True)
    assert sp.simplify(gen.rate_gradient_flow.subs(ETA, lr * P) - 4 * lr / P_STAR) == 0
    # the η² term raises the plateau norm and lowers the rate (sample values)
    for p, k in ((1, 1), (4, 2), (8, 3)):
        vals = {P: p, P_STAR: k, ETA: sp.Rational(1, 10), NOISE: 0}
        assert gen.q.subs(vals) > gen.q_gradient_flow.subs(vals)
        assert gen.rate.subs(vals) < gen.rate_gradient_flow.subs(vals)


@pytest.mark.parametrize("m", [MODELS[1], MODELS[3], MODELS[4]], ids=repr)
def test_ode_near_plateau_grows_at_the_predicted_rate(m):
    """Integrate the ODE (sq.integrate) from the plateau with a tiny ρ; fit the rate."""
    fp = L.plateau(m)
    rng = np.random.default_rng(2)
    rho0 = 1e-8 * rng.standard_normal((m.p, m.p_star))
    t_max = np.log(1e4) / fp.rate      # ρ grows to ~1e-4: still linear
    sol = sq.integrate(m, fp.Q, rho0, fp.T, t_max, t_eval=np.linspace(0, t_max, 200),
                       rtol=1e-11, atol=1e-16)
    assert sol.status == "ok"
    logn = np.log(np.linalg.norm(sol.rho.reshape(len(sol.t), -1), axis=1))
    slope = np.polyfit(sol.t, logn, 1)[0]
    assert slope == pytest.approx(fp.rate, rel=1e-7)
    # Q stays at the fixed point (it moves only at O(ρ²))
    assert np.max(np.abs(sol.Q - fp.Q)) < 1e-6
    # and the direction of ρ is unchanged (isotropic growth)
    d0 = sol.rho[0] / np.linalg.norm(sol.rho[0])
    d1 = sol.rho[-1] / np.linalg.norm(sol.rho[-1])
    assert np.max(np.abs(d0 - d1)) < 1e-6


def test_ode_relaxes_to_the_plateau_from_a_random_start():
    """Phase 1 of docs/model.md §8.1: Q relaxes to q I of the *full* ODE, not of gradient flow."""
    m = sq.Model(p=3, p_star=2, lr=0.1)
    fp = L.plateau(m)
    sol = sq.integrate(m, np.eye(3), np.zeros((3, 2)), np.eye(2), 200.0, rtol=1e-11, atol=1e-13)
    assert np.max(np.abs(sol.Q[-1] - fp.Q)) < 1e-8
    assert abs(sol.Q[-1][0, 0] - fp.q_gradient_flow) > 1e-2


def test_plateau_rejects_too_large_lr():
    with pytest.raises(ValueError, match="reduce lr"):
        L.plateau(sq.Model(p=1, p_star=1, lr=0.5))
    with pytest.raises(ValueError, match="activation"):
        L.plateau(sq.Model(p=2, p_star=1, lr=0.1, activation=(0, 1, 1)))


@pytest.mark.parametrize("p,k", [(1, 1), (2, 1), (2, 2),
                                 pytest.param(3, 1, marks=pytest.mark.slow),
                                 pytest.param(3, 2, marks=pytest.mark.slow)])
def test_solution_manifold_under_the_ode(p, k):
    m = sq.Model(p=p, p_star=k, lr=0.1)
    J, ev, rhs = F.solution_jacobian(m)
    assert all(v == 0 for v in rhs)                # Δ = 0: a fixed point
    assert ev.get(0, 0) == F.solution_zero_modes(p, k)
    assert ev.get(0, 0) - (p - k) * (p - k + 1) // 2 == sq.manifold_dimension(p, k)
    assert all(v < 0 for v in ev if v != 0)        # stable at lr = 0.1 ...
    thr = F.solution_stability_threshold(m)
    assert thr > sp.Rational(1, 10)
    _, ev_big, _ = F.solution_jacobian(m, eta=thr * sp.Rational(11, 10))
    assert any(v > 0 for v in ev_big)              # ... and unstable past the threshold
    # with label noise the solution is not a fixed point: dQ = (4η²Δ/p²) Q there
    _, _, rhs_noisy = F.solution_jacobian(m, noise=sp.Rational(1, 4))
    rho0 = sp.sqrt(sp.Rational(p, k)) * sp.eye(p, k)
    Q0 = rho0 * rho0.T
    expect = [sp.Rational(4, 100) * sp.Rational(1, 4) / p ** 2 * Q0[i, j]
              for i in range(p) for j in range(i, p)] + [0] * (p * k)
    assert [sp.simplify(a - b) for a, b in zip(rhs_noisy, expect)] == [0] * len(expect)


def test_noise_floor_is_linear_in_noise():
    """With Δ > 0 the ODE leaves the solution and settles at risk ∝ Δ (small Δ)."""
    floors = [L.noisy_floor(sq.Model(p=3, p_star=2, lr=0.1, noise=d)).risk[-1]
              for d in (0.01, 0.02)]
    assert floors[0] > 1e-5
    assert floors[1] / floors[0] == pytest.approx(2.0, rel=1e-3)
    assert L.noisy_floor(sq.Model(p=3, p_star=2, lr=0.1)).risk[-1] < 1e-12


@pytest.mark.parametrize("m", [MODELS[1], MODELS[2], MODELS[4]], ids=repr)
def test_rho_diffusion_symbolic_and_monte_carlo(m):
    q = 0.7
    exact = float(F.rho_diffusion_symbolic(m, sp.nsimplify(q)))
    assert L.rho_diffusion(m, q) == pytest.approx(exact, rel=1e-12)
    # Monte Carlo of η² (∂ℓ/∂λ_1)² ν_1² with independent λ ~ N(0, q), ν ~ N(0, 1)
    rng = np.random.default_rng(11)
    n = 400_000
    lam = np.sqrt(q) * rng.standard_normal((n, m.p))
    nu = rng.standard_normal((n, m.p_star))
    y = (nu ** 2).mean(1) + np.sqrt(m.noise) * rng.standard_normal(n)
    err = (lam ** 2).mean(1) - y
    x = m.eta ** 2 * (err * 2 * lam[:, 0] / m.p) ** 2 * nu[:, 0] ** 2
    se = x.std(ddof=1) / np.sqrt(n)
    assert se < 0.03 * exact
    assert abs(x.mean() - exact) < 4 * se


def test_numeric_runtime_does_not_import_sympy():
    code = ("import sys, symquad as sq; import symquad.numeric.landscape as L; "
            "m = sq.Model(p=2, p_star=1, lr=0.1); sq.plateau(m); "
            "assert 'sympy' not in sys.modules, 'sympy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
