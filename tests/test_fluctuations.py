"""The linear-noise approximation against the exact reduced SGD simulator's replica spread.

The replicas start from one informed start (Σ(0) = 0), so their spread is the SGD
noise alone.  At each recorded time the replicas' risk variance s² is compared with
the predicted σ² = ∇εᵀΣ∇ε/N: the standard error of s² comes from the sample fourth
moment (no normality assumed), the precision is asserted first, and the largest
|s² − σ²|/se over the times must stay below the Bonferroni-corrected normal quantile
(family level 0.01).  The same data against the prediction at 2N must fail.
"""

import numpy as np
import pytest
from scipy.stats import norm

import symquad as sq
from symquad.numeric.fluctuations import fluctuations, random_start_covariance
from symquad.numeric.layout import state_layout

ALPHA = 0.01


def informed_start(p, p_star, seed=1):
    rng = np.random.default_rng(seed)
    rho = 0.5 * np.linalg.qr(rng.standard_normal((p, p_star)))[0] * np.sqrt(p / p_star)
    return rho @ rho.T + 0.3 * np.eye(p), rho


def variance_z(samples, predicted_var):
    """``(s² − σ²)/se(s²)`` per time, and the relative precision ``se/σ²``."""
    R = samples.shape[0]
    centred = samples - samples.mean(axis=0)
    s2 = (centred**2).sum(axis=0) / (R - 1)
    m4 = (centred**4).mean(axis=0)
    se = np.sqrt(np.maximum(m4 - s2**2 * (R - 3) / (R - 1), 0) / R)
    return (s2 - predicted_var) / se, se / predicted_var


def spread_check(model, N, replicas, t_max, seed, n_times=6, against_N=None, form=None):
    Q0, rho0 = informed_start(model.p, model.p_star)
    T = np.eye(model.p_star)
    times = np.linspace(0.0, t_max, n_times + 1)
    fl = fluctuations(model, Q0, rho0, T, N, times, form=form, second_order=False)
    run = sq.simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed, Q0=Q0, rho0=rho0,
                      T=T, t_eval=times)
    assert run.n_diverged == 0
    # the ODE is the replicas' mean (to O(1/N))
    assert np.max(np.abs(run.risk.mean(0) - fl.risk)) < 5 * np.max(run.risk.std(0)) / np.sqrt(
        replicas) + 1e-3 * np.max(fl.risk)
    pred = fl if against_N is None else fl.at(against_N)
    z, rel = variance_z(run.risk[:, 1:], pred.risk_std[1:] ** 2)
    assert np.max(rel) < 0.25, f"replica variance too imprecise: {np.max(rel):.2f}"
    return float(np.max(np.abs(z))), norm.ppf(1 - ALPHA / (2 * n_times))


CASES = [
    (sq.Model(4, 2, 0.3, noise=0.1), 1000, 300, 6.0),
    (sq.Model(8, 2, 0.3), 1000, 200, 6.0),
    (sq.Model(4, 2, 0.1, activation="z + z**2"), 1000, 200, 6.0),
]


# (8, 2) at N = 1000 costs 13 s: in the slow run (with N = 10^4 in the test below)
@pytest.mark.parametrize("model, N, replicas, t_max",
                         [c if c[0].p < 8 else pytest.param(*c, marks=pytest.mark.slow)
                          for c in CASES], ids=repr)
def test_linear_noise_spread_matches_sgd_replicas(model, N, replicas, t_max):
    z, critical = spread_check(model, N, replicas, t_max, seed=7)
    assert z < critical, f"max |s² − σ²| = {z:.2f} s.e. > {critical:.2f}"


def test_linear_noise_check_has_power():
    """The same SGD data against the prediction for 2N (half the variance) fails."""
    model, N, replicas, t_max = CASES[0]
    z, critical = spread_check(model, N, replicas, t_max, seed=7, against_N=2 * N)
    assert z > 2 * critical


