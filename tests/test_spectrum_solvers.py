"""Solvers, the random start and the LaTeX of an input spectrum (issue 24, step 3).

* ``integrate`` with per-block overlaps against an independent fixed-step RK4 of the
  kernels (its own integrator), and ``Σ = s I`` against the isotropic model of the
  weights ``√s w`` (step ``η s``, weight decay ``λ/s``, overlaps ``s (Q, ρ, T)``);
* ``integrate_batch`` against ``integrate`` start by start;
* the exact law of the random start ``w_k ~ N(0, q0 I_N)`` per block (mean, ``N Cov``,
  the Dirichlet shares on the sphere) against overlaps of explicit N-dimensional
  weights, and the sampler ``block_random_start`` against the same;
* ``symquad equations --spectrum`` prints the per-block drift (the expression the kernels
  are generated from) and refuses a malformed spectrum.
"""

from __future__ import annotations

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.fluctuations import block_random_start, random_start_covariance
from symquad.numeric.layout import state_layout
from symquad.numeric.ode_batch import integrate_batch
from symquad.spectrum import block_sizes
from spectrum_mc import block_overlaps, block_weights


def _start(model, seed=0, N=400):
    rng = np.random.default_rng(seed)
    W, Ws = block_weights(model.p, model.p_star, block_sizes(model.spectrum, N), rng,
                          sphere=model.constraint == "sphere", scale=0.8)
    return block_overlaps(W, Ws, block_sizes(model.spectrum, N))


def _rk4(kern, Q, rho, T, t_max, steps):
    h = t_max / steps
    for _ in range(steps):
        k1 = kern.rhs(Q, rho, T)
        k2 = kern.rhs(Q + h / 2 * k1[0], rho + h / 2 * k1[1], T)
        k3 = kern.rhs(Q + h / 2 * k2[0], rho + h / 2 * k2[1], T)
        k4 = kern.rhs(Q + h * k3[0], rho + h * k3[1], T)
        Q = Q + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        rho = rho + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
    return Q, rho


@pytest.mark.parametrize("fields", [dict(), dict(activation="z**3 - 3*z", lr=0.05),
                                    dict(constraint="sphere", weight_decay=0.1)])
def test_integrate_follows_the_block_kernels(fields):
    m = sq.Model(3, 2, **{"lr": 0.2, **fields}, spectrum="1/4:2,3/4:1/2")
    Q0, rho0, T = _start(m)
    sol = sq.integrate(m, Q0, rho0, T, 4.0, t_eval=[0.0, 4.0])
    assert sol.Q.shape == (2, 2, 3, 3) and sol.rho.shape == (2, 2, 3, 2)
    Q, rho = _rk4(sq.kernels(m), Q0, rho0, T, 4.0, 400)
    np.testing.assert_allclose(sol.Q[-1], Q, rtol=0, atol=1e-7)
    np.testing.assert_allclose(sol.rho[-1], rho, rtol=0, atol=1e-7)
    assert sol.risk[-1] == pytest.approx(sq.kernels(m).risk(Q, rho, T), abs=1e-7)
    if m.constraint == "sphere":
        np.testing.assert_allclose(np.diagonal(sol.Q[-1].sum(0)), 1.0, atol=1e-8)


def test_one_block_of_eigenvalue_s_integrates_like_the_rescaled_isotropic_model():
    s = 2.5
    m = sq.Model(3, 2, 0.1, spectrum=f"1:{s}", weight_decay=0.2, noise=0.1)
    iso = sq.Model(3, 2, 0.1 * s, weight_decay=0.2 / s, noise=0.1)
    Q0, rho0, T = _start(m)
    t = np.linspace(0, 30, 7)
    a = sq.integrate(m, Q0, rho0, T, 30.0, t_eval=t)
    b = sq.integrate(iso, s * Q0[0], s * rho0[0], s * T[0], 30.0, t_eval=t)
    np.testing.assert_allclose(s * a.Q[:, 0], b.Q, rtol=0, atol=1e-7)
    np.testing.assert_allclose(a.risk, b.risk, rtol=1e-6, atol=1e-9)


