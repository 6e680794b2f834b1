"""Monte Carlo of one exact N-dimensional SGD step, split by the sources of its O(1/N) mean.

Independent of the symbolic code: written from docs/model.md §2 with numpy only (the
weights of :func:`diffusion_mc.weights_with_gram`, ``b`` fresh inputs ``x^μ ~ N(0, I_N)``).
For each sample it returns the exact increment ``N ΔX`` and its leading-order part
``φ`` (``|x^μ|²/N → 1``, ``x^μ·x^ν/N → 0``, terms of order ``1/N`` in the map dropped;
the sphere's projection to first order), whose mean is the drift ``f`` exactly.  So

    E[N (N ΔX − φ)] = N (E[N ΔX] − f) = f₁ + O(1/N),

and the difference has a variance far below that of ``N ΔX`` itself (a control
variate on the same samples).  Without the sphere the difference splits exactly into

* ``norm``:  ``N (η²/b²) Σ_μ g_k^μ g_l^μ (|x^μ|²/N − 1)``  (Q only),
* ``cross``: ``N (η²/b²) Σ_{μ≠ν} g_k^μ g_l^ν x^μ·x^ν/N``  (Q only),
* ``decay``: the rest, ``(η²λ²) Q + ηλ·η (ḡλ + λḡ)``-type terms of ``(1 − ηλ/N)²``.
"""

import numpy as np

from diffusion_mc import _activation, weights_with_gram


def one_step_sources(model, Q, rho, T, N, n, rng, a=None, chunk=20000):
    """``{"total", "norm", "cross", "decay"}`` samples ``(n, dim)`` of ``N(NΔX − φ)`` by source.

    ``total`` always; the split (Q block; zero elsewhere) only without a constraint.
    The readout block (trained readout) is the exact ``N(NΔa − φ_a)``.
    """
    p, k, b = model.p, model.p_star, model.batch_size
    W, Ws = weights_with_gram(Q, rho, T, N, rng)
    # the activations from their definitions (polynomials, erf(z/√2), relu)
    sig, ds = _activation(model.activation)
    sigt, _ = _activation(model.teacher_activation)
    a = np.array([float(c) for c in model.readout]) if a is None else np.asarray(a, float)
    bt = np.array([float(c) for c in model.teacher_readout])
    eta, wd, eta_a = model.eta, model.weight_decay, model.lr_readout
    sh = 1 - eta * wd / N
    iu, ju = np.triu_indices(p)
    sphere = model.constraint == "sphere"
    out = {"total": [], "norm": [], "cross": [], "decay": []}
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = rng.standard_normal((m, b, N))
        lam = x @ W.T / np.sqrt(N)
        nu = x @ Ws.T / np.sqrt(N)
        G = np.einsum("mbn,mcn->mbc", x, x) / N                      # x^μ·x^ν/N
        y = sigt(nu) @ bt + np.sqrt(model.noise) * rng.standard_normal((m, b))
        # the error signal dl/dyhat: yhat - y (square loss), -y (correlation loss -y yhat)
        err = sig(lam) @ a - y if model.loss == "square" else -y
        g = err[..., None] * a * ds(lam)
        lg = np.einsum("mbk,mbl->mkl", g, lam) / b
        ng = np.einsum("mbk,mbl->mkl", g, nu) / b
        diag = np.eye(b)[None]
        gg = np.einsum("mbk,mbc,mcl->mkl", g, G, g) / b**2
        gg_norm = np.einsum("mbk,mbc,mcl->mkl", g, G * diag - diag, g) / b**2
        gg_cross = np.einsum("mbk,mbc,mcl->mkl", g, G * (1 - diag), g) / b**2
        gg0 = np.einsum("mbk,mbl->mkl", g, g) / b**2
        sym = lg + lg.transpose(0, 2, 1)
        Qn = sh**2 * Q - sh * eta / N * sym + eta**2 / N * gg
        rn = sh * rho - eta / N * ng
        phiQ = -2 * eta * wd * Q - eta * sym + eta**2 * gg0
        phir = -eta * wd * rho - eta * ng
        if sphere:
            sc = np.sqrt(np.diag(Q) / np.diagonal(Qn, axis1=1, axis2=2))
            Qn = Qn * sc[:, :, None] * sc[:, None, :]
            rn = rn * sc[:, :, None]
            dq = np.diagonal(phiQ, axis1=1, axis2=2) / np.diag(Q)
            phiQ = phiQ - 0.5 * Q * (dq[:, :, None] + dq[:, None, :])
            phir = phir - 0.5 * rho * dq[:, :, None]
        tot = [N * (N * (Qn[:, iu, ju] - Q[iu, ju]) - phiQ[:, iu, ju]),
               N * (N * (rn - rho) - phir).reshape(m, -1)]
        if model.readout_trained:
            h = (err[..., None] * sig(lam)).mean(axis=1)
            a_new = a - eta_a / N * h
            tot.append(N * (N * (a_new - a) - (-eta_a * h)))
        out["total"].append(np.concatenate(tot, 1))
        zero = np.zeros((m, tot[0].shape[1] + sum(t.shape[1] for t in tot[1:])))
        for name, part in (("norm", N * eta**2 * gg_norm), ("cross", N * eta**2 * gg_cross)):
            z = zero.copy()
            z[:, :len(iu)] = part[:, iu, ju]
            out[name].append(z)
        out["decay"].append(out["total"][-1] - out["norm"][-1] - out["cross"][-1])
    return {key: np.concatenate(v) for key, v in out.items()}


def mean_and_se(samples):
    """Column means and their standard errors."""
    return samples.mean(0), samples.std(0, ddof=1) / np.sqrt(len(samples))
