r"""One N-dimensional SGD step with inputs ``x ~ N(0, Σ)``, written from the definitions.

Numpy only: nothing of symquad's symbolic, generated or simulator code.  ``Σ = Σ_c s_c P_c``
with ``P_c`` the coordinates of block ``c`` (``f_c N`` consecutive ones), so
``x = (√s_1 z_1, …, √s_B z_B)`` with ``z_c ~ N(0, I_{f_c N})``.  From actual weights
``W`` (``p × N``) and ``W*`` (``p* × N``) one step (docs/model.md §2) is

    W' = (1 − ηλ/N) W − η/(b√N) Σ_μ g^μ x^μᵀ,    a' = a − (η_a/N) mean_μ h^μ,

then, on the sphere, every row rescaled to ``|w_k|² = N``; the per-block overlaps are
``Q^c = W P_c Wᵀ/N``, ``ρ^c = W P_c W*ᵀ/N``.  With ``M^μ_c = W P_c x^μ/√N`` (the block
fields), ``G = (g^1 … g^b)`` and ``R_c = X P_c Xᵀ/N`` the new overlaps are exactly

    Q^c' = s² Q^c − (sη/(bN)) (M_c Gᵀ + G M_cᵀ) + (η²/(b² N)) G R_c Gᵀ,
    ρ^c' = s ρ^c − (η/(bN)) G M*_cᵀ,         s = 1 − ηλ/N,

so a step costs ``O(b (p + p*) N)`` (the fields), not ``O(p² N)``.  :func:`increments`
returns ``N(X' − X)`` of every block exactly, and its N → ∞ form (``R_c → f_c s_c I``,
``s² → 1 − 2ηλ/N``, the renormalisation to first order), whose mean is the limit drift
exactly because the fields are exactly Gaussian at any N.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial.polynomial import polyder, polyval
from scipy.special import erf

__all__ = ["block_weights", "gradients", "increments", "mean_increments"]


def block_weights(p, p_star, sizes, rng, sphere=False, scale=1.0):
    """Random ``W`` (p × N) and ``W*`` (p* × N) with a different scale in every block.

    The teacher's power per block is deliberately not ``f_c T`` (its rows scale by block);
    `scale` multiplies both (off the sphere).
    """
    N = sum(sizes)
    cuts = np.cumsum((0,) + tuple(sizes))
    W = rng.standard_normal((p, N))
    Ws = rng.standard_normal((p_star, N))
    for c in range(len(sizes)):
        W[:, cuts[c]:cuts[c + 1]] *= 0.6 + 0.5 * c
        Ws[:, cuts[c]:cuts[c + 1]] *= 1.3 - 0.4 * c
    W += 0.5 * rng.standard_normal((p, p_star)) @ Ws        # correlated with the teacher
    if sphere:
        W *= np.sqrt(N) / np.linalg.norm(W, axis=1, keepdims=True)
    else:
        W, Ws = scale * W, scale * Ws
    return W, Ws


def block_overlaps(W, Ws, sizes):
    """``(Q^c, ρ^c, T^c)`` stacked over the blocks: (B, p, p), (B, p, p*), (B, p*, p*)."""
    N = W.shape[1]
    cuts = np.cumsum((0,) + tuple(sizes))
    blocks = [(W[:, a:b], Ws[:, a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    return (np.stack([w @ w.T / N for w, _ in blocks]),
            np.stack([w @ v.T / N for w, v in blocks]),
            np.stack([v @ v.T / N for _, v in blocks]))


def _activation(act):
    """``(σ, σ')`` of a coefficient tuple, ``"erf"`` (erf(z/√2)) or ``"relu"``."""
    if act == "relu":
        return (lambda z: np.maximum(z, 0.0)), (lambda z: (z > 0).astype(float))
    if act == "erf":
        return (lambda z: erf(z / np.sqrt(2.0)),
                lambda z: np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z * z))
    c = np.array([float(x) for x in act])
    return (lambda z: polyval(z, c)), (lambda z: polyval(z, polyder(c)))