@pytest.mark.slow
@pytest.mark.parametrize("model", [CASES[0][0], CASES[1][0], CASES[2][0],
                                   sq.Model(4, 2, 0.2, batch_size=2, lr_readout=0.2,
                                            weight_decay=0.05)],
                         ids=repr)
@pytest.mark.parametrize("N", [1000, 10_000])
def test_linear_noise_spread_matches_sgd_replicas_large(model, N):
    z, critical = spread_check(model, N, 600, 10.0, seed=8, n_times=10)
    assert z < critical


def test_sphere_linear_noise_spread():
    model = sq.Model(3, 2, 0.2, constraint="sphere", noise=0.1)
    rho = np.array([[0.6, 0.2], [-0.3, 0.5], [0.4, -0.4]])
    Q = rho @ rho.T + np.diag(1 - np.sum(rho**2, 1))
    times = np.linspace(0, 5, 6)
    fl = fluctuations(model, Q, rho, np.eye(2), 1000, times, second_order=False)
    run = sq.simulate(model, N=1000, t_max=5, replicas=300, seed=4, Q0=Q, rho0=rho,
                      T=np.eye(2), t_eval=times)
    z, rel = variance_z(run.risk[:, 1:], fl.risk_std[1:] ** 2)
    assert np.max(rel) < 0.25
    assert np.max(np.abs(z)) < norm.ppf(1 - ALPHA / 10)
    # the diagonal of Q does not fluctuate on the sphere
    assert np.max(fl.Q_std[:, np.arange(3), np.arange(3)]) < 1e-8


def test_random_start_covariance_is_the_exact_initial_law():
    """N Cov[X(0)] of simulated random starts (T ≠ I) against random_start_covariance."""
    model = sq.Model(3, 2, 0.1)
    T = np.array([[1.0, 0.3], [0.3, 0.6]])
    N = 4000
    run = sq.simulate(model, N=N, t_max=1.0 / N, replicas=4000, seed=2, T=T, t_eval=[0.0])
    lay = state_layout(model)
    X = lay.pack(run.Q[:, 0], run.rho[:, 0])
    cov = np.cov(X.T) * N
    S = random_start_covariance(model, T)
    se = np.sqrt((np.diag(cov)[:, None] * np.diag(cov)[None, :] + cov**2) / X.shape[0])
    assert np.max(np.abs(cov - S) / se) < 5
    # and the LNA from the mean of that start carries it: Σ(0) = S
    fl = fluctuations(model, None, None, T, N, [0.0, 0.5], start="random")
    np.testing.assert_allclose(fl.covariance[0], S, atol=1e-12)


def test_fixed_start_has_no_spread_at_t0_and_bad_input_is_refused():
    model = sq.Model(2, 1, 0.2)
    Q0, rho0 = informed_start(2, 1)
    fl = fluctuations(model, Q0, rho0, np.eye(1), 500, [0.0, 1.0])
    assert fl.risk_std[0] == 0 and fl.risk_std[1] > 0
    assert fl.state_covariance.shape == (2, 5, 5)
    # Σ does not depend on N; Var ε = first/N + second/N²: doubling N divides the std by
    # a factor between √2 and 2
    twice = fl.at(1000)
    np.testing.assert_array_equal(twice.covariance, fl.covariance)
    ratio = fl.risk_std[1] / twice.risk_std[1]
    assert np.sqrt(2) - 1e-12 <= ratio <= 2 + 1e-12
    with pytest.raises(ValueError, match="start must be one of"):
        fluctuations(model, Q0, rho0, np.eye(1), 500, [0.0, 1.0], start="wishart")
    with pytest.raises(TypeError, match="N must be"):
        fluctuations(model, Q0, rho0, np.eye(1), 500.0, [0.0, 1.0])
    with pytest.raises(ValueError, match="t_eval"):
        fluctuations(model, Q0, rho0, np.eye(1), 500, [1.0, 0.5])
    with pytest.raises(ValueError, match="start='random'"):
        fluctuations(model, Q0, rho0, np.eye(1), 500, [0.0, 1.0], start="random")
