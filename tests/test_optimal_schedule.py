r"""``optimal_schedule``: the adjoint gradient, the closed-form optimum, the refusals.

Independent routes: central finite differences of the risk at ``t_final`` (the test's
check of the adjoint gradient only; the method uses none), the pointwise optimum of the
linear model ``dε/dt = −(2η − η²)ε + ½η²Δ`` (η* = 2ε/(2ε + Δ)), and the symbolic drift's
degree in ``η`` (the polynomial structure the method's ``∂f/∂η`` relies on).
"""

import numpy as np
import pytest
import sympy as sp
from scipy.integrate import solve_ivp

import symquad as sq
from symquad.numeric.layout import state_layout
from symquad.numeric.optimal import _Problem
from symquad.symbolic.symbols import ETA

LINEAR = sq.Model(p=1, p_star=1, lr=0.5, activation="z", noise=0.5)


@pytest.mark.parametrize("model", [
    sq.Model(p=2, p_star=1, lr=0.1, noise=0.3, weight_decay=0.1, batch_size=2),
    sq.Model(p=2, p_star=1, lr=0.1, constraint="sphere", weight_decay=0.1),
    sq.Model(p=2, p_star=1, lr=0.1, lr_readout=0.2, activation="z**3 + z")])
def test_the_derived_drift_is_a_polynomial_of_degree_2_in_eta(model):
    eq = sq.derive(model, form="entries")
    for expr in list(eq.dQ) + list(eq.drho) + ([] if eq.da is None else list(eq.da)):
        assert sp.Poly(sp.expand(expr), ETA).degree() <= 2


def test_adjoint_gradient_equals_finite_differences_of_the_final_risk():
    m = sq.Model(p=2, p_star=1, lr=0.2, noise=0.2, weight_decay=0.05)
    rho0 = np.array([[0.4], [0.2]])
    x0 = state_layout(m).pack(np.eye(2), rho0)
    prob = _Problem(m, x0, np.eye(1), np.linspace(0, 4, 5), 1e-11, 1e-13)
    etas = np.array([0.3, 0.1, 0.25, 0.15])
    value, grad = prob.value_and_gradient(etas)
    h = 1e-5
    fd = []
    for j in range(etas.size):
        up, dn = etas.copy(), etas.copy()
        up[j] += h
        dn[j] -= h
        fd.append((prob.risk(prob.forward(up, dense=False)[0])
                   - prob.risk(prob.forward(dn, dense=False)[0])) / (2 * h))
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9)
    assert np.max(np.abs(grad)) > 1e-3               # a gradient worth testing


def _closed_form(t_final, delta=0.5, eps0=1.0):
    sol = solve_ivp(lambda t, e: -2 * e ** 2 / (2 * e + delta), (0, t_final), [eps0],
                    rtol=1e-12, atol=1e-15)
    return float(sol.y[0, -1])


def test_linear_model_reaches_the_closed_form_optimum_cheap():
    t_final = 6.0
    star = _closed_form(t_final)
    res = sq.optimal_schedule(LINEAR, t_final, Q0=[[1.0]], rho0=[[0.0]], T=[[1.0]],
                              lr_max=1.0, n_pieces=6, rtol=1e-9)
    # a piecewise-constant schedule can only be worse than the continuous optimum
    assert res.risk_final >= star * (1 - 1e-6)
    assert res.risk_final <= 1.02 * star
    assert res.risk_final < 0.8 * res.risk_start
    # and decreasing, like eta*(t) = 2 eps/(2 eps + Delta)
    assert np.all(np.diff(res.lr) <= 1e-6)
    assert "pieces" in repr(res)


@pytest.mark.slow
def test_linear_model_reaches_the_closed_form_optimum_to_one_percent_at_t50():
    star = _closed_form(50.0)
    assert star == pytest.approx(0.0055487, rel=1e-4)         # the background's number
    res = sq.optimal_schedule(LINEAR, 50.0, Q0=[[1.0]], rho0=[[0.0]], T=[[1.0]],
                              lr_max=1.0, n_pieces=40, rtol=1e-9)
    assert star * (1 - 1e-6) <= res.risk_final <= 1.01 * star


def test_refusals_name_the_parameter():
    kw = dict(Q0=[[1.0]], rho0=[[0.0]], T=[[1.0]])
    with pytest.raises(ValueError, match="lr_max"):
        sq.optimal_schedule(LINEAR, 10, **kw)
    with pytest.raises(ValueError, match="rho0"):
        sq.optimal_schedule(LINEAR, 10, lr_max=1.0)
    with pytest.raises(ValueError, match="n_pieces"):
        sq.optimal_schedule(LINEAR, 10, lr_max=1.0, n_pieces=10**6, **kw)
    with pytest.raises(ValueError, match="lr_schedule"):
        sq.optimal_schedule(LINEAR.replace(lr_schedule="inverse:3"), 10, lr_max=1.0, **kw)
    with pytest.raises(ValueError, match="t_final"):
        sq.optimal_schedule(LINEAR, -1, lr_max=1.0, **kw)


def test_figure_draws():
    from symquad.plotting import optimal_schedule_figure
    res = sq.optimal_schedule(LINEAR, 4.0, Q0=[[1.0]], rho0=[[0.0]], T=[[1.0]], lr_max=1.0,
                              n_pieces=2, rtol=1e-8, maxiter=3, greedy=False)
    fig = optimal_schedule_figure(res)
    assert len(fig.axes) == 2
    m = res.schedule_model()
    assert m.lr == res.lr[0] and m.schedule.family in ("step", "constant")
