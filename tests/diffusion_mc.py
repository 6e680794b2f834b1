"""Monte Carlo of N-dimensional one-step SGD increments (independent of the symbolic code).

Written from the definitions of docs/model.md with numpy only: explicit weights
``W`` (p × N), ``W*`` (p* × N) with the given Gram matrix, a mini-batch of ``b``
fresh inputs ``x^μ ~ N(0, I_N)``, one SGD step

    w_k ← (1 − ηλ/N) w_k − (η/b) Σ_μ g_k^μ x^μ/√N,   g_k = e a_k σ'(λ_k),  e = ŷ − y (−y: correlation loss),
    a_k ← a_k − (η_a/(bN)) Σ_μ e σ(λ_k)          (trained readout),
    sphere: w_k ← w_k |w_k|/|w_k'|,

and the increments ``N ΔX`` of the state (upper triangle of Q, ρ, a).  The new
Gram matrix is computed from the N-dimensional vectors' inner products
(``W x^μ``, ``W* x^μ``, ``x^μ·x^ν``), exactly.
"""

import numpy as np
from numpy.polynomial import Polynomial


def weights_with_gram(Q, rho, T, N, rng):
    """Rows ``W`` (p × N), ``W*`` (p* × N) with ``[W; W*][W; W*]ᵀ/N = [[Q, ρ], [ρᵀ, T]]``."""
    C = np.block([[Q, rho], [rho.T, T]])
    L = np.linalg.cholesky(C)
    frame = np.linalg.qr(rng.standard_normal((N, C.shape[0])))[0].T     # orthonormal rows
    X = np.sqrt(N) * L @ frame
    p = Q.shape[0]
    return X[:p], X[p:]


def _activation(act):
    """``(σ, σ')`` of a coefficient tuple or a name (erf(z/√2), relu), from the definitions."""
    if isinstance(act, str):
        from scipy.special import erf
        if act == "erf":
            return (lambda z: erf(z / np.sqrt(2.0)),
                    lambda z: np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z * z))
        if act == "relu":
            return (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float))
        raise ValueError(act)
    sigma = Polynomial([float(c) for c in act])
    return sigma, sigma.deriv()


def increments(model, Q, rho, T, n, rng, N=2000, a=None, chunk=4000):
    """``(n, dim)`` samples of ``N ΔX`` in the state order (Q upper triangle, ρ, a)."""
    p, k, b = model.p, model.p_star, model.batch_size
    W, Ws = weights_with_gram(Q, rho, T, N, rng)
    sigma, dsigma = _activation(model.activation)
    sigma_t, _ = _activation(model.teacher_activation)
    a = np.array([float(c) for c in model.readout]) if a is None else np.asarray(a, float)
    bt = np.array([float(c) for c in model.teacher_readout])
    eta, wd, eta_a = model.eta, model.weight_decay, model.lr_readout
    shrink = 1 - eta * wd / N
    iu, ju = np.triu_indices(p)
    out = []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        x = rng.standard_normal((m, b, N))
        lam = np.einsum("kn,mbn->mbk", W, x) / np.sqrt(N)
        nu = np.einsum("kn,mbn->mbk", Ws, x) / np.sqrt(N)
        gram_x = np.einsum("mbn,mcn->mbc", x, x) / N                     # x^μ·x^ν/N
        xi = rng.standard_normal((m, b))
        y = sigma_t(nu) @ bt + np.sqrt(model.noise) * xi                 # (m, b)
        # the error signal dl/dyhat: yhat - y (square loss), -y (correlation loss -y yhat)
        err = sigma(lam) @ a - y if model.loss == "square" else -y
        g = err[..., None] * a * dsigma(lam)                             # (m, b, p)
        # w' = shrink w − (η/(b√N)) Σ_μ g^μ x^μ: inner products with w, w*, w'
        lam_g = np.einsum("mbk,mbl->mkl", g, lam) / b                      # Σ g_k λ_l / b
        nu_g = np.einsum("mbk,mbl->mkl", g, nu) / b
        gg = np.einsum("mbk,mbc,mcl->mkl", g, gram_x, g) / b**2
        Qn = shrink**2 * Q - shrink * eta / N * (lam_g + np.swapaxes(lam_g, 1, 2)) \
            + eta**2 / N * gg
        rn = shrink * rho - eta / N * nu_g
        if model.constraint == "sphere":
            scale = np.sqrt(np.diag(Q) / np.diagonal(Qn, axis1=1, axis2=2))
            Qn = Qn * scale[:, :, None] * scale[:, None, :]
            rn = rn * scale[:, :, None]
        parts = [N * (Qn[:, iu, ju] - Q[iu, ju]), N * (rn - rho).reshape(m, -1)]
        if model.readout_trained:
            h = err[..., None] * sigma(lam)
            parts.append(-eta_a * h.mean(axis=1))
        out.append(np.concatenate(parts, axis=1))
    return np.concatenate(out)


def covariance_with_errors(F):
    """Sample covariance of the rows of ``F`` and the standard error of each entry."""
    Fc = F - F.mean(axis=0)
    n = F.shape[0]
    cov = Fc.T @ Fc / (n - 1)
    second = (Fc**2).T @ (Fc**2) / n                     # E[(x − x̄)²(y − ȳ)²]
    se = np.sqrt(np.maximum(second - cov**2, 0) / n)
    return cov, se
