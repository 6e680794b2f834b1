"""Monte Carlo simulation of one-pass SGD in the teacher–student model of docs/model.md.

Two simulators share one driver and one output type (:class:`SimulationRun`):

``method="full"``
    Real SGD on ``N``-dimensional weights.  Each step draws ``b`` fresh inputs
    ``x^μ ~ N(0, I_N)`` per replica (``b = batch_size``), computes the local
    fields ``λ_k = w_k·x/√N``, ``ν_m = w*_m·x/√N``, the outputs
    ``ŷ = Σ_k a_k σ(λ_k)``, ``y = Σ_m b_m σ*(ν_m) + √Δ ξ`` and updates (docs/model.md §2)

    .. math::  w_k \\leftarrow \\Big(1 - \\frac{ηλ}{N}\\Big) w_k
               - \\frac{η}{b}\\sum_μ a_k (ŷ^μ - y^μ)\\,σ'(λ^μ_k)\\,\\frac{x^μ}{\\sqrt N},
               \\qquad a_k \\leftarrow a_k - \\frac{η_a}{bN}\\sum_μ (ŷ^μ - y^μ)\\,σ(λ^μ_k),

    then, with ``constraint="sphere"``, renormalises every row to ``|w_k|² = N``.
    With the defaults this is ``w_k ← w_k − (η/p)(ŷ − y) σ'(λ_k) x/√N``.
    Cost per step ``O(replicas · b · (p + p*) · N)``.

``method="reduced"``
    The same process, exactly in law, with a cost per step independent of
    ``N``.  Because ``x`` is isotropic, only the Gram matrix of the weights
    matters.  The simulator keeps coordinates ``X`` (a ``(p+p*) × k`` matrix
    per replica, ``k ≤ p + p*``) of the rows of ``[W; W*]/√N`` in an
    orthonormal basis ``e_1..e_k`` of a subspace that contains them, so that
    ``C = X Xᵀ = [[Q, ρ], [ρᵀ, T]]``.  A fresh input is written

    .. math::  x = \\sum_{i \\le k} g_i e_i + s\\, e_{k+1},\\qquad
               g_i \\sim N(0,1),\\quad s^2 \\sim χ^2_{N-k},

    where ``e_{k+1}`` is the (random, uniformly distributed) direction of the
    part of ``x`` outside the basis; by rotational invariance its only
    relevant property is its norm, an independent chi-square variable with
    ``N − k`` degrees of freedom.  Then ``(λ, ν) = X g`` has exactly the law
    ``N(0, C)``, ``‖x‖²/N = (‖g‖² + s²)/N``, and the update is
    ``X_student ← X_student − (δ/N) (g, s)`` with
    ``δ_k = (η/p)(ŷ − y) σ'(λ_k)``.  After every step the new direction
    ``e_{k+1}`` is folded back: an orthogonal rotation of the columns (a
    rank-one LQ update by Givens rotations, ``O(p²)``) returns the
    coordinates to ``k`` columns with the same Gram matrix, so each step
    uses exactly the ``k = p + p*`` normals and the one chi-square its law
    needs (see :class:`_ReducedStepper`).  A mini-batch of ``b`` inputs has
    ``b`` components outside the basis whose Gram matrix is
    ``Wishart_b(N − k, I)``: it is drawn as a Bartlett factor (``χ²_{N−k−μ}``
    on the diagonal, normals below), the update adds ``b`` columns, and an LQ
    reduction by Givens rotations returns to ``k`` columns (``O(p²(p + b))``).
    Weight decay scales the student rows, the sphere renormalises them, a
    trained readout is updated from the same samples' errors.  This is the construction
    "(λ, ν) ~ N(0, C) plus a chi-square with N − rank degrees of freedom"
    (docs/model.md §9), written with a factor of ``C`` instead of ``C`` itself: the
    in-span part of ``‖x‖²`` is ``‖g‖² = zᵀC⁺z`` without forming a
    pseudo-inverse, a singular ``C`` (``W = 0``, or ``p > p*`` at a
    solution) needs no special case, and ``C = X Xᵀ`` stays symmetric
    positive semi-definite to round-off at every step.  The equivalence with
    ``method="full"`` is checked by two-sample tests (tests/test_simulate_equivalence.py).

    The deterministic part of a step runs in a compiled numba kernel
    (:mod:`symquad.numeric._sgd_kernels`; groups of 8 replicas in SIMD
    lanes, single-threaded); the random
    numbers are drawn with numpy.  The kernels are compiled on first use and
    cached on disk: the first call in a fresh installation pays that once
    (see docs/benchmarks.md for the measured cost).

Conventions
-----------
Default initial condition: student rows ``w_k ~ N(0, q0 I_N)`` with
``q0 = 1`` (:data:`DEFAULT_Q0`), teacher rows orthonormalised and scaled by
``√N`` so that ``T = I_{p*}`` exactly; ``Q(0) ≈ q0 I`` and ``ρ(0)`` has
entries of size ``√(q0/N)``.  With ``Q0, rho0`` (and optionally ``T``) the
weights are built with exactly that Gram matrix.  Time is ``t = steps/N``.

Random streams: one ``seed`` is split by :class:`numpy.random.SeedSequence`
into independent streams for the teacher, the initialisation, the inputs, the
label noise and (reduced simulator) the chi-square norms (so, e.g., the first
input is never correlated with the teacher, and turning label noise on does not
change the inputs).  Replicas are drawn together (batched, step-major), so the
numbers of replica ``r`` depend on the number of replicas requested; the same
``(seed, replicas, N, ...)`` always gives the same numbers, whatever the process
or the numba kernel used (the scalar and the SIMD-lane kernel agree bit for bit), and ``t_eval`` only chooses which states are
recorded (the trajectories themselves do not depend on it).

The population risk recorded with every state is computed from ``(Q, ρ, T)``
by Isserlis' theorem (:func:`population_risk`), independently of the
generated kernels, so it doubles as a second route for the kernels' risk.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import warnings
from numbers import Integral

import numpy as np

from ..spec import error_signal_weight
from ..stages import STAGES, declare
from .errors import DivergenceError, describe_state
from .checks import (as_real_array, check_float_activation, check_int as _check_int,
                     check_positive)
from .simulation_run import SimulationRun, block_population_risk, population_risk
from .sde import DEFAULT_DT, sde_noise, simulate_sde
from ..spec import check_model
from ..spec import Model
from ..spectrum import block_axis, block_sizes, check_block_room, has_spectrum
from ..progress import progress as _progress

__all__ = ["simulate", "SimulationRun", "population_risk", "DEFAULT_Q0", "METHODS",
           "SIMULATED_FIELDS"]

#: Variance of the default random initialisation ``w_k ~ N(0, q0 I_N)``.
DEFAULT_Q0 = 1.0
#: Simulation methods (``"sde"``: the order-parameter SDE of :mod:`symquad.numeric.sde`).
METHODS = ("reduced", "full", "sde")
#: Reduced simulator: steps between two divergence checks (made in its kernel).
_REDUCED_CHECK_EVERY = 16
#: Full simulator: steps between two divergence checks (the Gram matrix costs
#: ``O(p² N)`` per replica, so it is not computed every step).
_FULL_CHECK_EVERY = 64
#: Largest array of weights the full simulator allocates (bytes).
_FULL_MAX_BYTES = 8 * 2**30


# ---------------------------------------------------------------------------
# input validation and initial conditions
# ---------------------------------------------------------------------------




def _psd_factor(G, name, tol=1e-10):
    """Factor ``F`` (shape (..., n, r)) with ``F Fᵀ = G`` for a symmetric PSD ``G``.

    Eigenvalues below ``tol · max(1, |G|)`` in absolute value count as zero
    (so singular matrices are fine); clearly negative ones raise.
    """
    G = np.asarray(G, dtype=float)
    if not np.all(np.isfinite(G)):
        raise ValueError(f"{name} must be finite")
    if not np.allclose(G, np.swapaxes(G, -1, -2), rtol=1e-12, atol=1e-12):
        raise ValueError(f"{name} must be symmetric")
    G = 0.5 * (G + np.swapaxes(G, -1, -2))
    e, V = np.linalg.eigh(G)
    scale = max(1.0, float(np.max(np.abs(e))) if e.size else 1.0)
    if np.any(e < -tol * scale * 1e2):
        raise ValueError(f"{name} must be positive semi-definite; smallest eigenvalue "
                         f"{float(e.min()):.3g}")
    e = np.where(e > tol * scale, e, 0.0)
    return V * np.sqrt(e)[..., None, :], int(np.max(np.count_nonzero(e, axis=-1)))


def _initial_coordinates(model, N, replicas, Q0, rho0, T, rng_init):
    """Coordinates ``X0`` (replicas, p+p*, c) of ``[W; W*]/√N`` and the teacher overlaps.

    The first ``r_T = rank T`` basis vectors span the teacher; the student rows
    are ``[B | E]`` with ``B`` their components in the teacher span and ``E``
    those in an orthogonal complement.  ``Q0, rho0`` given: ``B`` solves
    ``B F_Tᵀ = ρ0`` and ``E Eᵀ = Q0 − B Bᵀ`` (the Schur complement; its
    positive semi-definiteness is that of the whole Gram matrix).  Random
    start: ``B`` has i.i.d. ``N(0, q0/N)`` entries and ``E`` is the Bartlett
    factor of a Wishart matrix, ``E Eᵀ ~ W_p(N − r_T, (q0/N) I)``, i.e. the
    exact law of the Gram matrix of ``p`` Gaussian vectors in the
    ``N − r_T`` dimensions orthogonal to the teacher.
    """
    p, ps = model.p, model.p_star
    if T is None:
        T = np.eye(ps)
    T = as_real_array(T, "T")  # complex/str refused, not truncated
    if T.shape != (ps, ps):
        raise ValueError(f"T must have shape (p_star, p_star) = ({ps}, {ps}), got {T.shape}")
    F_T, r_T = _psd_factor(T, "T")
    keep = np.linalg.norm(F_T, axis=0) > 0
    F_T = F_T[:, keep]                       # (p*, r_T)
    r_T = F_T.shape[1]
    if N < r_T:
        raise ValueError(f"N must be >= rank(T) = {r_T} to hold the teacher, got N={N}")
    if (Q0 is None) != (rho0 is None):
        raise ValueError("Q0 and rho0 must be given together (or both left None for a "
                         "random start)")
    if Q0 is None:
        n_perp = N - r_T
        q_scale = math.sqrt(DEFAULT_Q0 / N)
        B = q_scale * rng_init.standard_normal((replicas, p, r_T))
        if n_perp >= p:
            # Bartlett decomposition: L lower triangular, L_ii² ~ χ²_{n−i}, L_ij ~ N(0,1)
            L = np.tril(rng_init.standard_normal((replicas, p, p)), -1)
            diag = np.sqrt(rng_init.chisquare(n_perp - np.arange(p), size=(replicas, p)))
            L[:, np.arange(p), np.arange(p)] = diag
            E = q_scale * L
        else:
            E = q_scale * rng_init.standard_normal((replicas, p, n_perp))
    else:
        Q0 = as_real_array(Q0, "Q0")
        rho0 = as_real_array(rho0, "rho0")
        if Q0.shape not in ((p, p), (replicas, p, p)):
            raise ValueError(f"Q0 must have shape (p, p) = ({p}, {p}) or (replicas, p, p), "
                             f"got {Q0.shape}")
        if rho0.shape not in ((p, ps), (replicas, p, ps)):
            raise ValueError(f"rho0 must have shape (p, p_star) = ({p}, {ps}) or "
                             f"(replicas, p, p_star), got {rho0.shape}")
        if not (np.all(np.isfinite(Q0)) and np.all(np.isfinite(rho0))):
            raise ValueError("Q0 and rho0 must be finite")
        Q0 = np.broadcast_to(Q0, (replicas, p, p))
        rho0 = np.broadcast_to(rho0, (replicas, p, ps))
        gram_T = F_T.T @ F_T                                      # (r_T, r_T), invertible
        B = rho0 @ F_T @ np.linalg.inv(gram_T) if r_T else np.zeros((replicas, p, 0))
        resid = rho0 - B @ F_T.T
        scale = max(1.0, float(np.max(np.abs(rho0))))
        if np.max(np.abs(resid), initial=0.0) > 1e-8 * scale:
            raise ValueError("rho0 is inconsistent with T: the Gram matrix "
                             "[[Q0, rho0], [rho0ᵀ, T]] is not positive semi-definite "
                             "(rho0 has a component outside the range of T)")
        schur = Q0 - B @ np.swapaxes(B, -1, -2)
        try:
            E, _ = _psd_factor(schur, "the Schur complement Q0 − rho0 T⁺ rho0ᵀ")
        except ValueError as exc:
            raise ValueError(f"Q0, rho0, T: the Gram matrix [[Q0, rho0], [rho0ᵀ, T]] must be "
                             f"symmetric positive semi-definite ({exc})") from None
        keep = np.linalg.norm(E, axis=(0, 1)) > 0
        E = E[..., keep]
        if N < r_T + E.shape[-1]:
            raise ValueError(f"N must be >= rank of the initial Gram matrix "
                             f"({r_T + E.shape[-1]}) to hold these overlaps, got N={N}")
    c = r_T + E.shape[-1]
    X = np.zeros((replicas, p + ps, c))
    X[:, :p, :r_T] = B
    X[:, :p, r_T:] = E
    X[:, p:, :r_T] = F_T
    if model.constraint == "sphere":
        if Q0 is None:
            # w_k ~ N(0, q0 I_N) renormalised: uniform on the sphere |w_k|² = N
            X[:, :p] /= np.linalg.norm(X[:, :p], axis=-1, keepdims=True)
        else:
            # lazy: scipy
            from .integrate import check_sphere
            check_sphere(model, Q0)
    return X, T


# ---------------------------------------------------------------------------
# the two steppers
# ---------------------------------------------------------------------------
class _Activation:
    """``σ`` and ``σ'``: Horner's scheme from the coefficients, or erf(z/√2) / ReLU by name.

    Zero coefficients are skipped, so ``σ(z) = z²`` costs two array operations
    and ``σ'(z) = 2z`` one.  A named activation has the placeholder coefficients
    ``[0]`` (the compiled kernels dispatch on :attr:`kind`).
    """

    def __init__(self, activation):
        # lazy: numba
        from ._sgd_kernels import ACTIVATION_KINDS
        self.name = activation if isinstance(activation, str) else None
        self.kind = ACTIVATION_KINDS["polynomial" if self.name is None else self.name]
        coeffs = (0,) if self.name else activation
        self.c = [float(v) for v in coeffs]
        self.dc = [j * v for j, v in enumerate(self.c)][1:]
        #: ``c`` when ``σ(z) = c z² + c0``, else None (fast path of the reduced simulator)
        self.quadratic = self.c[2] if len(self.c) == 3 and self.c[1] == 0 else None

    def sigma(self, z):
        if self.name == "erf":
            from scipy.special import erf
            return erf(z / math.sqrt(2.0))
        if self.name == "relu":
            return np.maximum(z, 0.0)
        return _horner(self.c, z)

    def dsigma(self, z):
        if self.name == "erf":
            return math.sqrt(2.0 / math.pi) * np.exp(-0.5 * z * z)
        if self.name == "relu":
            return (z > 0).astype(float)
        return _horner(self.dc, z)


def _horner(coeffs, z):
    """``Σ_j coeffs[j] z^j`` by Horner's scheme, skipping zero coefficients."""
    if len(coeffs) == 1:
        return np.full_like(z, coeffs[0])
    out = z * coeffs[-1]
    for j in range(len(coeffs) - 2, -1, -1):
        if coeffs[j]:
            out += coeffs[j]
        if j:
            out *= z
    return out


