"""One SGD step written from the definitions, and the checks that a compiled step equals it.

Shared by the simulator tests of every model field (polynomial activations, erf/ReLU,
the correlation loss): each supplies the per-sample gradients of its activations and the
compiled steppers of :mod:`symquad.numeric.simulate` are checked against the literal
N-dimensional update to round-off.

The update (docs/model.md §2): with ``λ = W x/√N``, ``ν = W* x/√N``, per-sample
``g_k = ∂ℓ/∂λ_k`` and ``h_k = ∂ℓ/∂a_k``,

    W' = (1 − η κ/N) W − η/(b√N) Σ_μ g_μ x_μᵀ,      a' = a − η_a/N · mean_μ h_μ,

then each row of ``W'`` is rescaled to norm √N on the sphere.
"""

from __future__ import annotations

import copy

import numpy as np
from numpy.polynomial.polynomial import polyder, polyval

import symquad.numeric.simulate as simmod

__all__ = ["polynomial_gradients", "literal_step", "bartlett", "on_the_sphere",
           "assert_full_step_is_literal", "assert_reduced_step_is_literal"]


def _values(coeffs):
    return np.array([float(c) for c in coeffs])


def polynomial_gradients(model, lam, nu, xi, a):
    """Per-sample errors and gradients for polynomial activations: ``(g, h)``.

    ``δ = ∂ℓ/∂ŷ`` is ``ŷ − y`` for ``ℓ = ½(ŷ − y)²`` and ``−y`` for the correlation
    loss ``ℓ = −y ŷ``; ``g_k = δ a_k σ'(λ_k)`` and ``h_k = δ σ(λ_k)``.
    """
    c, c_t = _values(model.activation), _values(model.teacher_activation)
    sigma_lam = polyval(lam, c)
    y = polyval(nu, c_t) @ _values(model.teacher_readout) + np.sqrt(model.noise) * xi
    delta = sigma_lam @ a - y if model.loss == "square" else -y
    return delta[..., None] * a * polyval(lam, polyder(c)), delta[..., None] * sigma_lam


def literal_step(model, W, Ws, x, xi, a, gradients=polynomial_gradients):
    """One SGD step on the N-dimensional weights (``x``: (b, N) inputs): ``(W', a')``."""
    N, b = W.shape[1], x.shape[0]
    lam, nu = x @ W.T / np.sqrt(N), x @ Ws.T / np.sqrt(N)
    g, h = gradients(model, lam, nu, xi, a)
    W_new = (1 - model.eta * model.weight_decay / N) * W - model.eta * (g.T @ x) / (np.sqrt(N) * b)
    if model.constraint == "sphere":
        W_new *= np.sqrt(N) / np.linalg.norm(W_new, axis=1, keepdims=True)
    a_new = a - model.lr_readout / N * h.mean(axis=0) if model.readout_trained else a
    return W_new, a_new


def bartlett(S, L, b):
    """Lower-triangular factors (..., b, b): diagonal √S, sub-diagonal L row by row."""
    F = np.zeros(S.shape[:-1] + (b, b))
    pos = 0
    for mu in range(b):
        F[..., mu, mu] = np.sqrt(S[..., mu])
        F[..., mu, :mu] = L[..., pos:pos + mu]
        pos += mu
    return F


def on_the_sphere(model, Q0, rho0):
    """Rescale the overlaps to unit student norms when the model lives on the sphere."""
    if model.constraint != "sphere":
        return Q0, rho0
    d = np.sqrt(np.diag(Q0))
    return Q0 / np.outer(d, d), rho0 / d[:, None]


def assert_full_step_is_literal(model, Q0, rho0, T, gradients=polynomial_gradients,
                                N=50, replicas=2, seed=3):
    """The full simulator's compiled step == the literal step on the same inputs and noise."""
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
    X0, T = simmod._initial_coordinates(model, N, replicas, Q0, rho0, T, rngs[1])
    st = simmod._FullStepper(model, N, replicas, X0, rngs[0], rngs[1], rngs[2], rngs[3],
                             random_student=False)
    assert st.general
    W0, Ws, a0 = st.W.copy(), st.Ws.copy(), st.readout().copy()
    data, noise = copy.deepcopy(st.rng_data), copy.deepcopy(st.rng_noise)
    st.advance(1)
    xi = noise.standard_normal((1, replicas, model.batch_size))[0]   # drawn first, per advance
    x = data.standard_normal((replicas, model.batch_size, N))
    Q1, rho1 = st.gram()
    for r in range(replicas):
        W1, a1 = literal_step(model, W0[r], Ws, x[r], xi[r], a0[r], gradients)
        np.testing.assert_allclose(Q1[r], W1 @ W1.T / N, rtol=0, atol=1e-12)
        np.testing.assert_allclose(rho1[r], W1 @ Ws.T / N, rtol=0, atol=1e-12)
        np.testing.assert_allclose(st.readout()[r], a1, rtol=0, atol=1e-15)
        assert np.max(np.abs(Q1[r] - W0[r] @ W0[r].T / N)) > 1e-6      # the step moved


def assert_reduced_step_is_literal(model, Q0, rho0, T, gradients=polynomial_gradients,
                                   N=11, seed=9):
    """The reduced simulator's compiled step == the literal step on inputs rebuilt in R^N.

    Inputs are rebuilt explicitly: coordinates ``G`` in the basis of the weights and row
    ``μ`` of the drawn Bartlett factor on ``b`` further orthonormal directions, so the
    check covers the out-of-span Gram matrix of the batch as well.
    """
    b = model.batch_size
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    X0, T = simmod._initial_coordinates(model, N, 1, Q0, rho0, T, rngs[0])
    st = simmod._ReducedStepper(model, N, 1, X0, rngs[1], rngs[2], rngs[3])
    assert st.general and st.residual and N - st.k >= b
    X, k = st.X[0], st.k                                    # (p+p*, k), C = X Xᵀ
    draws = st.draw(1)
    G, S, L, xi = draws
    st.draw = lambda n: draws                               # the step uses exactly these
    a0 = st.readout()[0].copy()
    st.advance(1)
    Q1, rho1 = (v[0] for v in st.gram())
    p = model.p
    Wfull = np.zeros((X.shape[0], N))
    Wfull[:, :k] = np.sqrt(N) * X
    x = np.zeros((b, N))
    x[:, :k] = G[0, 0]
    x[:, k:k + b] = bartlett(S[0, 0], L[0, 0] if L.size else np.zeros(0), b)
    xi_standard = xi[0, 0] / np.sqrt(model.noise)          # the drawn noise is √Δ ξ
    W1, a_lit = literal_step(model, Wfull[:p], Wfull[p:], x, xi_standard, a0, gradients)
    np.testing.assert_allclose(Q1, W1 @ W1.T / N, rtol=0, atol=1e-13)
    np.testing.assert_allclose(rho1, W1 @ Wfull[p:].T / N, rtol=0, atol=1e-13)
    np.testing.assert_allclose(st.readout()[0], a_lit, rtol=0, atol=1e-15)
    assert np.max(np.abs(Q1 - Q0)) > 1e-3                   # the step moved
