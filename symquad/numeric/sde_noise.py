r"""The noise of the order-parameter SDE: Gaussian with the exact ``D``, or sampled increments.

Over a step ``h`` the SDE ``dX = f dt + √(D/N) dB`` (:mod:`symquad.numeric.sde`)
adds a noise of mean zero and covariance ``h D/N``.  ``D = Cov[φ]/b`` is the
covariance of the per-sample increment ``φ`` of the order parameters
(docs/derivation.md §8.1; ``b`` the batch size, ``φ`` carrying ``η²/b``), so two
noises have that covariance:

* ``"gaussian"``: ``√(h/N) L ξ`` with ``L Lᵀ = D(X)`` (:meth:`Kernels.diffusion`)
  and ``ξ ~ N(0, I)``;
* ``"sampled"``: with ``M`` (:data:`NOISE_SAMPLES`) fresh draws ``z_m`` of the fields
  ``(λ, ν) ~ N(0, C(X))`` and of the label noise, and a random sign ``s = ±1`` per
  replica and step,

  .. math::  ζ = s \sqrt{\frac{h}{N b M}} \sum_{m=1}^{M} \bigl(φ(z_m) − f(X)\bigr)
             = s \sqrt{\frac{h M}{N b}}\, \bigl(\bar φ_M − f(X)\bigr),

  ``E[ζ] = 0`` (the sign; exactly, even where ``f`` is not ``E[φ]``),
  ``E[ζζᵀ] = h·M·Cov[φ]/(N b M) = h D/N`` exactly, every odd moment zero and the
  fourth moments ``O(h²)``: the moment conditions of the simplified weak Euler scheme
  (Kloeden & Platen, *Numerical Solution of Stochastic Differential Equations*, 1992,
  weak Taylor approximations), so it converges weakly (order 1) to the same diffusion
  as the Gaussian-noise SDE.  Derivation, weak error and the role of
  ``M``: docs/derivation.md §8.4.

``φ`` is built from the model's one per-sample definition: the sample means of the
drift's moment kinds' integrands (``σ'(λ_k) u_j δ``, ``σ'(λ_k)σ'(λ_l) δ²``,
``σ(λ_k) δ``: :func:`symquad.runtime.sampled_diffusion.increment_kinds`, with the
activations of the field-space cubature of ``D``) pushed through the generated drift
assembly (:mod:`symquad._generated.assembly`, the update rule of
:mod:`symquad.symbolic.update`), which is linear in the kinds: every field of the model
(batch ``1/b`` on the ``η²`` term, weight decay, the sphere's projection, a trained
readout, the loss's error signal, ``η(t)``) enters exactly as in the drift, and the
deterministic parts (weight decay, the ``Q``-terms of the projection) cancel against
``f``.  With an input spectrum (docs/model.md §1a) the samples are the blocks' independent
fields ``μ^c ~ N(0, s_c C^c)``, ``(λ, ν) = Σ_c μ^c``, through the generated block assembly
(:func:`_block_sampled_increments`).  Cost per replica and step: an ``n × n`` eigendecomposition (``n = p + p*``) and
``M·(p n + p²)`` multiply-adds — no ``D``, no ``dim³`` factorisation.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.sampled_diffusion import (_sqrtm, activation_functions, field_root,
                                         increment_kinds)
from ..runtime.tensor_engine import combine, weights
from ..spec import error_signal_weight
from ..spectrum import has_spectrum
from .kernels import _assembly, _block_assembly, _untimed, check_generated_for
from .layout import state_layout

__all__ = ["NOISES", "NOISE_SAMPLES", "GAUSSIAN_MAX_DIM", "default_noise", "check_noise",
           "sampled_increments", "SampledNoise"]

#: The SDE's noises (:mod:`symquad.numeric.sde_noise`).
NOISES = ("gaussian", "sampled")
#: Field samples ``M`` per replica and step of the sampled noise.  ``M`` does not change the
#: covariance; it divides the excess fourth cumulant of a step (docs/derivation.md §8.4) and
#: costs ``M (p n + p²)`` multiply-adds per replica and step, negligible beside the drift.
NOISE_SAMPLES = 16
#: Largest state (entries) for which the Gaussian noise is the default with the matrix
#: route's ``D`` (``σ = c z²``): ``(8, 2)`` has 52 entries; from ``(16, 2)`` (168 entries)
#: ``D`` and its ``dim³`` Cholesky cost more than 30 drift calls (docs/benchmarks-finite-n.md).
GAUSSIAN_MAX_DIM = 60


def default_noise(model, form: str) -> str:
    """``"gaussian"`` where ``D`` is cheap, ``"sampled"`` where it is not.

    Gaussian with the exact ``D`` for the matrix route (``σ = c z² + c0`` and the same
    for the teacher) up to :data:`GAUSSIAN_MAX_DIM` state entries and for the entry route
    (``form="entries"``, ``p + p* <= 4``): there one ``D`` costs tens of drift calls.
    Sampled for every other model: the tensor route's 8-point sums (100-1000 drift
    calls at p = 8-16), erf's Price path, the field-space cubature of ReLU and mixed pairs
    (2¹⁷ points per state), and wide quadratic models (``dim³`` factorisations).
    """
    if has_spectrum(model):
        return "sampled"            # the diffusion matrix is not derived for blocks
    if form == "entries" and model.is_polynomial:
        return "gaussian"
    if form == "matrix" and state_layout(model).dim <= GAUSSIAN_MAX_DIM:
        return "gaussian"
    return "sampled"


def check_noise(noise) -> str | None:
    """`noise` if it is None or one of :data:`NOISES`, else a ValueError naming it."""
    if noise is not None and (not isinstance(noise, str) or noise not in NOISES):
        raise ValueError(f"noise must be one of {NOISES} (or None: chosen by cost, "
                         f"symquad.numeric.sde_noise.default_noise), got {noise!r}")
    return noise


def sampled_increments(model):
    r"""``φ̄(Q, ρ, T, a, params, z, label_noise)``: the mean per-sample increment of `model`.

    For each replica (leading axis) the mean over its ``M`` draws ``z (R, M, n)`` (and
    ``label_noise (R, M)``, ``√Δ ξ``, or None) of the per-sample increment ``φ`` in the
    state order (:class:`~symquad.numeric.layout.StateLayout`), at the kernel
    parameters `params` (``Kernels.params_at(t)``).  ``E[φ̄] = f`` and
    ``Cov[φ̄] = b D/M`` (module docstring).
    """
    # η(t) enters through `params` (Kernels.params_at), as in the drift: the generated
    # assembly is the constant-η model's
    check_generated_for(_untimed(model, "simulate(method='sde')"),
                        "the sampled noise of the SDE")
    if has_spectrum(model):
        return _block_sampled_increments(model)
    drift = getattr(_assembly(), f"drift_{model.constraint}")
    lay = state_layout(model)
    b = np.array([float(c) for c in model.teacher_readout])
    fixed = np.array([float(c) for c in model.readout])
    c = float(error_signal_weight(model))
    trained = model.readout_trained

    def phi_bar(Q, rho, T, a, params, z, label_noise):
        a = fixed if a is None else a
        root, p = field_root(Q, rho, T)
        G, Gt, B, R = increment_kinds(root, p, c * np.asarray(a, float), b, z, label_noise,
                                      model.activation, model.teacher_activation)
        out = drift(Q, rho, np.broadcast_to(a, Q.shape[:-1]), G, Gt, B,
                    R if trained else None, params)
        return lay.pack(*(out if trained else out[:2]))
    return phi_bar


def _block_sampled_increments(model):
    r"""``φ̄`` of a model with an input spectrum (docs/model.md §1a): per-block increments.

    One SGD sample's increment of ``(Q^c, ρ^c, a)`` is the block drift's assembly
    (:mod:`symquad._generated.block_assembly`, linear in the kinds) applied to the
    integrands ``Gb(c; k, l) = σ'(λ_k) μ^c_l δ``, ``Gtb(c; k, m) = σ'(λ_k) μ*^c_m δ``,
    ``B = σ'(λ_k) σ'(λ_l) δ²``, ``R = σ(λ_k) δ`` of that sample.  The block fields
    ``μ^c = (w_k P_c x, w*_m P_c x)/√N`` of the ``B`` blocks are independent,
    ``μ^c ~ N(0, s_c C^c)`` (``P_c x`` are orthogonal parts of ``x``, ``P_c Σ P_c =
    s_c P_c``), and the fields are their sum, ``(λ, ν) = Σ_c μ^c`` (``x = Σ_c P_c x``): the
    draws ``z`` are ``(R, M, B n)`` standard normals, ``μ^c = √s_c z_c (C^c)^{1/2}``.  The
    ``η²`` term carries ``xᵀP_c x/N`` at its limit ``f_c s_c`` (its fluctuation,
    ``O(N^{-1/2})``, enters the increment's covariance at ``O(1/N)`` relative).
    """
    drift = getattr(_block_assembly(), f"drift_blocks_{model.constraint}")
    lay = state_layout(model)
    b = np.array([float(c) for c in model.teacher_readout])
    fixed = np.array([float(c) for c in model.readout])
    c = float(error_signal_weight(model))
    trained = model.readout_trained
    s = np.sqrt([float(x) for _, x in model.spectrum])
    fs = np.array([float(f * x) for f, x in model.spectrum])
    tr_sigma = float(sum(f * x for f, x in model.spectrum))
    p, n, B = model.p, model.p + model.p_star, model.n_blocks
    s_f, s_d = activation_functions(model.activation)
    t_f, _ = activation_functions(model.teacher_activation)

    def phi_bar(Q, rho, T, a, params, z, label_noise):
        a = fixed if a is None else a
        C, _ = combine(Q, rho, T)                            # (R, B, n, n)
        M = z.shape[-2]
        zb = np.swapaxes(z.reshape(z.shape[:-1] + (B, n)), -2, -3)      # (R, B, M, n)
        mu = s[:, None, None] * (zb @ _sqrtm(C))             # μ^c, (R, B, M, n)
        u = mu.sum(-3)                                       # (λ, ν), (R, M, n)
        w = weights(c * np.asarray(a, float), b)             # (R, n)
        delta = s_f(u[..., :p]) @ w[..., :p, None] + t_f(u[..., p:]) @ w[..., p:, None]
        if label_noise is not None:
            delta = delta - label_noise[..., None]
        g = s_d(u[..., :p])
        gd = np.swapaxes(g * delta, -1, -2)                  # (R, p, M)
        GL = (gd[..., None, :, :] @ mu) / M                  # (R, B, p, n)
        Bk = ((gd * np.swapaxes(delta, -1, -2)) @ g) / M
        Rk = (np.swapaxes(s_f(u[..., :p]), -1, -2) @ delta)[..., 0] / M
        Gb, Gtb = GL[..., :p], GL[..., p:]
        out = drift(Q, rho, Q.sum(-3), np.broadcast_to(a, Q.shape[:1] + (p,)), Gb, Gtb,
                    Gb.sum(-3), Bk, Rk if trained else None, fs, tr_sigma, params)
        return lay.pack(*(out if trained else out[:2]))
    return phi_bar


class SampledNoise:
    """The sampled noise of one SDE run: ``ζ = s √(h M/(N b)) (φ̄_M − f)`` per live replica.

    Random numbers come from the run's data stream in a fixed order per step: the
    fields ``z (R, M, n)`` of every replica (alive or not, so a divergence does not shift
    the others' numbers), then the label noise ``(R, M)`` when ``Δ > 0``, then the signs
    ``(R,)``: the same seed gives the same numbers.
    """

    def __init__(self, model, N, replicas, rng, samples=None):
        self.phi_bar = sampled_increments(model)
        self.M = int(NOISE_SAMPLES if samples is None else samples)
        # with an input spectrum: the B independent block fields (_block_sampled_increments)
        self.n = (model.p + model.p_star) * (model.n_blocks if has_spectrum(model) else 1)
        self.R = int(replicas)
        self.rng = rng
        self.sqrt_delta = math.sqrt(float(model.noise))
        self.scale_N = 1.0 / (N * int(model.batch_size))

    def __call__(self, live, Q, rho, T, a, f, h, params):
        """The noise increments ``(len(live), dim)`` of the live replicas over a step `h`."""
        z = self.rng.standard_normal((self.R, self.M, self.n))[live]
        xi = (self.sqrt_delta * self.rng.standard_normal((self.R, self.M))[live]
              if self.sqrt_delta > 0 else None)
        sign = np.where(self.rng.random(self.R)[live] < 0.5, -1.0, 1.0)
        dev = self.phi_bar(Q, rho, T, a, params, z, xi) - f
        return (math.sqrt(h * self.M * self.scale_N) * sign)[:, None] * dev