class _Stepper:
    """Common SGD arithmetic: from local fields to the step sizes ``δ_k``.

    A model with only the classic fields runs the original kernels (and their
    numbers); any other runs the general kernels of
    :mod:`symquad.numeric._sgd_kernels`, which implement every field of the
    specification (:data:`SIMULATED_FIELDS`).  The readouts enter as ``p·a`` and
    ``p*·b`` (exactly 1 for the defaults, so the two kernels agree bit for bit
    on the classic model).
    """

    #: the stage of :data:`symquad.stages.STAGES` this simulator is (the fields it implements)
    STAGE = "simulate"

    def __init__(self, model, N, replicas, rng_data, rng_noise):
        declare(model, self.STAGE)
        self.p, self.ps = model.p, model.p_star
        self.N = N
        self.R = replicas
        self.act = _Activation(model.activation)
        self.eta_over_p = model.eta / model.p
        self.sqrt_noise = math.sqrt(model.noise)
        self.rng_data = rng_data
        self.rng_noise = rng_noise
        self.alive = np.ones(replicas, dtype=float)
        # erf and ReLU are simulated by the general kernels (activation-kind codes)
        self.general = bool(model.changed_fields()) or not model.is_polynomial
        self.batch = model.batch_size
        self.trained = model.readout_trained
        self.sphere = model.constraint == "sphere"
        self.A = np.tile([float(c * model.p) for c in model.readout], (replicas, 1))
        self.bs = np.array([float(c * model.p_star) for c in model.teacher_readout])
        teacher = _Activation(model.teacher_activation)
        self.ct = np.array(teacher.c, dtype=float)
        self.kinds = np.array([self.act.kind, teacher.kind], dtype=np.int64)
        self.shrink = 1.0 - model.eta * model.weight_decay / N
        # the loss's error signal c yhat - y (spec.LOSSES; the classic kernels are c = 1)
        self.cw = float(error_signal_weight(model))
        # a learning-rate schedule: step k (from 0) uses eta(k/N) = eta s(k/N) in the
        # gradient and in weight decay's shrink factor (the readout's eta_a is not scheduled)
        self.schedule = None if model.schedule.is_constant else model.schedule
        self.eta, self.weight_decay = model.eta, model.weight_decay
        self.coef_a = model.p * model.lr_readout / (model.batch_size * N)
        # ŷ − y_clean = σ(z) · a with a = (1/p, …, 1/p, −1/p*, …, −1/p*)
        self.out_weights = np.concatenate([np.full(self.p, 1.0 / self.p),
                                           np.full(self.ps, -1.0 / self.ps)])

    def _scheduled(self, step, coef):
        """``(coef · s(step/N), 1 − η s(step/N) λ/N)``: the step's scaled coefficients."""
        f = self.schedule.factor(step / self.N)
        return coef * f, 1.0 - self.eta * f * self.weight_decay / self.N

    def _noise_block(self, n):
        if self.sqrt_noise == 0.0:
            return None
        if self.general:
            return self.sqrt_noise * self.rng_noise.standard_normal((n, self.R, self.batch))
        return self.sqrt_noise * self.rng_noise.standard_normal((n, self.R))

    def readout(self):
        """The student readout ``a`` of every replica, (R, p)."""
        return self.A / self.p

    def _delta(self, z, xi, scale):
        """``scale · δ_k`` with ``δ_k = (η/p)(ŷ − y) σ'(λ_k)``, zero for frozen replicas.

        `z` holds ``(λ, ν)`` (shape (R, p+p*)); `xi` the label noise ``√Δ ξ`` or None.
        """
        err = self.act.sigma(z) @ self.out_weights
        if xi is not None:
            err -= xi
        err *= self.alive
        err *= self.eta_over_p * scale
        return err[:, None] * self.act.dsigma(z[:, :self.p])