def test_integrate_refuses_a_bad_block_start():
    m = sq.Model(2, 1, 0.1, spectrum="1/4:2,3/4:1/2")
    Q0, rho0, T = _start(m)
    with pytest.raises(ValueError, match=r"Q0 must have shape \(2, 2, 2\).*block_teacher"):
        sq.integrate(m, Q0.sum(0), rho0.sum(0), T.sum(0), 1.0)
    bad = rho0.copy()
    bad[1] = 10.0                                   # block 2 is no Gram matrix
    with pytest.raises(ValueError, match="of every input block must be positive"):
        sq.integrate(m, Q0, bad, T, 1.0)
    sphere = m.replace(constraint="sphere")
    with pytest.raises(ValueError, match="sum over the blocks of Q0"):
        sq.integrate(sphere, Q0, rho0, T, 1.0)


def test_integrate_batch_equals_integrate_start_by_start():
    m = sq.Model(3, 2, 0.2, spectrum="1/3:3,1/3:1,1/3:1/3", lr_readout=0.1)
    starts = [_start(m, seed, N=402) for seed in (1, 2)]
    Q0 = np.stack([s[0] for s in starts])
    rho0 = np.stack([s[1] for s in starts])
    T = starts[0][2]
    t = np.linspace(0, 5, 6)
    batch = integrate_batch(m, Q0, rho0, T, 5.0, t_eval=t, rtol=1e-10, atol=1e-12)
    assert batch.Q.shape == (2, 6, 3, 3, 3)
    for i in range(2):
        one = sq.integrate(m, Q0[i], rho0[i], T, 5.0, t_eval=t, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batch.Q[i], one.Q, rtol=0, atol=1e-8)
        np.testing.assert_allclose(batch.readout[i], one.readout, rtol=0, atol=1e-8)
        np.testing.assert_allclose(batch.risk[i], one.risk, rtol=0, atol=1e-8)


# --------------------------------------------------------------------------- random start
def _moment_check(X, mean, S, N):
    """Means within 5 s.e. of `mean`; ``N Cov`` within 5 s.e. (fourth moments) of `S`."""
    R = len(X)
    d = X - X.mean(0)
    assert np.all(np.abs(X.mean(0) - mean) < 5 * X.std(0) / np.sqrt(R) + 1e-12)
    prods = N * d[:, :, None] * d[:, None, :]
    se = prods.std(0) / np.sqrt(R)
    assert se.max() < 0.05 * np.abs(S).max()                  # the check has power
    z = np.abs(prods.mean(0) - S) / np.maximum(se, 1e-12)
    assert z.max() < 5.5, z.max()                             # Bonferroni over ~100 entries


@pytest.mark.parametrize("constraint", ["none", "sphere"])
def test_the_random_start_law_per_block(constraint):
    m = sq.Model(2, 2, 0.1, spectrum="1/4:2,3/4:1/2", constraint=constraint)
    N, R = 400, 20000
    sizes = block_sizes(m.spectrum, N)
    rng = np.random.default_rng(0)
    Ws = rng.standard_normal((2, N)) * np.repeat([1.5, 0.7], sizes)
    _, _, T = block_overlaps(np.zeros((2, N)), Ws, sizes)
    cuts = np.cumsum((0,) + sizes)
    W = rng.standard_normal((R, 2, N))
    if constraint == "sphere":
        W *= np.sqrt(N) / np.linalg.norm(W, axis=2, keepdims=True)
    Q = np.stack([W[:, :, a:b] @ np.swapaxes(W[:, :, a:b], 1, 2) / N
                  for a, b in zip(cuts[:-1], cuts[1:])], 1)
    rho = np.stack([W[:, :, a:b] @ Ws[:, a:b].T / N for a, b in zip(cuts[:-1], cuts[1:])], 1)
    lay = state_layout(m)
    S = random_start_covariance(m, T)
    mean = lay.pack(np.eye(2) * np.array([0.25, 0.75])[:, None, None], np.zeros((2, 2, 2)))
    _moment_check(lay.pack(Q, rho), mean, S, N)
    Q2, rho2 = block_random_start(m, T, N, R, seed=1)
    _moment_check(lay.pack(Q2, rho2), mean, S, N)
    # power: the isotropic law (f_c dropped) is rejected on the same draws
    with pytest.raises(AssertionError):
        _moment_check(lay.pack(Q, rho), mean, S / np.array([0.25] * 3 + [0.75] * 3 + [1] * 8)[
            :, None], N)


