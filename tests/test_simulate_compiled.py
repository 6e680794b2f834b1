"""The compiled reduced simulator: one step against the Gram-matrix update law,
identical numbers from every kernel, chunking, thread count and process."""

import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import symquad as sq
from symquad.numeric import _sgd_kernels as kern
from symquad.numeric import simulate as sim

KERNELS = [kern.reduced_steps, kern.reduced_steps_lanes]
poly = np.polynomial.polynomial


def _stepper(model, N, R, seed, Q0=None, rho0=None, T=None):
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
    X0, T = sim._initial_coordinates(model, N, R, Q0, rho0, T, rngs[1])
    return sim._ReducedStepper(model, N, R, X0, rngs[2], rngs[3], rngs[4])


def _run_kernel(st, kernel, G, S, xi, check_every=10**9, blowup=1e8):
    kernel(st.B, st.E, st.F_T, st.c, st.dc, st.coef, G, S, xi, st.residual, st.triangular,
           st.live, 0, check_every, blowup, st.caught_step, st.last_step, st.last_Q,
           st.last_rho)


def _gram_law_step(model, N, X, g, s2, xi):
    """One SGD step written on the Gram matrix, from the input's coordinates ``g`` in X's basis.

    Fields ``z = (λ, ν) = X g``, ``‖x‖² = ‖g‖² + s²``; ``δ_k = (η/p)(ŷ − y) σ'(λ_k)``;
    ``Q' = Q − (δλᵀ + λδᵀ)/N + ‖x‖² δδᵀ/N²``, ``ρ' = ρ − δνᵀ/N`` (no rotation involved).
    """
    p = model.p
    c = np.array([float(v) for v in model.activation])
    C = X @ X.T
    z = X @ g
    lam, nu = z[:p], z[p:]
    x2 = g @ g + s2
    err = poly.polyval(lam, c).mean() - poly.polyval(nu, c).mean() - xi
    delta = model.eta / p * err * poly.polyval(lam, poly.polyder(c))
    Q, rho = C[:p, :p], C[:p, p:]
    Qn = Q - (np.outer(delta, lam) + np.outer(lam, delta)) / N + x2 * np.outer(delta, delta) / N**2
    return Qn, rho - np.outer(delta, nu) / N


START = dict(Q0=np.array([[1.0, 0.2, 0.1], [0.2, 0.9, -0.1], [0.1, -0.1, 0.6]]),
             rho0=np.array([[0.5, 0.1], [0.2, -0.3], [0.1, 0.2]]),
             T=np.array([[1.0, 0.2], [0.2, 0.8]]))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("activation, noise, N", [((0, 0, 1), 0.0, 40),
                                                  ((0.3, 1, -0.5, 0.2), 0.3, 40),
                                                  ((0, 0, 1), 0.2, 4)])   # N < p+p*: no residual
def test_steps_follow_the_gram_matrix_law(kernel, activation, noise, N):
    """Each step of the kernel is the SGD update of the overlaps, from the same randomness."""
    model = sq.Model(p=3, p_star=2, lr=0.7, noise=noise, activation=activation)
    R = 5
    start = START if N > 5 else {}
    st = _stepper(model, N, R, 3, **start)
    assert st.residual == (N > 5)
    rng = np.random.default_rng(0)
    for _ in range(3):
        G = rng.standard_normal((1, R, st.k))
        S = rng.chisquare(N - st.k, size=(1, R)) if st.residual else np.zeros((0, 0))
        xi = 0.5 * rng.standard_normal((1, R)) if noise else np.zeros((0, 0))
        X = st.X                               # coordinates before the step
        _run_kernel(st, kernel, G, S, xi)
        Q, rho = st.gram()
        for r in range(R):
            Qe, rhoe = _gram_law_step(model, N, X[r], G[0, r], S[0, r] if st.residual else 0.0,
                                      xi[0, r] if noise else 0.0)
            np.testing.assert_allclose(Q[r], Qe, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(rho[r], rhoe, rtol=1e-12, atol=1e-14)
        if st.triangular:
            np.testing.assert_array_equal(st.E, np.tril(st.E))
        np.testing.assert_array_equal(st.X[:, 3:, :2], np.broadcast_to(st.F_T, (R, 2, 2)))


def test_all_kernels_give_identical_numbers():
    """Scalar and SIMD-lane kernels: bit for bit, over many steps, with divergence."""
    model = sq.Model(p=3, p_star=2, lr=0.4, noise=0.2)
    R, n = 19, 400
    rng = np.random.default_rng(1)
    G = rng.standard_normal((n, R, 5))
    S = rng.chisquare(995, size=(n, R))
    xi = 0.4 * rng.standard_normal((n, R))
    out = []
    for kernel in KERNELS:
        st = _stepper(model, 1000, R, 5)
        st.E[3] *= 3                        # one replica diverges (caught while finite)
        _run_kernel(st, kernel, G, S, xi, check_every=16, blowup=50.0)
        out.append((st.B, st.E, st.live, st.caught_step, st.last_step, st.last_Q))
    assert not out[0][2][3] and out[0][2].sum() == R - 1
    assert np.all(np.isfinite(out[0][1][3]))          # frozen where it was caught
    for other in out[1:]:
        for a, b in zip(out[0], other):
            np.testing.assert_array_equal(a, b)


def _digest(run):
    h = hashlib.sha256()
    for a in (run.Q, run.rho, run.risk):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


RUN = "sq.Model(p=3, p_star=2, lr=0.2, noise=0.1), N=500, t_max=3.0, replicas=20, seed=11"


def test_same_seed_same_numbers_across_chunks_and_processes(monkeypatch):
    model = sq.Model(p=3, p_star=2, lr=0.2, noise=0.1)
    ref = sim.simulate(model, N=500, t_max=3.0, replicas=20, seed=11)
    # chunking of the random draws does not matter (one stream per kind of number)
    monkeypatch.setattr(sim, "_CHUNK_VALUES", 37)
    small = sim.simulate(model, N=500, t_max=3.0, replicas=20, seed=11)
    assert _digest(small) == _digest(ref)
    # a fresh process (and one numba thread) gives the same bytes
    code = ("import hashlib, numpy as np, symquad as sq\n"
            "from symquad.numeric.simulate import simulate\n"
            f"run = simulate({RUN})\n"
            "h = hashlib.sha256()\n"
            "for a in (run.Q, run.rho, run.risk): h.update(np.ascontiguousarray(a).tobytes())\n"
            "print(h.hexdigest())\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True,
                         capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == _digest(ref)
