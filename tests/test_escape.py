"""Escape-time law (issue 5, part 4): prediction vs ODE integration vs SGD.

The prediction (:func:`symquad.numeric.landscape.escape_prediction`) uses only the
plateau rate, one batched ODE run from a tiny ρ and the law of ρ(0); the
measurements integrate the ODE from realised random starts and run SGD
(reduced simulator).  Statistical comparisons first check their own standard
error (bootstrap of the median, fixed seeds).
"""

import math

import numpy as np
import pytest

import symquad as sq
from symquad.numeric import landscape as L

#: Stated accuracy of the escape-time law for medians (N >= 300): relative error.
REL_TOL = 0.05


def _median_se(x, seed=0, n_boot=400):
    x = np.asarray(x)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(x, size=(n_boot, x.size)), axis=1)
    return float(np.std(boots, ddof=1))


def test_paired_prediction_converges_to_the_ode():
    """Same ρ(0) directions: prediction − ODE shrinks with N (corrections O(1/√N))."""
    m = sq.Model(p=3, p_star=2, lr=0.1, lr_scaling="width")
    diffs = {}
    for N in (1000, 100_000):
        Q0, r0 = L.random_start(m, N, 48, seed=4)
        pred = L.escape_prediction(m, N, sgd_noise=False, Z=r0 * math.sqrt(N))
        t_ode = L.ode_escape_times(m, Q0, r0, 3 * pred.median)
        assert not np.isnan(t_ode).any()
        diffs[N] = pred.samples - t_ode
    assert np.abs(diffs[100_000]).max() < 0.01 * np.median(t_ode)
    assert np.abs(diffs[100_000]).mean() < 0.3 * np.abs(diffs[1000]).mean()


def test_log_n_law_of_the_ode():
    """ODE from ρ(0) = √(q0/N) Z with the same Z: t(N₂) − t(N₁) = log(N₂/N₁)/(2κ)."""
    m = sq.Model(p=4, p_star=2, lr=0.1, lr_scaling="width")
    kappa = L.plateau(m).rate
    Z = np.random.default_rng(3).standard_normal((16, m.p, m.p_star))
    Q0 = np.broadcast_to(np.eye(m.p), (16, m.p, m.p))
    times = [L.ode_escape_times(m, Q0, Z / math.sqrt(N), 80.0) for N in (1e4, 1e6)]
    gap = times[1] - times[0]
    assert np.allclose(gap, math.log(100) / (2 * kappa), rtol=2e-3)


def test_linear_shift_is_independent_of_delta():
    """The premise of the law: t_c(δZ) + log(δ)/κ does not depend on the small δ."""
    m = sq.Model(p=2, p_star=1, lr=0.1)
    a = L.escape_prediction(m, 1000, n_samples=16, delta=1e-4, sgd_noise=False)
    b = L.escape_prediction(m, 1000, n_samples=16, delta=1e-6, sgd_noise=False)
    assert np.allclose(a.samples, b.samples, rtol=1e-4)
    c = L.escape_prediction(m, 1000, n_samples=16, delta=1e-1, sgd_noise=False)
    assert not np.allclose(a.samples, c.samples, rtol=1e-3)   # a large δ is not linear


def test_prediction_vs_ode_unpaired_median():
    m = sq.Model(p=2, p_star=1, lr=0.1, lr_scaling="width")
    N = 3000
    pred = L.escape_prediction(m, N, sgd_noise=False, n_samples=200, seed=1)
    Q0, r0 = L.random_start(m, N, 200, seed=2)
    t_ode = L.ode_escape_times(m, Q0, r0, 3 * pred.median)
    se = math.hypot(_median_se(pred.samples), _median_se(t_ode))
    assert se < 0.03 * pred.median
    diff = pred.median - np.median(t_ode)
    assert abs(diff) < 3 * se
    assert abs(diff) < REL_TOL * np.median(t_ode)


def _sgd_escape(m, N, replicas, seed, t_max):
    run = sq.simulate(m, N=N, t_max=t_max, replicas=replicas, seed=seed, method="reduced",
                      t_eval=np.linspace(0, t_max, 801))
    assert (run.status == "ok").all()
    return L.escape_times(run.t, run.risk, L.escape_threshold(m))


def test_prediction_vs_sgd_cheap():
    m = sq.Model(p=2, p_star=1, lr=0.1, lr_scaling="width")
    N = 300
    pred = L.escape_prediction(m, N, n_samples=256, seed=0)
    assert pred.seed_noise > 0
    t_sgd = _sgd_escape(m, N, 160, 7, 2.5 * pred.median)
    assert not np.isnan(t_sgd).any()
    se = math.hypot(_median_se(pred.samples), _median_se(t_sgd))
    assert se < 0.04 * pred.median
    diff = pred.median - np.median(t_sgd)
    assert abs(diff) < 3 * se
    assert abs(diff) < REL_TOL * np.median(t_sgd)


SLOW_GRID = [(k, p, conv, N) for k in (1, 2, 3) for p in sorted({k, 4, 8})
             for conv in ("fixed", "width") for N in (200, 2000)]


@pytest.mark.slow
@pytest.mark.parametrize("k,p,conv,N", SLOW_GRID)
def test_prediction_vs_sgd_grid(k, p, conv, N):
    m = sq.Model(p=p, p_star=k, lr=0.1, lr_scaling=conv)
    pred = L.escape_prediction(m, N, n_samples=256, seed=0)
    t_sgd = _sgd_escape(m, N, 128, 11, 2.5 * pred.median)
    assert np.isnan(t_sgd).mean() < 0.05
    t_sgd = t_sgd[~np.isnan(t_sgd)]
    se = math.hypot(_median_se(pred.samples), _median_se(t_sgd))
    assert se < 0.05 * pred.median
    diff = pred.median - np.median(t_sgd)
    assert abs(diff) < max(3 * se, REL_TOL * np.median(t_sgd))


def test_bad_input():
    m = sq.Model(p=2, p_star=1, lr=0.1)
    with pytest.raises(ValueError, match="N must be"):
        sq.escape_time(m, 0)
    with pytest.raises(ValueError, match="q0"):
        sq.escape_time(m, 100, q0=-1.0)
    with pytest.raises(ValueError, match="Z must have shape"):
        L.escape_prediction(m, 100, Z=np.zeros((3, 1, 2)))
    with pytest.raises(ValueError, match="fraction"):
        L.escape_threshold(m, 1.5)
    with pytest.raises(ValueError, match="reduce lr"):
        sq.escape_time(sq.Model(p=1, p_star=1, lr=0.6), 100)