class _FullStepper(_Stepper):
    """SGD on explicit ``N``-dimensional weights."""

    STAGE = "simulate(method='full')"

    def __init__(self, model, N, replicas, X0, rng_teacher, rng_init, rng_data, rng_noise,
                 random_student):
        super().__init__(model, N, replicas, rng_data, rng_noise)
        p = self.p
        self._check_memory(N, replicas, p)
        c = X0.shape[-1]
        sqrtN = math.sqrt(N)
        if random_student:
            # teacher: orthonormal frame of its span (teacher stream) times its factor
            # (the teacher occupies the first r_T = rank T coordinates of X0)
            F_T = X0[0, p:, :]
            r_T = int(np.count_nonzero(np.linalg.norm(F_T, axis=0)))
            frame = np.linalg.qr(rng_teacher.standard_normal((N, r_T)))[0].T   # (r_T, N)
            Ws = sqrtN * (F_T[:, :r_T] @ frame)                                # (p*, N)
            W = self._random_students(replicas, N, rng_init)
        else:
            # weights with exactly the Gram matrix X0 X0ᵀ: one random orthonormal frame
            frame = np.linalg.qr(rng_teacher.standard_normal((N, c)))[0].T    # (c, N)
            Ws = sqrtN * (X0[0, p:, :] @ frame)
            W = sqrtN * (X0[:, :p, :] @ frame)
        self._keep_weights(W, Ws)

    @staticmethod
    def _check_memory(N, replicas, p):
        nbytes = 8 * replicas * (p + 2) * N
        if nbytes > _FULL_MAX_BYTES:
            raise ValueError(f"method='full' with N={N} and replicas={replicas} needs about "
                             f"{nbytes / 2**30:.1f} GiB; use method='reduced' (exact in law, "
                             f"cost independent of N) or fewer replicas")

    def _random_students(self, replicas, N, rng_init):
        """``w_k ~ N(0, q0 I_N)`` (projected to ``|w_k|² = N`` on the sphere)."""
        W = math.sqrt(DEFAULT_Q0) * rng_init.standard_normal((replicas, self.p, N))
        if self.sphere:
            W *= math.sqrt(N) / np.linalg.norm(W, axis=-1, keepdims=True)
        return W

    def _keep_weights(self, W, Ws):
        """Store the weights (contiguous) and the step's constants."""
        self.W = np.ascontiguousarray(W)
        self.Ws = np.ascontiguousarray(Ws)
        self.sqrtN = math.sqrt(self.N)
        self.step = 0
        self.c = np.array(self.act.c, dtype=float)
        self.dc = np.array(self.act.dc if self.act.dc else [0.0], dtype=float)

    def advance(self, n):
        # lazy: numba
        from . import _sgd_kernels
        R, N = self.R, self.N
        xi = self._noise_block(n)
        inv = 1.0 / self.sqrtN
        no_noise = np.zeros(0)
        live = self.alive > 0
        if self.general:
            coef, shrink = self.eta_over_p / self.batch, self.shrink
            no_noise = np.zeros((0, 0))
            for j in range(n):
                if self.schedule is not None:
                    coef, shrink = self._scheduled(self.step + j, self.eta_over_p / self.batch)
                x = self.rng_data.standard_normal((R, self.batch, N))
                x *= inv
                _sgd_kernels.full_update_general(
                    self.W, self.Ws, x, self.A, self.bs, self.c, self.dc, self.ct, self.kinds,
                    coef, self.coef_a, shrink, self.cw, self.sphere, self.trained,
                    no_noise if xi is None else xi[j], live)
            self.step += n
            return
        for j in range(n):
            x = self.rng_data.standard_normal((R, N))
            x *= inv
            # fields, δ and the rank-one update of W fused in one compiled pass
            _sgd_kernels.full_update(self.W, self.Ws, x, self.c, self.dc, self.eta_over_p,
                                     no_noise if xi is None else xi[j], live)

    def gram(self):
        N = self.N
        Q = np.matmul(self.W, np.swapaxes(self.W, -1, -2)) / N
        rho = np.matmul(self.W, self.Ws.T) / N
        return Q, rho

    def freeze(self, mask):
        self.alive[mask] = 0.0
        self.W[mask] = 0.0


