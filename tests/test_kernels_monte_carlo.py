"""Generated kernels against Monte Carlo estimates of their defining expectations.

The Monte Carlo side is written directly from the definitions of docs/model.md in numpy
(network, loss, SGD increment), independently of the symbolic code:

    N ΔQ = −η (g λᵀ + λ gᵀ) + η² g gᵀ,   N Δρ = −η g νᵀ,   g_k = δ σ'(λ_k)/p,
    δ = ŷ − y,  ε = ½ (ŷ − y_clean)²,   (λ, ν) ~ N(0, C), ξ ~ N(0, 1).
"""

import numpy as np
import pytest
from numpy.polynomial import Polynomial

import symquad as sq
from conftest import random_overlaps


def mc_estimates(model, Q, rho, T, n, rng, chunk=100_000):
    """Mean and standard error of (N ΔQ, N Δρ, risk) from n samples."""
    p, k = model.p, model.p_star
    sigma = Polynomial([float(c) for c in model.activation])
    dsigma = sigma.deriv()
    C = np.block([[Q, rho], [rho.T, T]])
    L = np.linalg.cholesky(C)
    sums = None
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        z = rng.standard_normal((m, p + k)) @ L.T
        lam, nu = z[:, :p], z[:, p:]
        xi = rng.standard_normal(m)
        yhat = sigma(lam).mean(axis=1)
        clean = sigma(nu).mean(axis=1)
        delta = yhat - clean - np.sqrt(model.noise) * xi
        g = delta[:, None] * dsigma(lam) / p
        eta = model.eta
        dQ = -eta * (g[:, :, None] * lam[:, None, :] + lam[:, :, None] * g[:, None, :]) \
            + eta**2 * g[:, :, None] * g[:, None, :]
        drho = -eta * g[:, :, None] * nu[:, None, :]
        risk = 0.5 * (yhat - clean) ** 2
        parts = [dQ.reshape(m, -1), drho.reshape(m, -1), risk[:, None]]
        x = np.concatenate(parts, axis=1)
        s = (x.sum(axis=0), (x**2).sum(axis=0))
        sums = s if sums is None else (sums[0] + s[0], sums[1] + s[1])
    mean = sums[0] / n
    se = np.sqrt(np.maximum(sums[1] / n - mean**2, 0) / (n - 1))
    return mean, se


def kernel_values(model, Q, rho, T):
    k = sq.kernels(model)
    dQ, drho = k.rhs(Q, rho, T)
    return np.concatenate([dQ.ravel(), drho.ravel(), [k.risk(Q, rho, T)]])


def check_against_mc(model, n, seed):
    rng = np.random.default_rng(seed)
    Q, rho, T = random_overlaps(model.p, model.p_star, rng)
    exact = kernel_values(model, Q, rho, T)
    mean, se = mc_estimates(model, Q, rho, T, n, rng)
    scale = np.max(np.abs(exact))
    # The estimator must resolve the values before it can test them.
    assert np.max(se) < 0.05 * scale, f"MC too imprecise: max se {np.max(se):.3g}, scale {scale:.3g}"
    z = np.abs(mean - exact) / se
    assert np.max(z) < 5, f"{model}: max |kernel − MC| = {np.max(z):.2f} standard errors"
    return z


SIZES = [(1, 1), (2, 1), (3, 2), (4, 2), (6, 3)]


@pytest.mark.parametrize("noise", [0.0, 0.5])
@pytest.mark.parametrize("p, p_star", SIZES)
def test_matrix_kernels_match_monte_carlo(p, p_star, noise):
    check_against_mc(sq.Model(p=p, p_star=p_star, lr=0.3, noise=noise), n=200_000,
                     seed=1000 * p + 10 * p_star + int(noise * 10))


@pytest.mark.slow
@pytest.mark.parametrize("noise", [0.0, 0.5])
@pytest.mark.parametrize("p, p_star", SIZES)
def test_matrix_kernels_match_monte_carlo_large(p, p_star, noise):
    check_against_mc(sq.Model(p=p, p_star=p_star, lr=0.3, noise=noise), n=5_000_000,
                     seed=7 + 1000 * p + 10 * p_star + int(noise * 10))


@pytest.mark.parametrize("activation, n", [("z**3/3 + z**2", 2_000_000), ("z**2 + z/2", 400_000)])
def test_entry_kernels_for_other_activations_match_monte_carlo(activation, n, isolated_cache):
    model = sq.Model(p=2, p_star=1, lr=0.2, noise=0.3, activation=activation)
    assert sq.kernels(model).form == "tensor"          # the default for non-quadratic σ
    check_against_mc(model, n=n, seed=99)
    # the entry route (the other derivation) gives the same numbers at this point
    rng = np.random.default_rng(99)
    Q, rho, T = random_overlaps(2, 1, rng)
    entries, tensor = sq.kernels(model, form="entries"), sq.kernels(model)
    for a, b in zip(entries.rhs(Q, rho, T), tensor.rhs(Q, rho, T)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_mc_check_has_power():
    """A kernel with the η² term dropped must fail the same check."""
    model = sq.Model(p=2, p_star=1, lr=0.5, noise=0.5)
    rng = np.random.default_rng(5)
    Q, rho, T = random_overlaps(2, 1, rng)
    mean, se = mc_estimates(model, Q, rho, T, 200_000, rng)
    gradient_flow_only = kernel_values(model.replace(lr=1e-9), Q, rho, T)
    gradient_flow_only[:-1] *= model.eta / 1e-9
    assert np.max(np.abs(mean - gradient_flow_only) / se) > 5
