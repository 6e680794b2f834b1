"""Batched ODE integration (symquad.numeric.ode_batch) against one-by-one integration."""

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.ode_batch import integrate_batch

from conftest import random_overlaps


def test_batch_equals_one_by_one_integration():
    """Each start of one vectorised solve follows its own single `integrate` trajectory."""
    m = sq.Model(p=3, p_star=2, lr=0.3, noise=0.1)
    rng = np.random.default_rng(4)
    starts = [random_overlaps(3, 2, rng, scale=0.5) for _ in range(5)]
    T = starts[0][2]
    Q0 = np.stack([s[0] for s in starts])
    # same T for all: rebuild rho so that every Gram matrix stays PSD
    rho0 = np.stack([0.3 * s[1] for s in starts])
    t_eval = np.linspace(0, 15, 31)
    batch = integrate_batch(m, Q0, rho0, T, 15.0, t_eval, rtol=1e-10, atol=1e-12)
    assert batch.n_diverged == 0 and list(batch.status) == ["ok"] * 5
    assert batch.Q.shape == (5, 31, 3, 3) and batch.risk.shape == (5, 31)
    for b in range(5):
        one = sq.integrate(m, Q0[b], rho0[b], T, 15.0, t_eval, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batch.Q[b], one.Q, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(batch.rho[b], one.rho, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(batch.risk[b], one.risk, rtol=1e-7, atol=1e-9)


def test_per_start_divergence_is_reported_and_does_not_stop_the_others():
    m = sq.Model(p=2, p_star=1, lr=0.3)
    qs = (1.0, 3.0, 10.0, 0.5)
    Q0 = np.stack([q * np.eye(2) for q in qs])
    rho0 = 0.1 * np.ones((4, 2, 1))
    t_eval = np.linspace(0, 20, 201)
    batch = integrate_batch(m, Q0, rho0, np.eye(1), 20.0, t_eval)
    assert list(batch.status) == ["ok", "diverged", "diverged", "ok"]
    for b, q in enumerate(qs):
        one = sq.integrate(m, Q0[b], rho0[b], np.eye(1), 20.0, t_eval, on_divergence="stop")
        if one.status == "ok":
            assert np.isnan(batch.t_diverged[b])
            np.testing.assert_allclose(batch.risk[b], one.risk, rtol=1e-6, atol=1e-9)
            np.testing.assert_array_equal(batch.last_finite["Q"][b], batch.Q[b, -1])
        else:
            # the blow-up time of a start: as fast as the single solve resolves it
            assert abs(batch.t_diverged[b] - one.t_diverged) < 1e-3 * one.t_diverged
            after = batch.t >= batch.t_diverged[b]
            assert np.all(np.isnan(batch.risk[b, after]))
            assert np.all(np.isfinite(batch.risk[b, ~after]))
            assert batch.last_finite["t"][b] < batch.t_diverged[b]
    assert "DIVERGED: 2/4" in batch.summary()


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(Q0=np.eye(3)), ValueError, r"Q0 must have shape \(B, p, p\)"),
    (dict(rho0=np.zeros((2, 2, 2))), ValueError, "rho0 must have shape"),
    (dict(Q0=np.stack([np.eye(2)] * 3)), ValueError, "same number of starts"),
    (dict(Q0=np.stack([np.eye(2), -np.eye(2)])), ValueError, "start 1 .* positive semi-definite"),
    (dict(t_max=-1.0), ValueError, "t_max"),
    (dict(method="Euler"), ValueError, "method must be one of"),
    (dict(max_norm=0.0), ValueError, "max_norm"),
])
def test_bad_input_names_parameter(kwargs, err, match):
    args = dict(Q0=np.stack([np.eye(2)] * 2), rho0=np.zeros((2, 2, 1)), T=np.eye(1),
                t_max=1.0)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        integrate_batch(sq.Model(p=2, p_star=1, lr=0.1), **args)