class _ReducedStepper(_Stepper):
    r"""Exact-in-law SGD on the coordinates of ``[W; W*]/√N`` (see module docstring).

    The coordinates are kept as the teacher block ``F_T`` (``p* × r_T``,
    shared by the replicas and never modified, so ``T`` is exact), and per
    replica the student blocks ``B`` (``p × r_T``, components in the teacher
    span) and ``E`` (``p × m``, ``m = min(p, N − r_T)``, components in its
    orthogonal complement).  The basis has ``k = r_T + m`` vectors.  One step
    uses ``k`` standard normals and, when ``N > k``, one ``χ²_{N−k}`` (the
    squared norm of the input outside the basis); the new direction it
    creates is folded back by an orthogonal rotation of the complement
    columns, which keeps ``E`` lower triangular (a rank-one LQ update,
    ``O(p²)`` per step; see :mod:`symquad.numeric._sgd_kernels`).  This is
    the re-compression of the previous block scheme done after every step: the
    same law, without the extra normals a block of steps needs for the inputs'
    mutual inner products.

    Random numbers are drawn with numpy in chunks of steps, step-major
    (``(steps, replicas, k)`` normals, ``(steps, replicas)`` chi-squares),
    each kind from its own stream, so the numbers do not depend on the
    chunking; the deterministic update runs in a compiled kernel, which also
    makes the divergence check every `check_every` steps.
    """

    STAGE = "simulate(method='reduced')"

    def __init__(self, model, N, replicas, X0, rng_data, rng_noise, rng_chi, residual=True,
                 check_every=16, blowup=1e8):
        super().__init__(model, N, replicas, rng_data, rng_noise)
        p, ps = self.p, self.ps
        X0 = np.asarray(X0, dtype=float)
        F_T = X0[0, p:, :]
        r_T = int(np.count_nonzero(np.any(F_T != 0, axis=0)))
        # _initial_coordinates puts the teacher in the first r_T columns
        self.F_T = np.ascontiguousarray(F_T[:, :r_T])
        m = min(p, N - r_T)
        self.k = r_T + m
        B = np.ascontiguousarray(X0[:, :p, :r_T])
        E = np.zeros((replicas, p, m))
        E[:, :, :X0.shape[-1] - r_T] = X0[:, :p, r_T:]
        # a residual direction exists when the basis does not fill R^N
        self.residual = bool(residual) and N > self.k
        if self.residual:
            # E = (LQ)'s L: same Gram matrix, lower triangular (m == p here)
            E = np.swapaxes(np.linalg.qr(np.swapaxes(E, -1, -2), mode="r"), -1, -2)
        self.B, self.E = B, np.ascontiguousarray(E)
        self.triangular = self.residual
        self.rng_chi = rng_chi
        self.c = np.array(self.act.c, dtype=float)
        self.dc = np.array(self.act.dc if self.act.dc else [0.0], dtype=float)
        self.coef = self.eta_over_p / N
        if self.general:
            self.coef = self.eta_over_p / N / self.batch
            if self.batch > 1 and self.residual and N - self.k < self.batch:
                raise ValueError(
                    f"method='reduced' with batch_size={self.batch} needs N >= p + p_star + "
                    f"batch_size = {self.k + self.batch} (the batch's inputs outside the "
                    f"weights' span), got N={N}; use method='full' or a larger N")
        self.last_a = self.A.copy()
        self.check_every = int(check_every)
        self.blowup = float(blowup)
        self.step = 0
        self.live = np.ones(replicas, dtype=bool)
        self.caught_step = np.full(replicas, -1, dtype=np.int64)
        self.last_step = np.full(replicas, -1, dtype=np.int64)
        self.last_Q = np.zeros((replicas, p, p))
        self.last_rho = np.zeros((replicas, p, ps))
        self._kernel = _reduced_kernel(replicas)

    def draw(self, n):
        """Random numbers of the next `n` steps: normals, chi-squares, label noise.

        General model: per step and replica ``b`` samples of ``k`` normals, the
        squared diagonal ``χ²_{N−k−μ}`` (``μ = 0..b−1``) and the ``b(b−1)/2``
        sub-diagonal normals of the Bartlett factor of the inputs' Gram matrix
        outside the basis.  For ``b = 1`` these are the same draws as the
        classic kernel's.
        """
        R = self.R
        if not self.general:
            G = self.rng_data.standard_normal((n, R, self.k))
            S = (self.rng_chi.chisquare(float(self.N - self.k), size=(n, R)) if self.residual
                 else _EMPTY)
            xi = self._noise_block(n)
            return G, S, (_EMPTY if xi is None else xi)
        b = self.batch
        G = self.rng_data.standard_normal((n, R, b, self.k))
        if self.residual:
            dof = float(self.N - self.k) - np.arange(b)
            S = self.rng_chi.chisquare(dof, size=(n, R, b))
            L = (self.rng_chi.standard_normal((n, R, b * (b - 1) // 2)) if b > 1
                 else _EMPTY3)
        else:
            S, L = _EMPTY3, _EMPTY3
        xi = self._noise_block(n)
        return G, S, L, (_EMPTY3 if xi is None else xi)

    def advance(self, n):
        chunk = _reduced_chunk(self.R, self.k * self.batch)
        while n > 0:
            m = min(n, chunk)
            if self.general and self.schedule is not None:
                # the same draws as without a schedule, stepped one at a time so that
                # step k gets eta(k/N)
                G, S, L, xi = self.draw(m)
                for j in range(m):
                    coef, shrink = self._scheduled(self.step + j, self.coef)
                    _sgd_kernels_module().reduced_steps_general(
                        self.B, self.E, self.F_T, self.A, self.bs, self.c, self.dc, self.ct,
                        self.kinds, coef, self.coef_a, shrink, self.cw, self.sphere, self.trained,
                        G[j:j + 1], S[j:j + 1], L[j:j + 1], xi[j:j + 1], self.residual,
                        self.triangular, self.live, self.step + j, self.check_every,
                        self.blowup, self.caught_step, self.last_step, self.last_Q,
                        self.last_rho, self.last_a)
            elif self.general:
                G, S, L, xi = self.draw(m)
                _sgd_kernels_module().reduced_steps_general(
                    self.B, self.E, self.F_T, self.A, self.bs, self.c, self.dc, self.ct,
                    self.kinds, self.coef, self.coef_a, self.shrink, self.cw, self.sphere, self.trained,
                    G, S, L, xi, self.residual, self.triangular, self.live, self.step,
                    self.check_every, self.blowup, self.caught_step, self.last_step,
                    self.last_Q, self.last_rho, self.last_a)
            else:
                G, S, xi = self.draw(m)
                self._kernel(self.B, self.E, self.F_T, self.c, self.dc, self.coef, G, S, xi,
                             self.residual, self.triangular, self.live, self.step,
                             self.check_every, self.blowup, self.caught_step, self.last_step,
                             self.last_Q, self.last_rho)
            self.step += m
            n -= m

    def pop_caught(self):
        """Replicas whose in-kernel divergence check failed since the last call.

        Returns ``(mask, caught_step, last_step, last_Q, last_rho)``; ``last_step``
        is -1 where no in-kernel check passed.
        """
        mask = self.caught_step >= 0
        out = (mask, self.caught_step.copy(), self.last_step.copy(), self.last_Q.copy(),
               self.last_rho.copy(), self.last_a / self.p)
        self.caught_step[mask] = -1
        return out

    @property
    def X(self):
        """Coordinates ``(R, p+p*, k)`` of ``[W; W*]/√N`` (``C = X Xᵀ``)."""
        R, p, r_T = self.B.shape
        X = np.zeros((R, p + self.ps, self.k))
        X[:, :p, :r_T] = self.B
        X[:, :p, r_T:] = self.E
        X[:, p:, :r_T] = self.F_T
        return X

    def gram(self):
        E, B = self.E, self.B
        Q = np.matmul(B, np.swapaxes(B, -1, -2)) + np.matmul(E, np.swapaxes(E, -1, -2))
        rho = np.matmul(B, self.F_T.T)
        return Q, rho

    def freeze(self, mask):
        self.alive[mask] = 0.0
        self.live[mask] = False


#: Reduced simulator: most random numbers drawn per chunk (bounds the memory).
_CHUNK_VALUES = 2**17
_EMPTY = np.zeros((0, 0))
_EMPTY3 = np.zeros((0, 0, 0))


# ---------------------------------------------------------------------------
# an input spectrum: x ~ N(0, Σ), Σ = Σ_c s_c P_c (docs/model.md §1a)
# ---------------------------------------------------------------------------
def _block_initial_coordinates(model, N, replicas, Q0, rho0, T, rng_init):
    """Per-block coordinates ``X0_c`` (replicas, p+p*, p+p*) and ``T`` (B, p*, p*).

    Block ``c`` holds ``N_c = f_c N`` consecutive coordinates (:func:`symquad.spectrum.
    block_sizes`).  In each block :func:`_initial_coordinates` builds the coordinates of
    the rows of ``[W; W*] P_c/√N`` in an orthonormal basis of the block: the given
    ``(Q0[c], rho0[c], T[c])`` exactly, or the random start ``w_k ~ N(0, q0 I_N)`` (drawn
    for ``N_c`` coordinates, then scaled by ``√(N_c/N)``: variance ``q0/N`` per
    coordinate of ``w/√N``) with the default teacher ``T^c = f_c I`` (rows orthonormal
    within each block, ``T = Σ_c T^c = I``).  Columns are padded to ``p + p*`` (any
    orthonormal basis containing the span gives the same law).  On the sphere a random
    start is renormalised on the Euclidean norm ``Σ_c |w_k P_c|²``.
    """
    p, ps = model.p, model.p_star
    n, B = p + ps, model.n_blocks
    sizes = check_block_room(model, N)
    f = [float(x) for x, _ in model.spectrum]
    plain = Model(p, ps, 1.0, activation=model.activation,
                  teacher_activation=model.teacher_activation)
    if T is None:
        T = np.stack([fc * np.eye(ps) for fc in f])
    T = as_real_array(T, "T")
    if T.shape != (B, ps, ps):
        raise ValueError(f"T must have shape {(B, ps, ps)} (one teacher overlap per input "
                         f"block; symquad.numeric.layout.block_teacher splits a total T), "
                         f"got {T.shape}")
    if (Q0 is None) != (rho0 is None):
        raise ValueError("Q0 and rho0 must be given together (or both left None for a "
                         "random start)")
    X = np.zeros((replicas, B, n, n))
    for c in range(B):
        if Q0 is None:
            Xc, _ = _initial_coordinates(plain, sizes[c], replicas, None, None, T[c], rng_init)
            Xc[:, :p] *= math.sqrt(sizes[c] / N)
        else:
            Q0 = as_real_array(Q0, "Q0")
            rho0 = as_real_array(rho0, "rho0")
            if Q0.shape[-3:] != (B, p, p) or rho0.shape[-3:] != (B, p, ps):
                raise ValueError(f"Q0 and rho0 must end in shapes {(B, p, p)} and "
                                 f"{(B, p, ps)} (one per input block), got {Q0.shape} and "
                                 f"{rho0.shape}")
            Xc, _ = _initial_coordinates(plain, sizes[c], replicas, Q0[..., c, :, :],
                                         rho0[..., c, :, :], T[c], rng_init)
        X[:, c, :, :Xc.shape[-1]] = Xc
    if model.constraint == "sphere":
        if Q0 is None:
            norm = np.sqrt((X[:, :, :p] ** 2).sum(axis=(1, 3)))              # (R, p)
            X[:, :, :p] /= norm[:, None, :, None]
        else:
            # lazy: scipy
            from .integrate import check_sphere
            check_sphere(model, Q0)
    return X, T


def _block_gram(X, p):
    """``(Q, ρ)`` per block from coordinates (..., B, p+p*, c)."""
    S = X[..., :p, :]
    return S @ np.swapaxes(S, -1, -2), S @ np.swapaxes(X[..., p:, :], -1, -2)


class _BlockFullStepper(_FullStepper):
    """SGD on ``N``-dimensional weights with inputs ``x = Σ^{1/2} z``, ``z ~ N(0, I_N)``.

    The general compiled step of the full simulator (every field) on inputs whose
    coordinates of block ``c`` are scaled by ``√s_c``; the overlaps are recorded per
    block (``W P_c Wᵀ/N``: the block's columns).
    """

    def __init__(self, model, N, replicas, X0, rng_teacher, rng_init, rng_data, rng_noise,
                 random_student):
        _Stepper.__init__(self, model, N, replicas, rng_data, rng_noise)
        self.general = True
        p = self.p
        self._check_memory(N, replicas, p)
        sizes = block_sizes(model.spectrum, N)
        self.cuts = np.cumsum((0,) + sizes)
        self.scale = np.repeat([math.sqrt(float(sc)) for _, sc in model.spectrum], sizes)
        sqrtN = math.sqrt(N)
        W = np.zeros((replicas, p, N))
        Ws = np.zeros((self.ps, N))
        for c, (a, b) in enumerate(zip(self.cuts[:-1], self.cuts[1:])):
            cols = X0.shape[-1]
            frame = np.linalg.qr(rng_teacher.standard_normal((b - a, cols)))[0].T
            Ws[:, a:b] = sqrtN * (X0[0, c, p:, :] @ frame)
            if not random_student:
                W[:, :, a:b] = sqrtN * (X0[:, c, :p, :] @ frame)
        if random_student:
            W = self._random_students(replicas, N, rng_init)
        self._keep_weights(W, Ws)

    def advance(self, n):
        # lazy: numba
        from . import _sgd_kernels
        R, N = self.R, self.N
        xi = self._noise_block(n)
        live = self.alive > 0
        coef, shrink = self.eta_over_p / self.batch, self.shrink
        no_noise = np.zeros((0, 0))
        scale = self.scale / self.sqrtN
        for j in range(n):
            if self.schedule is not None:
                coef, shrink = self._scheduled(self.step + j, self.eta_over_p / self.batch)
            x = self.rng_data.standard_normal((R, self.batch, N))
            x *= scale                                  # x ~ N(0, Σ), divided by √N
            _sgd_kernels.full_update_general(
                self.W, self.Ws, x, self.A, self.bs, self.c, self.dc, self.ct, self.kinds,
                coef, self.coef_a, shrink, self.cw, self.sphere, self.trained,
                no_noise if xi is None else xi[j], live)
        self.step += n

    def gram(self):
        N = self.N
        Q, rho = [], []
        for a, b in zip(self.cuts[:-1], self.cuts[1:]):
            W = self.W[:, :, a:b]
            Q.append(np.matmul(W, np.swapaxes(W, -1, -2)) / N)
            rho.append(np.matmul(W, self.Ws[:, a:b].T) / N)
        return np.stack(Q, 1), np.stack(rho, 1)


class _BlockReducedStepper(_Stepper):
    r"""Exact-in-law SGD with an input spectrum, at a cost per step independent of ``N``.

    Within block ``c`` the input is isotropic, ``P_c x = √s_c z_c``, so only the Gram
    matrix of the rows ``[W; W*] P_c/√N`` matters (the reduced simulator's argument,
    block by block; docs/model.md §9).  Per replica and block the coordinates ``X_c``
    (``n × n``, ``n = p + p*``) of those rows in an orthonormal basis ``e_1..e_n`` of the
    block containing them are kept; a mini-batch of ``b`` inputs is

    .. math::  P_c x^μ = √s_c \Big(\sum_{i \le n} g^μ_i e_i + \sum_{ν \le b} L^c_{μν}\, e'_ν\Big),

    ``g ~ N(0, 1)``, ``L^c`` the Bartlett factor of ``Wishart_b(f_c N − n, I)`` (the
    components outside the basis: ``χ²_{f_c N − n − μ}`` on the diagonal, normals
    below), the blocks independent.  The fields are ``λ = Σ_c √s_c X_c^{stud} g_c``; the
    step ``X_c^{stud} ← (1 − ηλ/N) X_c^{stud} − (η/(bN)) √s_c G (g_c, L^c)`` adds ``b``
    columns, and a QR factorisation (``X_newᵀ = Q R``, ``X_c ← Rᵀ``) returns to ``n``
    columns with the same Gram matrix.  The sphere renormalises every student row on its
    Euclidean norm ``Σ_c |X_c^{stud}|²``; a trained readout takes the batch mean of
    ``δ σ(λ_k)``.  Cost ``O(R B n² (n + b))`` per step.
    """

    STAGE = "simulate(method='reduced')"

    def __init__(self, model, N, replicas, X0, rng_data, rng_noise, rng_chi):
        super().__init__(model, N, replicas, rng_data, rng_noise)
        self.X = np.array(X0, dtype=float)                          # (R, B, n, n)
        self.sizes = np.array(block_sizes(model.spectrum, N))
        self.root = np.array([math.sqrt(float(sc)) for _, sc in model.spectrum])
        self.rng_chi = rng_chi
        self.step = 0
        self.sig_t = _Activation(model.teacher_activation)
        self.a = np.tile([float(c) for c in model.readout], (replicas, 1))
        self.b_out = np.array([float(c) for c in model.teacher_readout])
        self.lr_readout = model.lr_readout

    def _bartlett(self):
        R, B, b, n = self.R, len(self.sizes), self.batch, self.p + self.ps
        L = np.tril(self.rng_chi.standard_normal((R, B, b, b)), -1)
        dof = self.sizes[None, :, None] - n - np.arange(b)[None, None, :]     # (1, B, b)
        L[..., np.arange(b), np.arange(b)] = np.sqrt(
            self.rng_chi.chisquare(np.broadcast_to(dof, (R, B, b))))
        return L

    def advance(self, n_steps):
        R, B, n, b = self.R, len(self.sizes), self.p + self.ps, self.batch
        for _ in range(n_steps):
            g = self.rng_data.standard_normal((R, B, b, n))
            L = self._bartlett()
            xi = (self.sqrt_noise * self.rng_noise.standard_normal((R, b))
                  if self.sqrt_noise else None)
            self.apply(g, L, xi)

    def apply(self, g, L, xi):
        """One step with the in-span normals `g` (R, B, b, n), the Bartlett factors `L`
        (R, B, b, b) of the components outside the basis and the label noise ``√Δ ξ``
        `xi` (R, b) or None (:meth:`advance` draws them)."""
        p, b = self.p, self.batch
        root = self.root[None, :, None, None]
        f = 1.0 if self.schedule is None else self.schedule.factor(self.step / self.N)
        coef = self.eta * f / (b * self.N)
        shrink = 1.0 - self.eta * f * self.weight_decay / self.N
        R, B, n = self.X.shape[0], self.X.shape[1], self.X.shape[2]
        z = (root * (self.X @ np.swapaxes(g, -1, -2))).sum(1)            # (R, n, b)
        lam, nu = z[:, :p], z[:, p:]
        sig = self.act.sigma(lam)                                         # (R, p, b)
        y = np.einsum("m,rmb->rb", self.b_out, self.sig_t.sigma(nu))
        if xi is not None:
            y = y + xi
        delta = self.cw * np.einsum("rk,rkb->rb", self.a, sig) - y        # the error signal
        delta = delta * self.alive[:, None]
        G = self.a[:, :, None] * delta[:, None, :] * self.act.dsigma(lam)  # (R, p, b)
        step_in = coef * root * (G[:, None] @ g)                           # (R, B, p, n)
        step_out = coef * root * (G[:, None] @ L)                          # (R, B, p, b)
        new = np.zeros((R, B, n, n + b))
        new[..., :p, :n] = shrink * self.X[..., :p, :] - step_in
        new[..., p:, :n] = self.X[..., p:, :]
        new[..., :p, n:] = -step_out
        r = np.linalg.qr(np.swapaxes(new, -1, -2), mode="r")                # (R, B, n, n)
        self.X = np.swapaxes(r, -1, -2)
        if self.sphere:
            norm = np.sqrt((self.X[:, :, :p] ** 2).sum(axis=(1, 3)))
            self.X[:, :, :p] /= np.where(norm > 0, norm, 1.0)[:, None, :, None]
        if self.trained:
            self.a = self.a - (self.lr_readout / self.N) * (delta[:, None, :] * sig).mean(-1)
        self.step += 1

    def readout(self):
        return self.a.copy()

    def gram(self):
        return _block_gram(self.X, self.p)

    def freeze(self, mask):
        self.alive[mask] = 0.0

    def pop_caught(self):
        """No in-kernel checks: divergence is checked at the driver's checkpoints."""
        none = np.zeros(self.R, dtype=bool)
        return none, None, None, None, None, None


def _sgd_kernels_module():
    # lazy: numba
    from . import _sgd_kernels
    return _sgd_kernels


#: The fields of the model specification the full simulator implements (docs/model.md
#: §2): its entry of :data:`symquad.stages.STAGES`, where each simulator (full, reduced,
#: SDE) declares its own; a field added to the specification is refused by name there.
SIMULATED_FIELDS = STAGES["simulate(method='full')"]


def _reduced_chunk(replicas, k):
    """Steps drawn per chunk by the reduced simulator (benchmarks draw the same shapes)."""
    return max(1, _CHUNK_VALUES // (replicas * max(k, 1)))


#: Replica count from which the reduced kernel advances replicas in SIMD lanes
#: (groups of ``_sgd_kernels.LANES``); below it a group would be mostly empty.
_LANES_MIN_REPLICAS = 4


def _reduced_kernel(replicas):
    """The compiled kernel for `replicas` replicas (both give bit-identical numbers)."""
    # lazy: numba
    from . import _sgd_kernels as kern
    return kern.reduced_steps if replicas < _LANES_MIN_REPLICAS else kern.reduced_steps_lanes


def _kernel_cache_paths(dispatchers):
    """Index files of numba's on-disk cache of `dispatchers` (None where numba hides them)."""
    paths = []
    for d in dispatchers:
        try:
            paths.append(d._cache._cache_file._index_path)     # numba internals: may move
        except AttributeError:
            paths.append(None)
    return paths


def warm_kernels() -> bool:
    """Load the reduced simulator's compiled kernels into this process, compiling them once.

    A fresh process pays its first reduced simulation's kernels: loaded from
    numba's on-disk cache (about 1.5 s), or compiled when the cache is empty
    or stale (about a minute on the loaded 2-core machine).  A sweep's worker
    processes call this before their first point, so a point's ``seconds``
    is its own work.  Processes that warm at the same time while the cache is
    missing take turns under a file lock (next to numba's cache, POSIX
    ``flock``): the first compiles and writes the cache and the others load
    it, instead of each compiling the same code at once.  One tiny run per
    kernel (fewer than :data:`_LANES_MIN_REPLICAS` replicas, and more) makes
    the calls with the argument types of every reduced simulation of the
    polynomial activations, so nothing else is compiled later.  The runs
    touch no global random state.

    Returns
    -------
    bool
        True if the cache was complete before the call (nothing compiled).
    """
    # lazy: numba
    from . import _sgd_kernels as kern

    dispatchers = (kern.reduced_steps, kern.reduced_steps_lanes)
    paths = _kernel_cache_paths(dispatchers)
    cached = all(p is not None and os.path.exists(p) for p in paths)

    def run():
        for replicas in (1, _LANES_MIN_REPLICAS):
            simulate(Model(2, 1, 0.1), N=64, t_max=4 / 64, replicas=replicas, seed=0,
                     t_eval=np.array([0.0, 4 / 64]))

    if cached:
        run()
        return True
    with _compile_lock(paths[0]):
        run()
    return False


@contextlib.contextmanager
def _compile_lock(index_path):
    """An exclusive file lock shared by the processes compiling into one numba cache."""
    import zlib

    try:
        import fcntl
    except ImportError:            # not POSIX: no lock, each process compiles for itself
        yield
        return
    folder = os.path.dirname(index_path) if index_path else tempfile.gettempdir()
    name = "symquad-kernels.lock"
    fh = None
    for where in (folder, tempfile.gettempdir()):
        try:
            os.makedirs(where, exist_ok=True)
            lock = name if where == folder else \
                f"symquad-kernels-{zlib.crc32(folder.encode()):08x}.lock"
            fh = open(os.path.join(where, lock), "a")
            break
        except OSError:            # a read-only installation: the lock goes to the temp dir
            continue
    if fh is None:
        yield
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        fh.close()                 # closing releases the lock


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------
#: Limits checked before any work: bytes of the recorded trajectories or of
#: the full simulator's weights, and replica-steps of one call (at the
#: ~1e6 replica-steps/s of the compiled reduced simulator, 1e13 is months).
MAX_BYTES = 8 * 2**30
MAX_REPLICA_STEPS = 10**13
#: Full simulator: multiply-adds of one call, ``replicas · steps · N · (p + p*)``
#: (about 1e9 per second in its compiled update, so 1e13 is hours).
MAX_FULL_WORK = 10**13
#: Largest input dimension: N enters the step as a float and as the
#: chi-square's degrees of freedom, exact in float64 up to 2**53.
MAX_N = 2**53


#: simulate warns above this estimated run time (seconds) and refuses above
#: MAX_ESTIMATED_SECONDS; the estimate (estimate_seconds) is a lower bound.
WARN_SECONDS = 600.0
MAX_ESTIMATED_SECONDS = 86_400.0


def estimate_seconds(method, N, replicas, n_steps, p, ps) -> float:
    """A lower bound on the run time of one simulation, in seconds.

    From the fastest rates measured on one core of the development machine
    (README, Benchmarks): the compiled reduced simulator costs at least
    ``max(1e-7, 3e-9 p (p + p*))`` s per replica-step (measured 2.9e-7 s at
    ``p = 4``, 3.2e-6 s at ``p = 16``, 2.7e-5 s at ``p = 64, p* = 8``); the full
    simulator at least one multiply-add per ``5e-10`` s of its
    ``replicas · steps · N · (p + p*)``.  Machines and loads differ, so a run
    takes this long *or longer*.
    """
    if method == "full":
        return replicas * n_steps * N * (p + ps) * 5e-10
    return replicas * n_steps * max(1e-7, 3e-9 * p * (p + ps))


#: Lower bounds of the cost of one step of the order-parameter SDE (``method="sde"``):
#: a fixed part (the Python loop, two drift and one diffusion evaluation, a
#: batch Cholesky) and a part per replica.  Measured on the development
#: machine (one core, load ~2): 3.8e-3 s per step at 1 replica and 7.0e-3 s at
#: 64 (p = 2, p* = 1), 4.9e-3 s and 8.3e-3 s (p = 4, p* = 2); the bounds are
#: 4-5 times lower, so a faster machine or kernel still does not beat them.
SDE_STEP_SECONDS = 1e-3
SDE_REPLICA_STEP_SECONDS = 1.2e-5


def estimate_sde_seconds(replicas, t_max, dt) -> float:
    """A lower bound on the run time of ``simulate(method="sde")``, in seconds.

    The SDE makes at least ``ceil(t_max / dt)`` steps (its step is ``dt`` or
    smaller, :mod:`symquad.numeric.sde`), each costing at least
    ``SDE_STEP_SECONDS + replicas · SDE_REPLICA_STEP_SECONDS``.
    """
    steps = math.ceil(t_max / dt)
    return steps * (SDE_STEP_SECONDS + replicas * SDE_REPLICA_STEP_SECONDS)


def _check_sde_time(replicas, t_max, dt) -> float:
    """Refuse, before any work, an SDE run estimated beyond MAX_ESTIMATED_SECONDS."""
    seconds = estimate_sde_seconds(replicas, t_max, dt)
    if seconds > MAX_ESTIMATED_SECONDS:
        raise ValueError(
            f"this SDE run ({replicas} replicas, t_max={t_max:.4g}, at least "
            f"{math.ceil(t_max / dt):.3g} steps of dt <= {dt:.3g}) is estimated to take at "
            f"least {_duration(seconds)} (limit {_duration(MAX_ESTIMATED_SECONDS)}, "
            f"symquad.numeric.simulate.MAX_ESTIMATED_SECONDS): reduce t_max or replicas, or "
            f"raise dt")
    return seconds


def _duration(seconds) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def plan_simulation(model, N, t_max, replicas, method="reduced", n_times=101) -> float:
    """Check a run's sizes as :func:`simulate` does, without running it; its time estimate.

    Raises the ValueError :func:`simulate` would raise for memory, step
    count or estimated time (see :func:`estimate_seconds`), before anything
    is allocated, so a study of several runs can check all of them first.
    Returns the estimated seconds (a lower bound).
    """

    check_model(model)
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 1)
    t_max = check_positive("t_max", t_max)
    n_times = _check_int(n_times, "n_times", 1)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if N > MAX_N:
        raise ValueError(f"N must be <= 2**53 (allowed range 1..{MAX_N}), got {N}")
    if not t_max * N <= MAX_REPLICA_STEPS:
        raise ValueError(f"t_max * N = {t_max * N:.3g} steps is beyond {MAX_REPLICA_STEPS:.0e}: "
                         f"reduce t_max (allowed t_max <= {MAX_REPLICA_STEPS / N:.3g}) or N")
    if has_spectrum(model):
        check_block_room(model, N)
    n_steps = max(1, int(round(t_max * N)))
    return _check_sizes(method, N, replicas, n_steps, min(n_times, n_steps + 1), model.p,
                        model.p_star)


def _check_sizes(method, N, replicas, n_steps, n_rec, p, ps):
    """Refuse, before any work, a run whose memory, step count or time is out of reach.

    Returns the estimated seconds (:func:`estimate_seconds`).
    """
    if N > MAX_N:
        raise ValueError(f"N must be <= 2**53 (allowed range 1..{MAX_N}), got {N}")
    record_bytes = 8 * replicas * n_rec * (p * p + p * ps)
    if record_bytes > MAX_BYTES:
        raise ValueError(
            f"replicas={replicas} with {n_rec} recorded times needs "
            f"{record_bytes / 2**30:.3g} GiB for the trajectories (limit "
            f"{MAX_BYTES / 2**30:g} GiB): use fewer replicas or a shorter t_eval")
    if method == "full":
        weight_bytes = 8 * replicas * N * (p + ps)
        if weight_bytes > MAX_BYTES:
            raise ValueError(
                f"method='full' with N={N} and replicas={replicas} needs "
                f"{weight_bytes / 2**30:.3g} GiB of weights (limit {MAX_BYTES / 2**30:g} GiB): "
                f"use method='reduced' (same law, cost independent of N)")
    if method == "full" and replicas * n_steps * N * (p + ps) > MAX_FULL_WORK:
        work = replicas * n_steps * N * (p + ps)
        raise ValueError(
            f"method='full' with N={N}, {replicas} replicas and {n_steps} steps is "
            f"{work:.2g} multiply-adds (hours or more; limit {MAX_FULL_WORK:.0e}): use "
            f"method='reduced' (same law, cost independent of N) or reduce N, t_max or replicas")
    if replicas * n_steps > MAX_REPLICA_STEPS:
        raise ValueError(
            f"replicas * t_max * N = {replicas * n_steps:.3g} replica-steps is beyond "
            f"{MAX_REPLICA_STEPS:.0e} (months at ~1e6 replica-steps/s): reduce t_max, N "
            f"or replicas")
    seconds = estimate_seconds(method, N, replicas, n_steps, p, ps)
    if seconds > MAX_ESTIMATED_SECONDS:
        raise ValueError(
            f"this simulation ({replicas} replicas x {n_steps:.3g} steps, N={N}, p={p}, "
            f"p*={ps}, method={method!r}) is estimated to take at least {_duration(seconds)} "
            f"(limit {_duration(MAX_ESTIMATED_SECONDS)}, "
            f"symquad.numeric.simulate.MAX_ESTIMATED_SECONDS): reduce t_max, N or replicas, "
            f"or split the replicas over a sweep")
    return seconds


def _record_steps(t_max, N, t_eval):
    if not t_max * N <= MAX_REPLICA_STEPS:
        raise ValueError(f"t_max * N = {t_max * N:.3g} steps is beyond {MAX_REPLICA_STEPS:.0e}: "
                         f"reduce t_max (allowed t_max <= {MAX_REPLICA_STEPS / N:.3g}) or N")
    n_steps = int(round(t_max * N))
    if n_steps < 1:
        raise ValueError(f"t_max * N must be >= 1 step, got t_max={t_max}, N={N}")
    if t_eval is None:
        n = min(101, n_steps + 1)
        steps = np.unique(np.round(np.linspace(0, n_steps, n)).astype(np.int64))
    else:
        t_eval = as_real_array(t_eval, "t_eval")
        if t_eval.ndim != 1 or t_eval.size == 0 or not np.all(np.isfinite(t_eval)):
            raise ValueError("t_eval must be a non-empty 1-d array of finite times")
        if np.any(t_eval < 0) or np.any(t_eval > t_max * (1 + 1e-12)):
            raise ValueError(f"t_eval must lie in [0, t_max] = [0, {t_max}]")
        if np.any(np.diff(t_eval) <= 0):
            raise ValueError("t_eval must be strictly increasing")
        steps = np.minimum(np.round(t_eval * N).astype(np.int64), n_steps)
        same = np.nonzero(np.diff(steps) == 0)[0]
        if same.size:
            # merged, so the run has fewer times than asked for: never silently
            i = int(same[0])
            warnings.warn(
                f"t_eval: {same.size} of the {t_eval.size} requested times round to the same "
                f"SGD step as the time before them and are merged (e.g. t = {t_eval[i]:.9g} "
                f"and {t_eval[i + 1]:.9g} are both step {int(steps[i])} at N={N}): the run "
                f"records {t_eval.size - same.size} times. Times are whole steps t = k/N; give "
                f"times at least 1/N = {1 / N:.3g} apart", RuntimeWarning, stacklevel=3)
            steps = np.unique(steps)
    return n_steps, steps


def _sde_record_times(t_max, t_eval):
    """Recorded times of an SDE run too long to count in SGD steps."""
    if t_eval is None:
        return np.linspace(0.0, t_max, 101)
    t_eval = as_real_array(t_eval, "t_eval")
    if (t_eval.ndim != 1 or t_eval.size == 0 or np.any(t_eval < 0)
            or np.any(t_eval > t_max * (1 + 1e-12)) or np.any(np.diff(t_eval) <= 0)):
        raise ValueError(f"t_eval must be a strictly increasing 1-d array in [0, t_max] = "
                         f"[0, {t_max}]")
    return t_eval


def simulate(model, N=2000, t_max=20.0, replicas=64, seed=0, method="reduced",
             Q0=None, rho0=None, T=None, t_eval=None, on_divergence="raise",
             blowup=1e8, progress=False, _residual=True, dt=None, form=None, noise=None,
             finite_n=False):
    """Monte Carlo simulation of one-pass SGD for `model`.

    Parameters
    ----------
    model : symquad.spec.Model
        Widths, activation ``σ``, step size ``η = model.eta``, label-noise
        variance ``Δ = model.noise``.
    N : int
        Input dimension, ``N >= 1``.
    t_max : float
        Final time ``steps/N > 0``; ``round(t_max · N)`` steps are made.
    replicas : int
        Number of independent SGD runs, ``>= 1``.
    seed : int or None
        Seed of :class:`numpy.random.SeedSequence` (teacher, initialisation,
        inputs and label noise get independent child streams).  Same seed,
        same numbers.
    method : {"reduced", "full", "sde"}
        ``"reduced"`` (exact in law, cost per step independent of ``N``),
        ``"full"`` (explicit ``N``-dimensional weights), or ``"sde"``: the
        order-parameter SDE ``dX = f dt + √(D/N) dB`` (leading order in ``1/N``;
        cost independent of ``N`` *and* of the number of SGD steps, so ``N = 10⁹``
        costs what ``10³`` does; :mod:`symquad.numeric.sde`).  See the module
        docstring.
    Q0, rho0 : array_like, optional
        Initial overlaps, shape ``(p, p)`` / ``(p, p*)`` or with a leading
        ``replicas`` axis; both or neither.  Default: random
        ``w_k ~ N(0, q0 I_N)``, ``q0 = 1``.
    T : array_like, optional
        Teacher overlaps ``(p*, p*)``, symmetric PSD; default ``I`` exactly
        (teacher rows orthonormalised and scaled by ``√N``).
    t_eval : array_like, optional
        Times to record (rounded to whole steps; times that round to the
        same step are merged with a ``RuntimeWarning`` saying how many, so
        ``run.t`` can be shorter than `t_eval`); default 101 equally spaced
        times in ``[0, t_max]``.
    on_divergence : {"raise", "stop"}
        Divergence (an overlap beyond `blowup` or non-finite, checked every
        ``check_every`` steps) raises :class:`~symquad.numeric.errors.DivergenceError`
        (with the run as ``partial``) or, with ``"stop"``, freezes the
        replica, marks it ``"diverged"`` and records NaN after the blow-up.
    blowup : float
        Overlap magnitude treated as a blow-up.
    progress : bool
        Progress on stderr (:mod:`symquad.progress`): a tqdm bar on a terminal,
        plain lines (every 10 % or 10 s, with the time left) otherwise.
    dt : float, optional
        ``method="sde"`` only: the largest time step (default
        :data:`symquad.numeric.sde.DEFAULT_DT`; the step is also limited by the
        drift, see :mod:`symquad.numeric.sde`).
    form : {"matrix", "tensor", "entries"}, optional
        ``method="sde"`` only: the kernels of ``f`` and ``D`` (default
        :func:`symquad.numeric.sde.sde_form`).
    noise : {"gaussian", "sampled"}, optional
        ``method="sde"`` only: the noise of a step ``h``, both of mean zero and
        covariance ``h D/N``.  ``"gaussian"``: ``√(h/N) L ξ``, ``L Lᵀ = D`` (needs the
        diffusion matrix, one per replica and step, and its ``dim³`` factor);
        ``"sampled"``: ``s √(hM/(Nb)) (φ̄_M − f)``, the mean per-sample increment of
        ``M`` fresh draws of the fields and the label noise and a random sign ``s``
        (a weak scheme of the same SDE; needs the drift only,
        :mod:`symquad.numeric.sde_noise`).  Default by cost
        (:func:`symquad.numeric.sde_noise.default_noise`): Gaussian for quadratic
        activations up to 60 state entries and for the entry route (polynomials,
        ``p + p* <= 4``), sampled for every other model (the tensor route's, erf's
        and the ReLU/mixed pairs' ``D`` cost 100-10⁵ drift calls).

    finite_n : bool
        ``method="sde"`` only: add the O(1/N) part of SGD's mean drift,
        ``(f₁ − ½(J f + ∂f/∂t))/N`` (and a step schedule's shift at each jump), so the
        SDE's mean is SGD's to O(1/N), not only the ODE's (docs/derivation.md §8.3a;
        unconstrained models; the verdict's whole-run law uses it).

    Returns
    -------
    SimulationRun
    """

    check_model(model)
    check_float_activation(model.activation)
    check_float_activation(model.teacher_activation, "teacher_activation")
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 1)
    t_max = check_positive("t_max", t_max)
    blowup = check_positive("blowup", blowup)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    declare(model, f"simulate(method={method!r})")
    if on_divergence not in ("raise", "stop"):
        raise ValueError(f"on_divergence must be 'raise' or 'stop', got {on_divergence!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise TypeError(f"seed must be an integer >= 0 or None, got {type(seed).__name__} "
                        f"{seed!r}")
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}")
    if N > MAX_N:
        raise ValueError(f"N must be <= 2**53 (allowed range 1..{MAX_N}), got {N}")
    if method != "sde" and (dt is not None or form is not None or noise is not None):
        raise ValueError("dt, form and noise apply to method='sde' only")
    if finite_n not in (True, False):
        raise ValueError(f"finite_n must be True or False, got {finite_n!r}")
    if finite_n and method != "sde":
        raise ValueError("finite_n (the SDE's O(1/N) drift) applies to method='sde' only: "
                         "the other methods are SGD itself")
    if finite_n:
        declare(model, "the O(1/N) correction of the mean",
                "finite_n=True adds the O(1/N) drift, derived for the fields that stage lists")
    if finite_n and model.constraint == "sphere":
        raise ValueError("finite_n (the SDE's O(1/N) drift) is derived for constraint='none': "
                         "on the sphere f1 holds the renormalisation's second order, which "
                         "the SDE's own projection of each step changes")
    if method == "sde":
        form, noise = sde_noise(model, form, noise)       # refusals before any work
    if dt is not None:
        dt = check_positive("dt", dt)        # a string or a bool is a TypeError, not 0.2/1.0
    if method == "sde" and t_max * N > MAX_REPLICA_STEPS:
        # no SGD steps are made: record at the requested times themselves
        rec_steps = _sde_record_times(t_max, t_eval) * N
        n_steps = 0
    else:
        n_steps, rec_steps = _record_steps(t_max, N, t_eval)
    seconds = _check_sizes(method, N, replicas, n_steps if method != "sde" else 0,
                           len(rec_steps), model.p, model.p_star)
    if method == "sde":
        seconds = _check_sde_time(replicas, t_max, DEFAULT_DT if dt is None else dt)
        if seconds > WARN_SECONDS:
            warnings.warn(f"simulate: the SDE with {replicas} replicas up to t_max={t_max:.4g} "
                          f"is estimated to take at least {_duration(seconds)}",
                          RuntimeWarning, stacklevel=2)
    elif seconds > WARN_SECONDS:
        warnings.warn(f"simulate: {replicas} replicas x {n_steps:.3g} steps (N={N}, p="
                      f"{model.p}) are estimated to take at least {_duration(seconds)}",
                      RuntimeWarning, stacklevel=2)

    ss = np.random.SeedSequence(seed)
    # five independent streams; the first four are the same as spawn(4)'s
    rng_teacher, rng_init, rng_data, rng_noise, rng_chi = (
        np.random.default_rng(s) for s in ss.spawn(5))
    blocks = has_spectrum(model)
    if blocks:
        X0, T = _block_initial_coordinates(model, N, replicas, Q0, rho0, T, rng_init)
    else:
        X0, T = _initial_coordinates(model, N, replicas, Q0, rho0, T, rng_init)
    p, ps = model.p, model.p_star
    lead = block_axis(model)
    if method == "sde":
        return simulate_sde(model, N, t_max, replicas, seed, X0, T, rec_steps, on_divergence,
                            blowup, dt=dt, form=form, progress=progress, noise=noise,
                            finite_n=finite_n)
    if blocks and method == "full":
        stepper = _BlockFullStepper(model, N, replicas, X0, rng_teacher, rng_init, rng_data,
                                    rng_noise, random_student=Q0 is None)
        check_every = _FULL_CHECK_EVERY
    elif blocks:
        stepper = _BlockReducedStepper(model, N, replicas, X0, rng_data, rng_noise, rng_chi)
        check_every = _REDUCED_CHECK_EVERY
    elif method == "full":
        stepper = _FullStepper(model, N, replicas, X0, rng_teacher, rng_init, rng_data,
                               rng_noise, random_student=Q0 is None)
        check_every = _FULL_CHECK_EVERY
    else:
        check_every = _REDUCED_CHECK_EVERY
        stepper = _ReducedStepper(model, N, replicas, X0, rng_data, rng_noise, rng_chi,
                                  residual=_residual, check_every=check_every,
                                  blowup=blowup)

    n_rec = len(rec_steps)
    Qs = np.full((replicas, n_rec) + lead + (p, p), np.nan)
    rhos = np.full((replicas, n_rec) + lead + (p, ps), np.nan)
    trained = model.readout_trained
    readouts = np.full((replicas, n_rec, p), np.nan) if trained else None
    status = np.array(["ok"] * replicas, dtype=object)
    t_div = np.full(replicas, np.nan)
    last = {"t": np.zeros(replicas), "Q": np.zeros((replicas,) + lead + (p, p)),
            "rho": np.zeros((replicas,) + lead + (p, ps))}
    if trained:
        last["readout"] = np.zeros((replicas, p))
    alive = np.ones(replicas, dtype=bool)

    checkpoints = np.union1d(rec_steps, [n_steps])
    if method == "full" or blocks:
        # the reduced stepper checks every check_every steps inside its kernel
        checkpoints = np.union1d(checkpoints, np.arange(0, n_steps + 1, check_every))
    rec_index = {int(s): i for i, s in enumerate(rec_steps)}
    bar = _progress(progress, n_steps, f"SGD ({method}, N={N}, {replicas} replicas)", "steps")
    step = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for target in checkpoints:
            target = int(target)
            if target > step:
                stepper.advance(target - step)
                bar.update(target - step)
                step = target
            if method == "reduced":
                caught, c_step, l_step, l_Q, l_rho, l_a = stepper.pop_caught()
                caught &= alive
                if caught.any():
                    status[caught] = "diverged"
                    t_div[caught] = c_step[caught] / N
                    alive &= ~caught
                    # the last passed check: in the kernel or here, whichever is later
                    newer = caught & (l_step / N > last["t"])
                    last["t"][newer] = l_step[newer] / N
                    last["Q"][newer] = l_Q[newer]
                    last["rho"][newer] = l_rho[newer]
                    if trained:
                        last["readout"][newer] = l_a[newer]
            Q, rho = stepper.gram()
            a_now = stepper.readout() if trained else None
            Qf, rf = Q.reshape(replicas, -1), rho.reshape(replicas, -1)
            finite = (np.all(np.isfinite(Qf), axis=1) & np.all(np.isfinite(rf), axis=1)
                      & (np.max(np.abs(Qf), axis=1) < blowup))
            if trained:
                finite &= np.all(np.isfinite(a_now), axis=1) & (
                    np.max(np.abs(a_now), axis=1) < blowup)
            bad = alive & ~finite
            if bad.any():
                status[bad] = "diverged"
                t_div[bad] = step / N
                alive &= ~bad
                stepper.freeze(bad)
            last["t"][alive] = step / N
            last["Q"][alive] = Q[alive]
            last["rho"][alive] = rho[alive]
            if trained:
                last["readout"][alive] = a_now[alive]
            if target in rec_index:
                i = rec_index[target]
                Qs[alive, i] = Q[alive]
                rhos[alive, i] = rho[alive]
                if trained:
                    readouts[alive, i] = a_now[alive]
            if not alive.any():
                break
    bar.close()
    risk = (block_population_risk if blocks else population_risk)(model, Qs, rhos, T, readouts)
    run = SimulationRun(model=model, N=N, method=method, seed=seed, t=rec_steps / N, Q=Qs,
                        rho=rhos, risk=risk, T=T, status=status.astype(str), t_diverged=t_div,
                        last_finite=last, check_every=check_every, readout=readouts)
    if run.n_diverged and on_divergence == "raise":
        first = int(np.nanargmin(t_div))
        state = {"t": last["t"][first], "Q": last["Q"][first], "rho": last["rho"][first]}
        raise DivergenceError(
            f"SGD diverged in {run.n_diverged}/{replicas} replicas (first detected at "
            f"t = {t_div[first]:.6g}, replica {first}; eta = {model.eta:g}); last finite "
            f"state at t = {last['t'][first]:.6g}: {describe_state(state)}. "
            f"Lower the learning rate, or pass on_divergence='stop' to keep the partial run.",
            t_div[first], state, partial=run)
    return run
