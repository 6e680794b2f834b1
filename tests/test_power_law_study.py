"""The power-law study (symquad/studies/power_law.py, issue 24 item 5).

* The linear model's exact solution (``linear_block_risk``: the error system ``Ḋ = M D + c``
  solved through a symmetric eigendecomposition) equals the hand-written full block system
  of ``(Q^c, ρ^c)`` (tests/test_spectrum_solvers.py) solved by ``expm``, label noise included.
* The learning curve of the derived block ODE equals that exact solution to integration
  tolerance and gives the same fitted exponent.
* The truncation: exponents of the exact solution on a fixed window converge as ``L`` grows,
  towards the gradient-flow sum without truncation (``L = 10⁵``), whose exponent is
  ``γ_∞ = (α + β − 1)/α``.
* The quadratic network's plateau and growth rate under an isotropic two-block spectrum
  equal the isotropic plateau analysis (``sq.plateau``, derived closed form and root
  finding); under a power law the growth rate of ``ρ`` (finite differences of the kernels)
  is the one the integrated ODE shows from a small ``ρ``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm

import symquad as sq
from symquad.studies import power_law as pl
from test_spectrum_solvers import _linear_system


def test_the_exact_linear_risk_is_the_full_block_system():
    spectrum = sq.Model(1, 1, 1.0, spectrum="1/8:4,1/4:2,5/8:1/5").spectrum
    T = np.array([0.2, 0.3, 0.5])
    s = np.array([4.0, 2.0, 0.2])
    eta, noise = 0.3, 0.1
    A, c = _linear_system(1.0, 1.0, eta, noise, spectrum, T)
    fixed = np.linalg.solve(A, -c)
    Q0, rho0 = np.array([0.3, 0.2, 0.6]), np.array([0.05, -0.1, 0.2])
    t = np.linspace(0.0, 20.0, 11)
    X = np.array([expm(A * ti) @ (np.concatenate([Q0, rho0]) - fixed) + fixed for ti in t])
    full = 0.5 * (X[:, :3] - 2 * X[:, 3:] + T) @ s
    mine = pl.linear_block_risk(spectrum, T, eta, t, noise=noise, D0=Q0 - 2 * rho0 + T)
    np.testing.assert_allclose(mine, full, rtol=1e-12, atol=1e-15)


def test_the_block_ode_learning_curve_is_the_exact_one():
    res = pl.power_law_curve_study(alpha=2.0, L=8, teacher_exponent=1.0, lr=0.5, u_from=3.0,
                                  u_to=60.0, n_times=61)
    assert res["ode_status"] == "ok"
    assert res["max_error_exact"] < 1e-7, res["max_error_exact"]
    assert abs(res["exponent"] - res["exponent_exact"]) < 1e-5
    # the fitted exponent is that of the data: a least-squares line through log-log points
    u, risk = res["u"], res["risk"]
    use = (u >= 3.0) & (u <= 60.0)
    gamma = -np.polyfit(np.log(u[use]), np.log(risk[use]), 1)[0]
    assert res["exponent"] == pytest.approx(gamma, rel=1e-12)
    assert res["exponent_asymptotic"] == pytest.approx(1.0)
    assert res["t_unit"] * 2 * 0.5 * float(sq.power_law_spectrum(2.0, 8, 1.0)[0][0][1]) \
        == pytest.approx(1.0)


def _gradient_flow_exponent(alpha, beta, u):
    """The exponent of Σ_j j^{-(α+β)} e^{-j^{-α} u} (no truncation, η → 0) on `u`."""
    j = np.arange(1, 100_001, dtype=float)
    eps = np.array([np.sum(j ** -(alpha + beta) * np.exp(-j ** -alpha * x)) for x in u])
    return -np.polyfit(np.log(u), np.log(eps), 1)[0]


@pytest.mark.parametrize("alpha, beta", [(2.0, 0.0), (3.0, 1.0)])
def test_the_truncation_stops_mattering_once_l_to_the_alpha_is_beyond_the_window(alpha, beta):
    u = np.geomspace(10.0, 1000.0, 40)
    eta = 0.01                                   # near gradient flow: the O(eta) noise is small
    gammas = {}
    for L in (8, 32, 128, 256):
        spectrum, teacher = sq.power_law_spectrum(alpha, L, beta)
        s1 = float(spectrum[0][1])
        risk = pl.linear_block_risk(spectrum, teacher, eta, u / (2 * eta * s1))
        gammas[L] = pl.fit_exponent(u, risk, 10.0, 1000.0)[0]
    limit = _gradient_flow_exponent(alpha, beta, u)
    gaps = [abs(gammas[L] - limit) for L in (8, 32, 128, 256)]
    assert gaps == sorted(gaps, reverse=True), gammas        # converging with L
    assert gaps[-1] < 0.03 and gaps[0] > 0.1, (gammas, limit)
    assert abs(limit - pl.asymptotic_exponent(alpha, beta)) < 0.01


def test_the_isotropic_spectrum_has_the_isotropic_plateau_and_rate():
    res = pl.power_law_escape_study(alpha=0.0, L=2, p=2, p_star=1, lr=0.1, N=200, replicas=4,
                          n_times=41)
    fp = sq.plateau(sq.Model(2, 1, 0.1))
    assert res["plateau_risk"] == pytest.approx(float(fp.risk), rel=1e-8)
    assert res["rate"] == pytest.approx(float(fp.rate), rel=1e-6)
    assert res["plateau_norms"] == f"{float(fp.q) / 2:.6g}:{float(fp.q) / 2:.6g}"


def test_the_growth_rate_of_rho_is_the_integrated_one():
    """kappa (finite differences at the plateau) against the ODE from a tiny rho there."""
    m, T, _ = pl._model(2.0, 4, 0.0, "z**2", 2, 1, 0.1)
    Q, _, _, drift = pl._plateau(m, T, 2000.0)
    assert drift < 1e-10
    kappa = pl._rho_growth_rate(m, Q, T)
    rho0 = 1e-7 * np.random.default_rng(0).standard_normal((4, 2, 1))
    # rho enters Q only at second order: for t <= 30 the growth is linear to ~1e-5
    sol = sq.integrate(m, Q, rho0, T, 30.0, t_eval=[20.0, 30.0], rtol=1e-11, atol=1e-20)
    norms = np.sqrt(np.sum(sol.rho ** 2, axis=(1, 2, 3)))
    assert np.log(norms[1] / norms[0]) / 10.0 == pytest.approx(kappa, rel=1e-3)


def test_the_plateau_does_not_depend_on_the_spectrum():
    """Without weight decay and with tr Σ/N = 1, Q^c = f_c Q̄ (Q̄ the isotropic plateau) is a
    fixed point at ρ = 0: dQ^c = f_c s_c F_iso(Q̄) (Stein: Gb(c) = s_c Q^c H(Ω), Ω_Q = Q̄),
    so the plateau risk is the isotropic one and tr Q^c/p = f_c q."""
    res = pl.power_law_escape_study(alpha=2.0, L=4, p=2, p_star=1, lr=0.1, N=200, replicas=4,
                          n_times=41)
    fp = sq.plateau(sq.Model(2, 1, 0.1))
    assert res["plateau_risk"] == pytest.approx(float(fp.risk), rel=1e-8)
    norms = [float(v) for v in res["plateau_norms"].split(":")]
    np.testing.assert_allclose(norms, float(fp.q) / 4, rtol=1e-6)
    assert res["rate"] > 1.5 * float(fp.rate)          # but rho grows faster: the top block



def test_the_figures_draw_the_results_without_layout_problems():
    from symquad.plotting import layout_problems
    rows, curves = [], []
    u = np.concatenate([[0.0], np.geomspace(0.01, 600.0, 40)])
    for L in (4, 8):                   # results shaped like power_law_curve_study's
        risk = 0.5 * (1 + u) ** -0.5 * np.exp(-u / L ** 2)
        res = dict(u=u, risk=risk, truncation_u=float(L ** 2), exponent=1.0 / L,
                   exponent_exact=1.0 / L, exponent_asymptotic=0.5, alpha=2.0,
                   teacher_exponent=0.0, L=L)
        rows.append(res)
        curves.append((L, res))
    fig = sq.power_law_figure(curves, rows, (3.0, 60.0))
    assert layout_problems(fig) == []
    assert len(fig.axes[1].lines) >= 3              # ODE line, exact crosses, gamma_inf
    esc = dict(alpha=1.0, L=2, ode_median=10.0, ode_q05=8.0, ode_q95=13.0, escape_scale=9.0,
               sgd_median=9.5)
    fig = sq.power_law_escape_figure([esc, {**esc, "alpha": 2.0, "ode_median": 7.0,
                                           "ode_q05": 6.0, "ode_q95": 9.0}], 1000)
    assert layout_problems(fig) == []
