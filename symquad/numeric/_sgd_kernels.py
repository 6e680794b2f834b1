r"""Compiled (numba) inner loops of the SGD simulators in :mod:`symquad.numeric.simulate`.

Only deterministic arithmetic lives here: every random number is drawn by the
caller with :class:`numpy.random.Generator` and passed in, so the numbers a
simulation produces do not depend on numba, on the number of threads, or on
how the steps are split into calls.  Each replica is advanced by its own
sequence of floating-point operations (no reductions across replicas), so the
scalar kernel and the SIMD-lane kernel (replicas in vector lanes) give
bit-identical results.  Threads over replicas (numba ``prange``) were measured
and left out: on a shared 2-core machine they did not pay at 64 replicas, and
they tripled the compilation time.

The functions are compiled on first use and cached on disk (``cache=True``,
in ``__pycache__`` next to this file), so only the first call in a fresh
installation pays the compilation.

Reduced simulator: one exact step
---------------------------------
Per replica the state is the coordinates of the rows of ``[W; W*]/√N`` in an
orthonormal basis of ``k = r_T + m`` vectors: the teacher rows are ``[F_T, 0]``
(fixed, ``F_T`` is ``p* × r_T``), the student rows ``[B, E]`` with ``B``
(``p × r_T``) and ``E`` (``p × m``, lower triangular when a residual
direction exists).  A fresh input ``x = Σ_i g_i e_i + s e_{k+1}`` has
``g ~ N(0, I_k)`` and ``s² ~ χ²_{N−k}`` (the norm of its component outside
the basis; its direction is uniform and only its norm matters).  The fields are
``ν = F_T g_T``, ``λ = B g_T + E g_E``; with ``u = δ/N``,
``δ_k = (η/p)(ŷ − y) σ'(λ_k)`` the update is

.. math::  B \leftarrow B - u\,g_T^{\mathsf T},\qquad
           [E\;|\;0] \leftarrow [E\;|\;0] - u\,(g_E^{\mathsf T}, s),

after which ``[E | ·]`` has ``m + 1`` columns.  An orthogonal transformation
of those columns (a rank-one LQ update by ``2m`` Givens rotations,
``O(p²)``) brings it back to a lower-triangular ``m × m`` block and a zero
column: the Gram matrix ``C = X Xᵀ`` is unchanged, so the new basis is again
orthonormal and contains all weights.  This needs exactly the ``k`` normals and
the one chi-square that the law of a step needs, and the teacher block
``F_T`` is never touched (``T`` is kept exactly).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["reduced_steps", "reduced_steps_lanes", "full_update", "reduced_steps_general",
           "full_update_general", "ACTIVATION_KINDS"]


@njit(cache=True)
def _horner(coeffs, z):
    """``Σ_j coeffs[j] z^j``."""
    out = coeffs[coeffs.size - 1]
    for j in range(coeffs.size - 2, -1, -1):
        out = out * z + coeffs[j]
    return out


#: Activation-kind codes of the general kernels (``kinds`` = (student, teacher)): a
#: polynomial by its Horner coefficients, erf(z/√2), ReLU.
KIND_POLYNOMIAL, KIND_ERF, KIND_RELU = 0, 1, 2
ACTIVATION_KINDS = {"polynomial": KIND_POLYNOMIAL, "erf": KIND_ERF, "relu": KIND_RELU}
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@njit(cache=True)
def _sigma(kind, coeffs, z):
    """``σ(z)``: the polynomial (Horner, the same operations as :func:`_horner`),
    ``erf(z/√2)`` or ``max(z, 0)``."""
    if kind == 0:
        return _horner(coeffs, z)
    if kind == 1:
        return math.erf(z * _INV_SQRT2)
    return z if z > 0.0 else 0.0


@njit(cache=True)
def _dsigma(kind, dcoeffs, z):
    """``σ'(z)``: Horner of the derivative's coefficients, ``√(2/π) e^{−z²/2}`` or ``1{z > 0}``."""
    if kind == 0:
        return _horner(dcoeffs, z)
    if kind == 1:
        return _SQRT_2_OVER_PI * math.exp(-0.5 * z * z)
    return 1.0 if z > 0.0 else 0.0


@njit(cache=True)
def _rotate_columns(E, r, ext, rows_from, i, cs, sn, p, m):
    """Columns ``(i, i+1)`` of ``[E | ext]`` ← ``(cs·a + sn·b, −sn·a + cs·b)`` on rows >= rows_from."""
    if i + 1 < m:
        for l in range(rows_from, p):
            a = E[r, l, i]
            b = E[r, l, i + 1]
            E[r, l, i] = cs * a + sn * b
            E[r, l, i + 1] = cs * b - sn * a
    else:
        for l in range(rows_from, p):
            a = E[r, l, i]
            b = ext[l]
            E[r, l, i] = cs * a + sn * b
            ext[l] = cs * b - sn * a


@njit(cache=True)
def _givens(a, b):
    """``(cs, sn, r)`` with ``cs·a + sn·b = r``, ``−sn·a + cs·b = 0``."""
    r = math.sqrt(a * a + b * b)
    if r == 0.0:
        return 1.0, 0.0, 0.0
    inv = 1.0 / r
    return a * inv, b * inv, r


@njit(cache=True)
def _lq_rank_one_update(E, r, u, v, ext, m, p):
    """``[E | 0] − u vᵀ`` (``v`` has m + 1 entries) brought back to ``[E' | 0]``, ``E'`` lower triangular.

    ``E[r]`` (p × m, p == m) must be lower triangular on entry.  Phase 1 rotates
    ``v`` onto its first coordinate (the same rotations applied to the columns
    of ``[E | 0]`` leave it lower Hessenberg); phase 2 subtracts the rank-one
    term, which now touches the first column only; phase 3 removes the
    super-diagonal.  ``v`` is overwritten.
    """
    for l in range(p):
        ext[l] = 0.0
    # phase 1: v -> (‖v‖, 0, ..., 0), columns i-1, i for i = m .. 1
    for i in range(m, 0, -1):
        cs, sn, h = _givens(v[i - 1], v[i])
        v[i - 1] = h
        v[i] = 0.0
        _rotate_columns(E, r, ext, i - 1, i - 1, cs, sn, p, m)
    # phase 2: rank-one term on the first column
    v0 = v[0]
    for l in range(p):
        E[r, l, 0] -= u[l] * v0
    # phase 3: zero the super-diagonal (i, i+1), i = 0 .. m-1
    for i in range(m):
        nxt = E[r, i, i + 1] if i + 1 < m else ext[i]
        cs, sn, h = _givens(E[r, i, i], nxt)
        _rotate_columns(E, r, ext, i, i, cs, sn, p, m)
        E[r, i, i] = h
        if i + 1 < m:
            E[r, i, i + 1] = 0.0
        else:
            ext[i] = 0.0


@njit(cache=True)
def _check(r, B, E, F_T, blowup, Q, rho):
    """``Q = BBᵀ + EEᵀ``, ``ρ = B F_Tᵀ`` of replica r into Q, rho; True when finite, ``max|Q| < blowup``."""
    p, r_T = B.shape[1], B.shape[2]
    m = E.shape[2]
    ps = F_T.shape[0]
    ok = True
    for i in range(p):
        for j in range(i + 1):
            acc = 0.0
            for a in range(r_T):
                acc += B[r, i, a] * B[r, j, a]
            for b in range(m):
                acc += E[r, i, b] * E[r, j, b]
            Q[i, j] = acc
            Q[j, i] = acc
            if not (abs(acc) < blowup):     # also catches NaN
                ok = False
        for l in range(ps):
            acc = 0.0
            for a in range(r_T):
                acc += B[r, i, a] * F_T[l, a]
            rho[i, l] = acc
            if not math.isfinite(acc):
                ok = False
    return ok


@njit(cache=True)
def _step(r, j, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, lam, u, v, ext):
    """One exact SGD step of replica ``r`` with the random numbers of step ``j``."""
    p, r_T = B.shape[1], B.shape[2]
    m = E.shape[2]
    ps = F_T.shape[0]
    # teacher output (+ label noise) and student fields
    y = 0.0
    for l in range(ps):
        nu = 0.0
        for a in range(r_T):
            nu += F_T[l, a] * G[j, r, a]
        y += _horner(c, nu)
    y /= ps
    if XI.shape[0] > 0:
        y += XI[j, r]
    yhat = 0.0
    for i in range(p):
        acc = 0.0
        for a in range(r_T):
            acc += B[r, i, a] * G[j, r, a]
        top = i + 1 if triangular else m
        for b in range(top):
            acc += E[r, i, b] * G[j, r, r_T + b]
        lam[i] = acc
        yhat += _horner(c, acc)
    err = (yhat / p - y) * coef
    for i in range(p):
        u[i] = err * _horner(dc, lam[i])
    for i in range(p):
        for a in range(r_T):
            B[r, i, a] -= u[i] * G[j, r, a]
    if residual:
        for b in range(m):
            v[b] = G[j, r, r_T + b]
        v[m] = math.sqrt(S[j, r])
        _lq_rank_one_update(E, r, u, v, ext, m, p)
    else:
        for i in range(p):
            for b in range(m):
                E[r, i, b] -= u[i] * G[j, r, r_T + b]


#: Replicas advanced in lock-step by one kernel loop: their steps are
#: independent, so the processor overlaps their (latency-bound) rotations.
GROUP = 8


@njit(cache=True)
def _group(g, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
           check_every, blowup, caught_step, last_step, last_Q, last_rho):
    """Advance replicas ``GROUP·g ..`` by ``G.shape[0]`` steps, step by step in lock-step."""
    R, p = B.shape[0], B.shape[1]
    m = E.shape[2]
    ps = F_T.shape[0]
    r0 = g * GROUP
    r1 = min(R, r0 + GROUP)
    lam = np.empty(p)
    u = np.empty(p)
    v = np.empty(m + 1)
    ext = np.empty(p)
    Qc = np.empty((p, p))
    rc = np.empty((p, ps))
    for j in range(G.shape[0]):
        step = step0 + j + 1
        check = step % check_every == 0
        for r in range(r0, r1):
            if not alive[r]:
                continue
            _step(r, j, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, lam, u, v,
                  ext)
            if check:
                if _check(r, B, E, F_T, blowup, Qc, rc):
                    last_step[r] = step
                    last_Q[r, :, :] = Qc
                    last_rho[r, :, :] = rc
                else:
                    caught_step[r] = step
                    alive[r] = False


@njit(cache=True, nogil=True)
def reduced_steps(B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
                  check_every, blowup, caught_step, last_step, last_Q, last_rho):
    """Advance every live replica by ``G.shape[0]`` exact SGD steps (serial over replicas).

    Parameters
    ----------
    B : (R, p, r_T), E : (R, p, m)
        Student coordinates (updated in place).
    F_T : (p*, r_T)
        Teacher coordinates, shared by the replicas.
    c, dc : 1-d arrays
        Coefficients of ``σ`` and ``σ'`` (lowest degree first).
    coef : float
        ``η / (p N)``.
    G : (n, R, r_T + m)
        Standard normals (step-major, so that splitting the steps into calls
        does not change which numbers a step uses).
    S : (n, R)
        ``χ²_{N−k}`` draws (unused unless `residual`).
    XI : (n, R) or (0, R)
        Label noise ``√Δ ξ`` (empty: no noise).
    residual : bool
        Include the input's component outside the basis (LQ update); E must
        then be square lower triangular.
    triangular : bool
        E is lower triangular (lets the fields skip its zeros).
    alive : (R,) bool
        Replicas to advance; set False where the divergence check fails.
    step0 : int
        Absolute step count before this call.
    check_every : int
        Divergence check at absolute steps that are multiples of this.
    blowup : float
        ``max|Q| >= blowup`` or a non-finite overlap counts as divergence.
    caught_step, last_step : (R,) int64
        Step of the failed check; step of the last passed check (in place).
    last_Q, last_rho : (R, p, p), (R, p, p*)
        Overlaps at the last passed check (in place).
    """
    for g in range((B.shape[0] + GROUP - 1) // GROUP):
        _group(g, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
               check_every, blowup, caught_step, last_step, last_Q, last_rho)


@njit(cache=True, nogil=True)
def full_update(W, Ws, x, c, dc, coef, xi, alive):
    r"""One SGD step of the full simulator, in place: ``w_k ← w_k − δ_k x/√N``.

    Parameters
    ----------
    W : (R, p, N)
        Student weights (updated in place).
    Ws : (p*, N)
        Teacher weights.
    x : (R, N)
        Inputs of this step, already divided by ``√N``.
    c, dc : 1-d arrays
        Coefficients of ``σ`` and ``σ'``.
    coef : float
        ``η/p``.
    xi : (R,) or (0,)
        Label noise ``√Δ ξ`` (empty: none).
    alive : (R,) bool
    """
    R, p, N = W.shape
    ps = Ws.shape[0]
    lam = np.empty(p)
    noise = xi.shape[0] > 0
    for r in range(R):
        if not alive[r]:
            continue
        y = 0.0
        for l in range(ps):
            acc = 0.0
            for n in range(N):
                acc += Ws[l, n] * x[r, n]
            y += _horner(c, acc)
        y /= ps
        if noise:
            y += xi[r]
        yhat = 0.0
        for k in range(p):
            acc = 0.0
            for n in range(N):
                acc += W[r, k, n] * x[r, n]
            lam[k] = acc
            yhat += _horner(c, acc)
        err = (yhat / p - y) * coef
        for k in range(p):
            d = err * _horner(dc, lam[k])
            for n in range(N):
                W[r, k, n] -= d * x[r, n]


# ---------------------------------------------------------------------------
# the same step for a group of replicas at once (structure of arrays)
# ---------------------------------------------------------------------------
#: Replicas per group of the vectorised kernel (a compile-time constant, so
#: that every replica loop is unrolled into SIMD instructions).
LANES = 8


@njit(cache=True)
def _horner_lanes(coeffs, z, out):
    """``out[w] = Σ_j coeffs[j] z[w]^j`` for every lane ``w``."""
    top = coeffs[coeffs.size - 1]
    for w in range(LANES):
        out[w] = top
    for j in range(coeffs.size - 2, -1, -1):
        cj = coeffs[j]
        for w in range(LANES):
            out[w] = out[w] * z[w] + cj


@njit(cache=True)
def _givens_lanes(a, b, cs, sn, h):
    """Lane-wise :func:`_givens` without branches (selects vectorise)."""
    for w in range(LANES):
        r = math.sqrt(a[w] * a[w] + b[w] * b[w])
        nz = r > 0.0
        inv = 1.0 / (r if nz else 1.0)
        cs[w] = a[w] * inv if nz else 1.0
        sn[w] = b[w] * inv
        h[w] = r


@njit(cache=True)
def _rotate_lanes(e, ext, rows_from, i, cs, sn, p, m):
    """Lane-wise :func:`_rotate_columns` on ``e`` (p, m, LANES) and ``ext`` (p, LANES)."""
    for l in range(rows_from, p):
        if i + 1 < m:
            for w in range(LANES):
                a = e[l, i, w]
                b = e[l, i + 1, w]
                e[l, i, w] = cs[w] * a + sn[w] * b
                e[l, i + 1, w] = cs[w] * b - sn[w] * a
        else:
            for w in range(LANES):
                a = e[l, i, w]
                b = ext[l, w]
                e[l, i, w] = cs[w] * a + sn[w] * b
                ext[l, w] = cs[w] * b - sn[w] * a


@njit(cache=True)
def _group_lanes(g, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
                 check_every, blowup, caught_step, last_step, last_Q, last_rho):
    """Replicas ``LANES·g ..`` advanced together, one SIMD lane each (same arithmetic as :func:`_step`)."""
    R, p, r_T = B.shape
    m = E.shape[2]
    ps = F_T.shape[0]
    k = r_T + m
    r0 = g * LANES
    nr = min(LANES, R - r0)
    b = np.zeros((p, r_T, LANES))
    e = np.zeros((p, m, LANES))
    ext = np.zeros((p, LANES))
    x = np.zeros((k, LANES))
    v = np.zeros((m + 1, LANES))
    lam = np.zeros((p, LANES))
    u = np.zeros((p, LANES))
    live = np.zeros(LANES)
    nu = np.zeros(LANES)
    f = np.zeros(LANES)
    y = np.zeros(LANES)
    yhat = np.zeros(LANES)
    err = np.zeros(LANES)
    cs = np.zeros(LANES)
    sn = np.zeros(LANES)
    h = np.zeros(LANES)
    va = np.zeros(LANES)
    vb = np.zeros(LANES)
    Qc = np.empty((p, p))
    rc = np.empty((p, ps))
    noise = XI.shape[0] > 0
    for w in range(nr):
        live[w] = 1.0 if alive[r0 + w] else 0.0
        for i in range(p):
            for a in range(r_T):
                b[i, a, w] = B[r0 + w, i, a]
            for a in range(m):
                e[i, a, w] = E[r0 + w, i, a]
    for j in range(G.shape[0]):
        for w in range(nr):
            for a in range(k):
                x[a, w] = G[j, r0 + w, a]
        # teacher output (+ label noise)
        for w in range(LANES):
            y[w] = 0.0
        for l in range(ps):
            for w in range(LANES):
                nu[w] = 0.0
            for a in range(r_T):
                fl = F_T[l, a]
                for w in range(LANES):
                    nu[w] += fl * x[a, w]
            _horner_lanes(c, nu, f)
            for w in range(LANES):
                y[w] += f[w]
        for w in range(LANES):
            y[w] /= ps
        if noise:
            for w in range(nr):
                y[w] += XI[j, r0 + w]
        # student fields
        for w in range(LANES):
            yhat[w] = 0.0
        for i in range(p):
            for w in range(LANES):
                nu[w] = 0.0
            for a in range(r_T):
                for w in range(LANES):
                    nu[w] += b[i, a, w] * x[a, w]
            top = i + 1 if triangular else m
            for a in range(top):
                for w in range(LANES):
                    nu[w] += e[i, a, w] * x[r_T + a, w]
            for w in range(LANES):
                lam[i, w] = nu[w]
            _horner_lanes(c, nu, f)
            for w in range(LANES):
                yhat[w] += f[w]
        for w in range(LANES):
            err[w] = (yhat[w] / p - y[w]) * coef * live[w]
        for i in range(p):
            for w in range(LANES):
                nu[w] = lam[i, w]
            _horner_lanes(dc, nu, f)
            for w in range(LANES):
                u[i, w] = err[w] * f[w]
        for i in range(p):
            for a in range(r_T):
                for w in range(LANES):
                    b[i, a, w] -= u[i, w] * x[a, w]
        if residual:
            for a in range(m):
                for w in range(LANES):
                    v[a, w] = x[r_T + a, w]
            for w in range(nr):
                v[m, w] = math.sqrt(S[j, r0 + w])
            for i in range(p):
                for w in range(LANES):
                    ext[i, w] = 0.0
            # phase 1: v -> (‖v‖, 0, ..., 0)
            for i in range(m, 0, -1):
                for w in range(LANES):
                    va[w] = v[i - 1, w]
                    vb[w] = v[i, w]
                _givens_lanes(va, vb, cs, sn, h)
                for w in range(LANES):
                    v[i - 1, w] = h[w]
                    v[i, w] = 0.0
                _rotate_lanes(e, ext, i - 1, i - 1, cs, sn, p, m)
            # phase 2: rank-one term on the first column
            for l in range(p):
                for w in range(LANES):
                    e[l, 0, w] -= u[l, w] * v[0, w]
            # phase 3: zero the super-diagonal
            for i in range(m):
                for w in range(LANES):
                    va[w] = e[i, i, w]
                    vb[w] = e[i, i + 1, w] if i + 1 < m else ext[i, w]
                _givens_lanes(va, vb, cs, sn, h)
                _rotate_lanes(e, ext, i, i, cs, sn, p, m)
                for w in range(LANES):
                    e[i, i, w] = h[w]
                    if i + 1 < m:
                        e[i, i + 1, w] = 0.0
                    else:
                        ext[i, w] = 0.0
        else:
            for i in range(p):
                for a in range(m):
                    for w in range(LANES):
                        e[i, a, w] -= u[i, w] * x[r_T + a, w]
        step = step0 + j + 1
        if step % check_every == 0:
            for w in range(nr):
                if live[w] == 0.0:
                    continue
                ok = True
                for i in range(p):
                    for jj in range(i + 1):
                        acc = 0.0
                        for a in range(r_T):
                            acc += b[i, a, w] * b[jj, a, w]
                        for a in range(m):
                            acc += e[i, a, w] * e[jj, a, w]
                        Qc[i, jj] = acc
                        Qc[jj, i] = acc
                        if not (abs(acc) < blowup):
                            ok = False
                    for l in range(ps):
                        acc = 0.0
                        for a in range(r_T):
                            acc += b[i, a, w] * F_T[l, a]
                        rc[i, l] = acc
                        if not math.isfinite(acc):
                            ok = False
                if ok:
                    last_step[r0 + w] = step
                    last_Q[r0 + w, :, :] = Qc
                    last_rho[r0 + w, :, :] = rc
                else:
                    caught_step[r0 + w] = step
                    alive[r0 + w] = False
                    live[w] = 0.0
                    # keep the state where it was caught (as the scalar kernel does)
                    for i in range(p):
                        for a in range(r_T):
                            B[r0 + w, i, a] = b[i, a, w]
                        for a in range(m):
                            E[r0 + w, i, a] = e[i, a, w]
    for w in range(nr):
        if live[w] == 0.0:
            continue                       # frozen: B, E hold its last state
        for i in range(p):
            for a in range(r_T):
                B[r0 + w, i, a] = b[i, a, w]
            for a in range(m):
                E[r0 + w, i, a] = e[i, a, w]


@njit(cache=True, nogil=True)
def reduced_steps_lanes(B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
                        check_every, blowup, caught_step, last_step, last_Q, last_rho):
    """:func:`reduced_steps` vectorised over groups of :data:`LANES` replicas (same numbers)."""
    for g in range((B.shape[0] + LANES - 1) // LANES):
        _group_lanes(g, B, E, F_T, c, dc, coef, G, S, XI, residual, triangular, alive, step0,
                     check_every, blowup, caught_step, last_step, last_Q, last_rho)


# ---------------------------------------------------------------------------
# every field of the model specification: readouts, σ*, weight decay,
# mini-batches, the sphere, a trained readout (one replica at a time)
# ---------------------------------------------------------------------------
@njit(cache=True)
def _lq_reduce(X, p, width):
    """Givens rotations of the columns of ``X`` (p × width) until it is ``[L | 0]``, L lower triangular.

    Row ``i``'s entries right of the diagonal are rotated into column ``i`` (from
    the right, so the rows above, already triangular, are untouched); the Gram
    matrix ``X Xᵀ`` is unchanged.
    """
    for i in range(p):
        for j in range(width - 1, i, -1):
            a = X[i, j - 1]
            b = X[i, j]
            if b == 0.0:
                continue
            cs, sn, h = _givens(a, b)
            for l in range(i, p):
                x = X[l, j - 1]
                y = X[l, j]
                X[l, j - 1] = cs * x + sn * y
                X[l, j] = cs * y - sn * x
            X[i, j - 1] = h
            X[i, j] = 0.0


@njit(cache=True)
def _general_step(r, j, B, E, F_T, A, bs, c, dc, ct, kinds, coef, coef_a, shrink, cw, sphere, trained,
                  G, S, L, XI, residual, triangular, lam, sig, U, D, u, v, ext, X):
    """One exact SGD step of replica ``r`` on a mini-batch (the ``G.shape[2]`` samples of step ``j``).

    The samples' fields and errors are computed at the current weights; then
    the readout (if trained), the weight decay ``w ← shrink·w``, the averaged
    gradient (``coef = η/(p b N)``; ``A`` holds ``p·a``, ``bs`` holds ``p*·b``) and
    the spherical renormalisation are applied.  The inputs' components outside
    the basis have the Gram matrix ``L Lᵀ`` of a Bartlett factor (``S`` its
    squared diagonal, ``L`` its sub-diagonal entries row by row): a
    ``Wishart_b(N − k, I)`` matrix, the exact law of ``b`` fresh inputs.
    """
    p, r_T = B.shape[1], B.shape[2]
    m = E.shape[2]
    ps = F_T.shape[0]
    nb = G.shape[2]
    for mu in range(nb):
        y = 0.0
        for l in range(ps):
            nu = 0.0
            for a in range(r_T):
                nu += F_T[l, a] * G[j, r, mu, a]
            y += bs[l] * _sigma(kinds[1], ct, nu)
        y /= ps
        if XI.shape[0] > 0:
            y += XI[j, r, mu]
        yhat = 0.0
        for i in range(p):
            acc = 0.0
            for a in range(r_T):
                acc += B[r, i, a] * G[j, r, mu, a]
            top = i + 1 if triangular else m
            for b in range(top):
                acc += E[r, i, b] * G[j, r, mu, r_T + b]
            lam[i] = acc
            s = _sigma(kinds[0], c, acc)
            sig[mu, i] = s
            yhat += A[r, i] * s
        delta = cw * yhat / p - y  # the loss's error signal c yhat - y
        D[mu] = delta
        err = delta * coef
        for i in range(p):
            U[mu, i] = err * A[r, i] * _dsigma(kinds[0], dc, lam[i])
    if trained:
        for i in range(p):
            acc = 0.0
            for mu in range(nb):
                acc += D[mu] * sig[mu, i]
            A[r, i] -= coef_a * acc
    for i in range(p):
        for a in range(r_T):
            acc = shrink * B[r, i, a]
            for mu in range(nb):
                acc -= U[mu, i] * G[j, r, mu, a]
            B[r, i, a] = acc
    if not residual:
        for i in range(p):
            for b in range(m):
                acc = shrink * E[r, i, b]
                for mu in range(nb):
                    acc -= U[mu, i] * G[j, r, mu, r_T + b]
                E[r, i, b] = acc
    elif nb == 1:
        if shrink != 1.0:
            for i in range(p):
                for b in range(i + 1):
                    E[r, i, b] *= shrink
        for i in range(p):
            u[i] = U[0, i]
        for b in range(m):
            v[b] = G[j, r, 0, r_T + b]
        v[m] = math.sqrt(S[j, r, 0])
        _lq_rank_one_update(E, r, u, v, ext, m, p)
    else:
        width = m + nb
        for i in range(p):
            for b in range(m):
                X[i, b] = shrink * E[r, i, b]
            for b in range(m, width):
                X[i, b] = 0.0
        pos = 0
        for mu in range(nb):
            # row mu of the Bartlett factor: L_{mu, 0..mu-1} then sqrt(S_mu)
            for i in range(p):
                w = U[mu, i]
                for b in range(m):
                    X[i, b] -= w * G[j, r, mu, r_T + b]
                for c2 in range(mu):
                    X[i, m + c2] -= w * L[j, r, pos + c2]
                X[i, m + mu] -= w * math.sqrt(S[j, r, mu])
            pos += mu
        _lq_reduce(X, p, width)
        for i in range(p):
            for b in range(m):
                E[r, i, b] = X[i, b]
    if sphere:
        for i in range(p):
            n2 = 0.0
            for a in range(r_T):
                n2 += B[r, i, a] * B[r, i, a]
            for b in range(m):
                n2 += E[r, i, b] * E[r, i, b]
            if n2 > 0.0:
                scale = 1.0 / math.sqrt(n2)
                for a in range(r_T):
                    B[r, i, a] *= scale
                for b in range(m):
                    E[r, i, b] *= scale


@njit(cache=True, nogil=True)
def reduced_steps_general(B, E, F_T, A, bs, c, dc, ct, kinds, coef, coef_a, shrink, cw, sphere, trained,
                          G, S, L, XI, residual, triangular, alive, step0, check_every, blowup,
                          caught_step, last_step, last_Q, last_rho, last_a):
    """:func:`reduced_steps` for every field of the model specification (one replica at a time).

    Extra parameters: ``A`` (R, p) the student readout times ``p`` (updated
    in place when `trained`); ``bs`` (p*,) the teacher readout times ``p*``;
    ``ct`` the coefficients of ``σ*``; ``kinds`` (int64, 2) the activation kinds
    of student and teacher (:data:`ACTIVATION_KINDS`: 0 a polynomial given by
    ``c, dc`` / ``ct``, 1 erf(z/√2), 2 ReLU); ``coef_a = p η_a/(b N)``; ``shrink =
    1 − ηλ/N``; ``cw`` the coefficient ``c`` of ``ŷ`` in the loss's error signal ``c ŷ − y``
    (:func:`symquad.spec.error_signal_weight`: 1 square loss, 0 correlation loss); `sphere`;
    ``G`` (n, R, b, k); ``S`` (n, R, b) the squared
    diagonal of the inputs' Bartlett factor outside the basis, ``L`` (n, R,
    b(b−1)/2) its sub-diagonal; ``XI`` (n, R, b) or empty; ``last_a`` (R, p).
    For a model with only the classic fields it gives the numbers of
    :func:`reduced_steps` bit for bit.
    """
    R, p = B.shape[0], B.shape[1]
    m = E.shape[2]
    ps = F_T.shape[0]
    nb = G.shape[2]
    lam = np.empty(p)
    sig = np.empty((nb, p))
    U = np.empty((nb, p))
    D = np.empty(nb)
    u = np.empty(p)
    v = np.empty(m + 1)
    ext = np.empty(p)
    X = np.empty((p, m + nb))
    Qc = np.empty((p, p))
    rc = np.empty((p, ps))
    for j in range(G.shape[0]):
        step = step0 + j + 1
        check = step % check_every == 0
        for r in range(R):
            if not alive[r]:
                continue
            _general_step(r, j, B, E, F_T, A, bs, c, dc, ct, kinds, coef, coef_a, shrink, cw, sphere,
                          trained, G, S, L, XI, residual, triangular, lam, sig, U, D, u, v,
                          ext, X)
            if check:
                ok = _check(r, B, E, F_T, blowup, Qc, rc)
                if trained:
                    for i in range(p):
                        if not (abs(A[r, i]) < blowup):
                            ok = False
                if ok:
                    last_step[r] = step
                    last_Q[r, :, :] = Qc
                    last_rho[r, :, :] = rc
                    for i in range(p):
                        last_a[r, i] = A[r, i]
                else:
                    caught_step[r] = step
                    alive[r] = False


@njit(cache=True, nogil=True)
def full_update_general(W, Ws, x, A, bs, c, dc, ct, kinds, coef, coef_a, shrink, cw, sphere, trained, xi,
                        alive):
    r"""One SGD step of the full simulator on a mini-batch, in place.

    ``w_k ← shrink·w_k − Σ_μ δ_k^μ x^μ/√N``, then (sphere) ``|w_k|² = N``;
    ``x`` (R, b, N) already divided by ``√N``; ``A``, ``bs``, ``coef``,
    ``coef_a``, ``shrink``, ``cw`` as in :func:`reduced_steps_general`; ``xi`` (R, b)
    or (0, 0).
    """
    R, p, N = W.shape
    ps = Ws.shape[0]
    nb = x.shape[1]
    lam = np.empty(p)
    U = np.empty((nb, p))
    sig = np.empty((nb, p))
    D = np.empty(nb)
    noise = xi.shape[0] > 0
    for r in range(R):
        if not alive[r]:
            continue
        for mu in range(nb):
            y = 0.0
            for l in range(ps):
                acc = 0.0
                for n in range(N):
                    acc += Ws[l, n] * x[r, mu, n]
                y += bs[l] * _sigma(kinds[1], ct, acc)
            y /= ps
            if noise:
                y += xi[r, mu]
            yhat = 0.0
            for k in range(p):
                acc = 0.0
                for n in range(N):
                    acc += W[r, k, n] * x[r, mu, n]
                lam[k] = acc
                s = _sigma(kinds[0], c, acc)
                sig[mu, k] = s
                yhat += A[r, k] * s
            delta = cw * yhat / p - y  # the loss's error signal c yhat - y
            D[mu] = delta
            err = delta * coef
            for k in range(p):
                U[mu, k] = err * A[r, k] * _dsigma(kinds[0], dc, lam[k])
        if trained:
            for k in range(p):
                acc = 0.0
                for mu in range(nb):
                    acc += D[mu] * sig[mu, k]
                A[r, k] -= coef_a * acc
        for k in range(p):
            if shrink != 1.0:
                for n in range(N):
                    W[r, k, n] *= shrink
            for mu in range(nb):
                d = U[mu, k]
                for n in range(N):
                    W[r, k, n] -= d * x[r, mu, n]
            if sphere:
                n2 = 0.0
                for n in range(N):
                    n2 += W[r, k, n] * W[r, k, n]
                if n2 > 0.0:
                    scale = math.sqrt(N / n2)
                    for n in range(N):
                        W[r, k, n] *= scale