# --------------------------------------------------------------------------- LaTeX
def test_equations_print_the_per_block_drift(capsys):
    from symquad.cli import main
    from symquad.symbolic.blocks import block_moment_drift
    from symquad.symbolic.symbols import BATCH
    m = sq.Model(3, 2, 1.0, spectrum="1/4:2,3/4:3/5", constraint="sphere")
    eq = sq.derive(m)
    # what the kernels are generated from, with the batch size (off) at 1
    assert eq.dQ == block_moment_drift(m).dQ.xreplace({BATCH: 1})
    tex = eq.latex()
    for piece in (r"\frac{dQ^{c}_{kl}}{dt}", r"\frac{d\rho^{c}_{km}}{dt}", "G^{c}_{kl}",
                  r"\tilde G^{c}_{km}", "f_{c} s_{c}", r"\operatorname{tr}\Sigma/N",
                  "(1/4, 2),\\ (3/4, 3/5)", "Q_{kk}"):
        assert piece in tex, piece
    assert "QBf" not in tex and "Gb(" not in tex
    assert main(["equations", "--spectrum", "1/2:2,1/2:1", "--weight-decay", "0.1"]) == 0
    out = capsys.readouterr().out
    assert r"\lambda_{\mathrm{wd}}" in out and "f_{c} s_{c}" in out
    assert main(["equations", "--spectrum", "1/2:2,1/3:1"]) == 2
    assert "spectrum: the fractions must sum to 1 exactly" in capsys.readouterr().err
    with pytest.raises(ValueError, match="spectrum"):
        eq.explicit()


# --------------------------------------------------------------------------- linear model
def _linear_system(a, b, eta, noise, spectrum, T):
    """The block ODE of σ = σ* = z, p = p* = 1, written by hand from the definitions.

    ``δ = aλ − bν (− √Δ ξ)``, ``g = a δ``; ``E[g μ^c] = a s_c (a Q^c − b ρ^c)``,
    ``E[g μ*^c] = a s_c (a ρ^c − b T^c)``, ``E[g²] = a² (a² Ω_λλ − 2ab Ω_λν + b² Ω_νν + Δ)``
    with ``Ω = Σ_c s_c (Q^c, ρ^c, T^c)``: ``dX/dt = A X + c`` for ``X = (Q^1..Q^B, ρ^1..ρ^B)``.
    """
    f = np.array([float(x) for x, _ in spectrum])
    s = np.array([float(x) for _, x in spectrum])
    B = len(s)
    A = np.zeros((2 * B, 2 * B))
    c = np.zeros(2 * B)
    for i in range(B):
        A[i, i] += -2 * eta * a * a * s[i]
        A[i, B + i] += 2 * eta * a * b * s[i]
        A[B + i, B + i] += -eta * a * a * s[i]
        c[B + i] += eta * a * b * s[i] * T[i]
        # η² f_i s_i a² E[δ²]
        k = eta ** 2 * f[i] * s[i] * a * a
        A[i, :B] += k * a * a * s
        A[i, B:] += -2 * k * a * b * s
        c[i] += k * (b * b * float(np.dot(s, T)) + noise)
    return A, c


def test_the_linear_model_follows_its_exact_solution():
    """σ = σ* = z: the block system is linear, X(t) = e^{At}(X0 + A⁻¹c) − A⁻¹c exactly."""
    from scipy.linalg import expm
    spectrum = "1/8:4,1/4:2,5/8:1/5"
    a, b, eta, noise = 0.9, 1.2, 0.3, 0.1
    m = sq.Model(1, 1, eta, activation="z", noise=noise, readout=a, teacher_readout=b,
                 spectrum=spectrum)
    T = np.array([0.2, 0.3, 0.5])
    Q0 = np.array([0.3, 0.2, 0.6])
    rho0 = np.array([0.05, -0.1, 0.2])
    t = np.linspace(0.0, 20.0, 11)
    sol = sq.integrate(m, Q0[:, None, None], rho0[:, None, None], T[:, None, None], 20.0,
                       t_eval=t, rtol=1e-11, atol=1e-13)
    A, c = _linear_system(a, b, eta, noise, m.spectrum, T)
    fixed = np.linalg.solve(A, -c)
    X0 = np.concatenate([Q0, rho0])
    exact = np.array([expm(A * ti) @ (X0 - fixed) + fixed for ti in t])
    np.testing.assert_allclose(sol.Q[:, :, 0, 0], exact[:, :3], rtol=0, atol=1e-9)
    np.testing.assert_allclose(sol.rho[:, :, 0, 0], exact[:, 3:], rtol=0, atol=1e-9)
    # the kernels' right-hand side is this affine map at any state
    dQ, drho = sq.kernels(m).rhs(Q0[:, None, None], rho0[:, None, None], T[:, None, None])
    np.testing.assert_allclose(np.concatenate([dQ.ravel(), drho.ravel()]), A @ X0 + c,
                               rtol=0, atol=1e-14)