def gradients(model, lam, nu, xi, a):
    """``(g, h)`` per sample: ``g_k = δ a_k σ'(λ_k)``, ``h_k = δ σ(λ_k)``, ``δ = ŷ − y``."""
    sig, dsig = _activation(model.activation)
    sig_t, _ = _activation(model.teacher_activation)
    b = np.array([float(x) for x in model.teacher_readout])
    s_lam = sig(lam)
    y = sig_t(nu) @ b + np.sqrt(model.noise) * xi
    delta = s_lam @ a - y
    return delta[..., None] * a * dsig(lam), delta[..., None] * s_lam


def increments(model, W, Ws, sizes, scales, x_blocks, xi, a):
    """Exact ``N(Q^c' − Q^c)``, ``N(ρ^c' − ρ^c)``, ``N(a' − a)`` and their N → ∞ forms.

    ``x_blocks``: list over blocks of (n, b, f_c N) standard normals (the inputs are
    ``√s_c`` times them); ``xi`` (n, b) the label noise.  Returns two tuples
    ``(dQ (n, B, p, p), drho (n, B, p, p*), da (n, p) or None)``: exact and limit.
    """
    N = W.shape[1]
    B = len(sizes)
    cuts = np.cumsum((0,) + tuple(sizes))
    eta, wd, bsz = model.eta, model.weight_decay, x_blocks[0].shape[1]
    M, Ms, R = [], [], []
    for c in range(B):
        x = np.sqrt(scales[c]) * x_blocks[c]                          # (n, b, f_c N)
        M.append(x @ W[:, cuts[c]:cuts[c + 1]].T / np.sqrt(N))        # (n, b, p)
        Ms.append(x @ Ws[:, cuts[c]:cuts[c + 1]].T / np.sqrt(N))
        R.append(x @ np.swapaxes(x, 1, 2) / N)                        # (n, b, b)
    lam, nu = sum(M), sum(Ms)
    g, h = gradients(model, lam, nu, xi, a)                           # (n, b, p)
    gT = np.swapaxes(g, 1, 2)                                          # (n, p, b)
    Q, rho, _ = block_overlaps(W, Ws, sizes)
    s = 1.0 - eta * wd / N
    fs = [f * sc for f, sc in zip(np.array(sizes) / N, scales)]
    exact_q, exact_r, lim_q, lim_r = [], [], [], []
    for c in range(B):
        gm = gT @ M[c]                                                 # (n, p, p) Σ_μ g μᵀ
        cross = -(eta / bsz) * (gm + np.swapaxes(gm, 1, 2))
        ggR = gT @ R[c] @ g                                            # Σ_μν g^μ R_μν g^νᵀ
        exact_q.append(N * (s * s - 1) * Q[c] + s * cross + (eta / bsz) ** 2 * ggR)
        lim_q.append(-2 * eta * wd * Q[c] + cross + (eta / bsz) ** 2 * fs[c] * (gT @ g))
        gms = -(eta / bsz) * (gT @ Ms[c])
        exact_r.append(N * (s - 1) * rho[c] + gms)
        lim_r.append(-eta * wd * rho[c] + gms)
    exact_q, exact_r = np.stack(exact_q, 1), np.stack(exact_r, 1)
    lim_q, lim_r = np.stack(lim_q, 1), np.stack(lim_r, 1)
    if model.constraint == "sphere":
        exact_q, exact_r = _renormalise(Q, rho, exact_q, exact_r, N)
        lim_q, lim_r = _project(Q, rho, lim_q, lim_r)
    da = None
    if model.readout_trained:
        da = -model.lr_readout * h.mean(1)
    return (exact_q, exact_r, da), (lim_q, lim_r, da)


