"""ODE integration: input validation, divergence reporting, and the phases of learning."""

import numpy as np
import pytest

import symquad as sq
from symquad import DEFAULT_MODEL
from symquad.numeric.errors import DivergenceError


def random_start(model, N, seed, q0=1.0):
    """Realised overlaps of w ~ N(0, q0 I), w* ~ N(0, I) in dimension N."""
    rng = np.random.default_rng(seed)
    W = np.sqrt(q0) * rng.standard_normal((model.p, N))
    Ws = rng.standard_normal((model.p_star, N))
    return W @ W.T / N, W @ Ws.T / N, Ws @ Ws.T / N


@pytest.mark.parametrize("bad, match", [
    (dict(Q0=np.eye(2)), r"Q0 must have shape \(3, 3\)"),
    (dict(rho0=np.zeros((2, 3))), r"rho0 must have shape \(3, 2\)"),
    (dict(Q0=np.array([[1, 0.5, 0], [0, 1, 0], [0, 0, 1.0]])), "Q0 must be symmetric"),
    (dict(Q0=-np.eye(3)), "positive semi-definite"),
    (dict(rho0=2 * np.ones((3, 2))), "positive semi-definite"),
    (dict(Q0=np.full((3, 3), np.nan)), "Q0 must be finite"),
    (dict(t_max=-1.0), r"t_max must be a finite number \(allowed range: \(0, 1e\+09\]\)"),
    (dict(on_divergence="ignore"), "on_divergence must be one of"),
])
def test_bad_input_names_the_parameter(bad, match):
    m = sq.Model(p=3, p_star=2, lr=0.1)
    kwargs = dict(Q0=np.eye(3), rho0=np.zeros((3, 2)), T=np.eye(2), t_max=1.0)
    kwargs.update(bad)
    with pytest.raises(ValueError, match=match):
        sq.integrate(m, **kwargs)


def test_divergence_is_reported_not_hidden():
    m = sq.Model(p=3, p_star=2, lr=4.0)
    args = (np.eye(3), 0.01 * np.ones((3, 2)), np.eye(2), 50.0)
    with pytest.raises(DivergenceError) as info:
        sq.integrate(m, *args)
    err = info.value
    assert 0 < err.t < 50 and "diverged at t =" in str(err)
    assert np.all(np.isfinite(err.last_finite["Q"])) and err.last_finite["t"] <= err.t
    assert err.partial.status == "diverged" and np.all(np.isfinite(err.partial.Q))
    sol = sq.integrate(m, *args, on_divergence="stop")
    assert sol.status == "diverged" and sol.t_diverged == pytest.approx(err.t)
    assert np.all(np.isfinite(sol.risk)) and sol.t[-1] <= sol.t_diverged


def test_eta_squared_term_matters_for_stability():
    """Without the η² term the flow would converge; with it, a large η blows up."""
    m = sq.Model(p=2, p_star=1, lr=2.5)
    sol = sq.integrate(m, np.eye(2), 0.3 * np.ones((2, 1)), np.eye(1), 200.0,
                       on_divergence="stop")
    assert sol.status == "diverged"
    small = sq.integrate(m.replace(lr=0.05), np.eye(2), 0.3 * np.ones((2, 1)), np.eye(1), 200.0)
    assert small.status == "ok" and small.risk[-1] < 1e-3 * small.risk[0]


def test_solution_shapes_and_matrix_vs_entries_kernels():
    m = sq.Model(p=3, p_star=2, lr=0.2, noise=0.1)
    Q0, rho0, T = random_start(m, 500, seed=1)
    a = sq.integrate(m, Q0, rho0, T, 30.0, t_eval=np.linspace(0, 30, 61))
    b = sq.integrate(m, Q0, rho0, T, 30.0, t_eval=np.linspace(0, 30, 61), form="entries")
    assert a.t.shape == (61,) and a.Q.shape == (61, 3, 3) and a.rho.shape == (61, 3, 2)
    assert a.risk.shape == (61,) and a.status == "ok"
    np.testing.assert_allclose(a.Q, b.Q, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(a.risk, b.risk, rtol=1e-6, atol=1e-9)
    # risk column equals the kernel's risk at the stored overlaps
    k = sq.kernels(m)
    assert a.risk[17] == pytest.approx(k.risk(a.Q[17], a.rho[17], T), rel=1e-12)


def gradient_flow_plateau_risk(p, p_star):
    """Risk at the gradient-flow plateau with T = I, derived by hand (independent route).

    At rho = 0 and Q = q I the flow dQ/dt ∝ −(a Q + 2 Q²/p) with a = q − 1
    vanishes at q = p/(p+2); then ε = ½ (a² + 2 (q²/p + 1/p*)).
    """
    q = p / (p + 2)
    a = q - 1
    return 0.5 * (a**2 + 2 * (q**2 / p + 1 / p_star))


def test_default_model_shows_norm_learning_plateau_and_escape():
    """From Q0 = I and rho0 of size 1/sqrt(N): fast norm relaxation, a plateau, an escape."""
    m = DEFAULT_MODEL
    N = 1_000_000
    rng = np.random.default_rng(3)
    rho0 = rng.standard_normal((m.p, m.p_star)) / np.sqrt(N)
    sol = sq.integrate(m, np.eye(m.p), rho0, np.eye(m.p_star), 600.0,
                       t_eval=np.linspace(0, 600, 1201))
    risk, t = sol.risk, sol.t
    rho_norm = np.linalg.norm(sol.rho, axis=(1, 2))
    eps_plateau = gradient_flow_plateau_risk(m.p, m.p_star)
    # 1. norm learning: risk drops from its start to the plateau value while rho stays tiny
    on_plateau = np.abs(risk - eps_plateau) < 0.03 * eps_plateau
    first = int(np.argmax(on_plateau))
    assert on_plateau.any() and abs(risk[0] - eps_plateau) > 0.05 * eps_plateau
    assert rho_norm[first] < 20 / np.sqrt(N)
    # 2. plateau: the risk stays there for a long stretch (>= 30 time units)
    last = first + int(np.argmin(on_plateau[first:]))
    assert t[last] - t[first] >= 30
    # 3. escape: overlaps with the teacher grow to O(1), the risk falls far below the plateau
    assert rho_norm[-1] > 0.5
    assert risk[-1] < 0.01 * eps_plateau
    assert np.all(np.diff(risk[last:]) < 1e-9)