def _renormalise(Q, rho, dq, dr, N):
    """Rows rescaled to the Euclidean norm √N (``Σ_c Q^c_kk = 1``), exactly at finite N."""
    u = np.diagonal(dq.sum(1), axis1=-2, axis2=-1) / N            # Q'_kk − 1 (n, p)
    # 1/√(1 + u) − 1 without cancellation
    e = np.expm1(-0.5 * np.log1p(u))
    f = 1.0 + e
    # Q'' = (Q + dQ/N) f_k f_l: N(Q'' − Q) = N(f_k f_l − 1) Q + f_k f_l dQ
    ff = f[:, None, :, None] * f[:, None, None, :]
    dq2 = N * (e[:, None, :, None] + e[:, None, None, :]
               + e[:, None, :, None] * e[:, None, None, :]) * Q + ff * dq
    dr2 = N * e[:, None, :, None] * rho + f[:, None, :, None] * dr
    return dq2, dr2


def _project(Q, rho, dq, dr):
    """The renormalisation to first order: ``F − ½ Q (F_kk + F_ll)`` (unit Euclidean norms)."""
    F = np.diagonal(dq.sum(1), axis1=-2, axis2=-1)                 # (n, p)
    return (dq - 0.5 * Q * (F[:, None, :, None] + F[:, None, None, :]),
            dr - 0.5 * rho * F[:, None, :, None])


def mean_increments(model, W, Ws, sizes, scales, n, rng, chunk=2000, a=None):
    """Means and standard errors over `n` steps of the exact increments and of
    ``exact − limit`` (the O(1/N) bias), flattened over the state entries."""
    a = np.array([float(x) for x in model.readout]) if a is None else np.asarray(a, float)
    sums = {}
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        xs = [rng.standard_normal((m, model.batch_size, size)) for size in sizes]
        xi = rng.standard_normal((m, model.batch_size))
        exact, limit = increments(model, W, Ws, sizes, scales, xs, xi, a)
        e = _flat(exact)
        d = e - _flat(limit)
        for key, v in (("e", e), ("d", d)):
            sums[key] = sums.get(key, 0) + v.sum(0)
            sums[key + "2"] = sums.get(key + "2", 0) + (v * v).sum(0)
    out = {}
    for key in ("e", "d"):
        mean = sums[key] / n
        var = sums[key + "2"] / n - mean * mean
        out[key] = (mean, np.sqrt(np.maximum(var, 0) / n))
    return out


def _flat(parts):
    dq, dr, da = parts
    p = dq.shape[-1]
    iu, ju = np.triu_indices(p)
    pieces = [dq[..., iu, ju].reshape(len(dq), -1), dr.reshape(len(dr), -1)]
    if da is not None:
        pieces.append(da)
    return np.concatenate(pieces, axis=1)


def flat_rhs(out):
    """The kernels' ``rhs`` (dQ (B, p, p), dρ (B, p, p*)[, da]) flattened as :func:`_flat`."""
    dq, dr = out[0], out[1]
    p = dq.shape[-1]
    iu, ju = np.triu_indices(p)
    pieces = [dq[..., iu, ju].ravel(), dr.ravel()]
    if len(out) > 2 and out[2] is not None:
        pieces.append(out[2])
    return np.concatenate(pieces)


def informed_block_start(m):
    """A per-block start with ``ρ`` of order one (the same for every replica) whose blocks
    are not proportional to the fractions (so the isotropic ODE of the totals is another
    dynamics); ``(p, p*) = (3, 2)``."""
    rng = np.random.default_rng(2)
    n = m.p + m.p_star
    Q, rho, T = [], [], []
    for f, _ in m.spectrum:
        V = rng.standard_normal((n, 3 * n)) * np.sqrt(float(f) / (3 * n))
        V[:3] += 0.6 * V[[3, 4, 3]]                   # students leaning on the teachers
        C = V @ V.T
        Q.append(C[:m.p, :m.p]), rho.append(C[:m.p, m.p:]), T.append(C[m.p:, m.p:])
    return np.array(Q), np.array(rho), np.array(T)
