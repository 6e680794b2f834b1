r"""The diffusion matrix's moment kinds for ReLU and mixed activation pairs, by field-space cubature.

The generated diffusion assembly (:mod:`symquad._generated.diffusion_assembly`)
builds ``D`` from nine moment kinds
``M_{dxs}(i..; j..; k..) = E[∏_d σ'(u_i) ∏_x u_j ∏_s σ(u_k) δ^{d+s}]``
(``δ = Σ_a w_a σ_a(u_a) − √Δ ξ``, ``u ~ N(0, C)``, ``C = [[Q, ρ], [ρᵀ, T]]``,
docs/derivation.md §8.7).  For ``σ = σ* = erf(z/√2)`` they have closed forms
(:mod:`symquad.runtime.special_diffusion`).  For a ReLU student or teacher, and
for mixed pairs (erf or ReLU with a polynomial, erf with ReLU), ``M400`` is an
eight-point Gaussian moment with up to eight distinct fields inside step
functions (ReLU) or mixed erf/polynomial factors: it has no closed form, and a
Price path (the erf route) leaves Dirac factors of ReLU's ``σ''`` that do not fold.
This module evaluates every kind of such a pair by one cubature rule in the
``n = p + p*`` dimensional field space:

1. **Label noise** integrated out exactly: ``δ² → δ_c² + Δ``,
   ``δ³ → δ_c³ + 3Δδ_c``, ``δ⁴ → δ_c⁴ + 6Δδ_c² + 3Δ²`` (``δ_c`` the noiseless error).
2. **Fields** ``u = C^{1/2} z`` with the symmetric square root (continuous in ``C``,
   valid for singular ``C``); ``z = √WIDEN · g``, ``g`` the inverse-normal images of a
   scrambled Sobol' rule (:data:`SAMPLES` = 2¹⁷ points, fixed seed :data:`SEED`), with
   self-normalised importance weights of ``N(0, I)`` against ``N(0, WIDEN·I)``
   (the polynomial factors' tails): ``D`` is a deterministic, continuous function of
   the state.
3. **One point set for all kinds**, the mean kinds ``M110, M200, M001`` included:
   the assembly's ``E[φφᵀ] − E[φ]E[φ]ᵀ`` is then the covariance of the
   increments under the rule's weighted empirical measure, positive semi-definite
   up to rounding.

Stated accuracy (tests/test_sampled_diffusion.py, docs/derivation.md §8.7):
``max |D_rule − D| ≤ 2e-3 · max |D|`` for erf/ReLU pairs and ``1e-2`` with a
polynomial of degree ≤ 2, at ``p ≤ 8`` and field variances ≤ 2 (measured on pairs with
closed forms: erf/erf 8.5e-4 at p = 4, 1.3e-3 at p = 8; z²/z² 3.8e-3 at p = 4, 2.6e-3
at p = 8).  Degree ≥ 3 is refused (z³ − 3z: 5 %).  The drift kinds match the drift's
closed forms to 2e-3 for every pair kind.

Cost law (:func:`sampled_diffusion_cost`): multiply–adds per state
``S · (p²n² + p⁴ + p³n + p²n [+ p³ + 2p² with a trained readout])``, the
``M220`` and ``M400`` products dominating: ``≈ 1.3·10⁹`` at ``p = 8, p* = 2``.
"""

from __future__ import annotations

import functools
import math

import numpy

from .diffusion_engine import KindArrays
from .tensor_engine import combine, weights
from .special_diffusion import _tuples
from .special_diffusion import _scatter_symmetric

__all__ = ["sampled_diffusion_kinds", "sampled_diffusion_cost", "SAMPLES", "SEED",
           "activation_functions", "increment_kinds", "field_root"]

#: Points of the field-space rule (a power of two: the Sobol' rule's balance).
SAMPLES = 1 << 17
#: Variance of the rule's proposal (importance sampling of ``N(0, I)``): measured best
#: of 1, 1.3, 1.6, 2, 2.5 for z², z³ − 3z and erf pairs at p = 4 and 8.
WIDEN = 2.0
#: Seed of the rule's scrambling (fixed: D is a deterministic function of the state).
SEED = 20261202
#: Points per block of the accumulation (bounded memory: ~p²n² · CHUNK doubles).
CHUNK = 16384


@functools.lru_cache(maxsize=8)
def _points(n, samples, seed):
    """Points (S, n) and weights (S,) of the field-space rule in ``n`` dimensions (cached).

    ``z = √WIDEN · g``, ``g`` the inverse-normal images of a scrambled Sobol' rule,
    with the self-normalised importance weights ``∝ exp(−|g|²(WIDEN − 1)/2)`` of
    ``N(0, I)`` against the wider ``N(0, WIDEN·I)``: the polynomial factors'
    tails (degree up to ~20 in ``M400``) are reached, and the weights sum to one.
    """
    from scipy.special import ndtri
    from scipy.stats import qmc
    m = int(round(math.log2(samples)))
    if 2 ** m != samples:
        raise ValueError(f"samples must be a power of two, got {samples}")
    x = qmc.Sobol(d=n, scramble=True, seed=seed).random_base2(m)
    g = ndtri(numpy.clip(x, 1e-16, 1.0 - 1e-16))
    z = math.sqrt(WIDEN) * g
    logw = -0.5 * numpy.sum(g * g, axis=1) * (WIDEN - 1.0)
    w = numpy.exp(logw - logw.max())
    w /= w.sum()
    z.flags.writeable = False
    w.flags.writeable = False
    return z, w


def activation_functions(act):
    """``(σ, σ')`` of a name (``"erf"``: erf(z/√2), ``"relu"``) or a coefficient tuple."""
    if isinstance(act, str):
        if act == "erf":
            from scipy.special import erf
            c = math.sqrt(2.0 / math.pi)
            return (lambda z: erf(z / math.sqrt(2.0)), lambda z: c * numpy.exp(-0.5 * z * z))
        if act == "relu":
            return (lambda z: numpy.maximum(z, 0.0), lambda z: (z > 0.0).astype(float))
        raise ValueError(f"activation must be 'erf', 'relu' or a polynomial, got {act!r}")
    coeffs = [float(c) for c in act]
    poly = numpy.polynomial.Polynomial(coeffs)
    return poly, poly.deriv()


def sampled_diffusion_cost(p: int, p_star: int, trained: bool, samples: int = SAMPLES) -> float:
    """Multiply–adds of one ``D`` (one state) by the field-space rule (see the module docstring)."""
    n = p + p_star
    per = p * p * n * n + p ** 4 + p ** 3 * n + p * p * n
    if trained:
        per += p ** 3 + 2 * p * p
    return float(samples) * per


def _sqrtm(C):
    """Symmetric square root of covariances (..., n, n), negative rounding eigenvalues clipped."""
    lam, V = numpy.linalg.eigh(C)
    return (V * numpy.sqrt(numpy.clip(lam, 0.0, None))[..., None, :]) @ numpy.swapaxes(V, -1, -2)


def field_root(Q, rho, T):
    """``(C^{1/2}, p)``: the symmetric square root of ``C = [[Q, ρ], [ρᵀ, T]]`` (..., n, n).

    Fields ``u = z C^{1/2}`` with ``z ~ N(0, I_n)`` (row vectors) are ``N(0, C)``; the
    root is continuous in ``C`` and defined for singular ``C`` (a negative rounding
    eigenvalue, or a state the SDE moved off the cone of Gram matrices, is clipped to 0).
    """
    C, p = combine(Q, rho, T)
    return _sqrtm(C), p


def increment_kinds(root, p, a, b, z, noise, student, teacher):
    r"""Sample means of the drift's moment kinds' integrands over given field draws.

    The per-sample integrands of the drift's moment kinds
    (:mod:`symquad.symbolic.moments`; ``δ`` the error signal with its label noise)

    .. math::  G_{kl} = σ'(λ_k) λ_l δ,\quad Gt_{km} = σ'(λ_k) ν_m δ,\quad
               B_{kl} = σ'(λ_k) σ'(λ_l) δ^2,\quad R_k = σ(λ_k) δ,

    averaged over ``M`` samples of the fields ``u = (λ, ν) = z·root`` and the label noise
    ``δ = Σ_a w_a σ_a(u_a) − noise``, ``w = (a, −b)``.  Their expectations are the drift's
    kinds; pushed through the generated drift assembly (linear in them) they give the
    per-sample increment ``φ`` of the order parameters, averaged over the ``M`` samples.

    Parameters
    ----------
    root : array (..., n, n)
        ``C^{1/2}`` (:func:`field_root`), symmetric.
    p : int
        Student width (the first ``p`` fields are the students').
    a, b : arrays (..., p), (p*,)
        The error signal's output weights (``c·a`` for the loss's weight ``c``) and the
        teacher readout.
    z : array (..., M, n)
        Standard normal draws.
    noise : array (..., M) or None
        The label noise ``√Δ ξ`` of each sample (None: no label noise).
    student, teacher : activation (coefficient tuple, ``"erf"`` or ``"relu"``)

    Returns
    -------
    G, Gt, B, R : arrays (..., p, p), (..., p, p*), (..., p, p), (..., p)
    """
    u = z @ root                                           # (..., M, n), root symmetric
    s_f, s_d = activation_functions(student)
    t_f, _ = activation_functions(teacher)
    fs = s_f(u[..., :p])
    w = weights(a, b)
    delta = fs @ w[..., :p, None] + t_f(u[..., p:]) @ w[..., p:, None]      # (..., M, 1)
    if noise is not None:
        delta = delta - noise[..., None]
    g = s_d(u[..., :p])
    gd = numpy.swapaxes(g * delta, -1, -2)                 # (..., p, M)
    M = z.shape[-2]
    G = (gd @ u) / M
    B = ((gd * numpy.swapaxes(delta, -1, -2)) @ g) / M
    R = (numpy.swapaxes(fs, -1, -2) @ delta)[..., 0] / M
    return G[..., :p], G[..., p:], B, R


def sampled_diffusion_kinds(Q, rho, T, a, b, Delta, names, student, teacher,
                            samples=SAMPLES, seed=SEED):
    """The moment kinds ``names`` of the pair (`student`, `teacher`) as whole arrays.

    Same contract and axes as :func:`symquad.runtime.diffusion_engine.tensor_kinds`
    (students ``p`` for ``σ'`` and ``σ`` arguments, fields ``n`` for ``u``
    arguments; leading batch dimensions allowed), evaluated by the field-space
    rule of the module docstring with `samples` points scrambled by `seed`.
    """
    C, p = combine(Q, rho, T)
    w = weights(a, b)
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    n = C.shape[-1]
    Cf = numpy.broadcast_to(C, batch + (n, n)).reshape(-1, n, n)
    wf = numpy.broadcast_to(w, batch + (n,)).reshape(-1, n)
    s_f, s_d = activation_functions(student)
    t_f, _ = activation_functions(teacher)
    z, zw = _points(n, int(samples), int(seed))
    R = _sqrtm(Cf)
    Delta = float(Delta)
    shapes = {"M110": (p, n), "M200": (p, p), "M001": (p,), "M220": (p, p, n, n),
              "M310": (p, p, p, n), "M400": (p, p, p, p), "M111": (p, n, p),
              "M201": (p, p, p), "M002": (p, p)}
    for name in names:
        if name not in shapes:
            raise NotImplementedError(f"moment kind {name!r} of the sampled diffusion")
    plan = _plan(p, n)
    sums = {}
    # every state of the batch on each block of points at once (batched products)
    step = max(1, CHUNK // max(1, Cf.shape[0]))
    for c0 in range(0, z.shape[0], step):
        u = z[c0:c0 + step] @ R                            # (B, S, n), R symmetric
        _accumulate(sums, names, u, zw[c0:c0 + step], p, wf, Delta, s_f, s_d, t_f, plan)
    out = {}
    for name in names:
        out[name] = _expand(name, sums[name], p, n, plan).reshape(batch + shapes[name])
    return KindArrays(out)


@functools.lru_cache(maxsize=16)
def _plan(p, n):
    """Index maps of the symmetric reductions: sorted pairs/triples of students, field pairs."""
    pi, pj = numpy.triu_indices(p)
    fa, fb = numpy.triu_indices(n)
    pair = numpy.empty((p, p), dtype=int)
    pair[pi, pj] = numpy.arange(pi.size)
    pair[pj, pi] = numpy.arange(pi.size)
    field = numpy.empty((n, n), dtype=int)
    field[fa, fb] = numpy.arange(fa.size)
    field[fb, fa] = numpy.arange(fa.size)
    return dict(pi=pi, pj=pj, fa=fa, fb=fb, pair=pair, field=field, triples=_tuples(p, 3))


def _expand(name, value, p, n, plan):
    """A kind's full array from its sums on the symmetric reduction of :func:`_accumulate`."""
    pair, field = plan["pair"], plan["field"]
    if name == "M220":                                     # (B, pairs, field pairs)
        return value[:, pair[:, :, None, None], field[None, None, :, :]]
    if name == "M400":                                     # (B, pairs, pairs)
        return value[:, pair[:, :, None, None], pair[None, None, :, :]]
    if name == "M310":                                     # (B, sorted triples, n)
        return _scatter_symmetric(value, plan["triples"], p, (n,))
    if name == "M201":                                     # (B, pairs, p)
        return value[:, pair]
    return value


def _accumulate(acc, names, u, zw, p, w, Delta, s_f, s_d, t_f, plan):
    """Add one block of points ``u`` (S, n), weights ``zw``, to the sums ``acc`` (in place).

    Symmetric kinds are summed on their reductions (sorted student pairs ``i ≤ j``,
    field pairs ``a ≤ b``, sorted triples; :func:`_expand` restores the full arrays),
    which cuts ``M220`` by ~4, ``M400`` by ~3 and ``M310`` by ~4 at ``p = 8``.
    """
    B, S, n = u.shape
    f = numpy.empty_like(u)
    f[..., :p] = s_f(u[..., :p])
    f[..., p:] = t_f(u[..., p:])
    g = s_d(u[..., :p])                                    # σ' of the students
    d = numpy.einsum("bsn,bn->bs", f, w)
    d2 = d * d
    # the label-noise moments of δ^k given the fields (ξ integrated out), times the weights
    m = {1: d * zw, 2: (d2 + Delta) * zw, 3: (d2 * d + 3.0 * Delta * d) * zw,
         4: (d2 * d2 + 6.0 * Delta * d2 + 3.0 * Delta ** 2) * zw}
    m = {k: v[..., None] for k, v in m.items()}
    fs = f[..., :p]
    G2 = None

    def tr(x):
        return numpy.swapaxes(x, -1, -2)

    def add(name, value):
        if name in acc:
            acc[name] += value
        else:
            acc[name] = value
    for name in names:
        if name in ("M220", "M400", "M201") and G2 is None:
            G2 = g[..., plan["pi"]] * g[..., plan["pj"]]   # (B, S, pairs)
        if name == "M110":
            add(name, tr(g * m[1]) @ u)
        elif name == "M200":
            add(name, tr(g * m[2]) @ g)
        elif name == "M001":
            add(name, (tr(fs) @ m[1])[..., 0])
        elif name == "M220":
            U2 = u[..., plan["fa"]] * u[..., plan["fb"]]   # (B, S, field pairs)
            add(name, tr(G2 * m[2]) @ U2)
        elif name == "M310":
            t3 = plan["triples"]
            G3 = g[..., t3[:, 0]] * g[..., t3[:, 1]] * g[..., t3[:, 2]]
            add(name, tr(G3 * m[3]) @ u)
        elif name == "M400":
            add(name, tr(G2 * m[4]) @ G2)
        elif name == "M111":
            UF = (u[..., :, None] * fs[..., None, :]).reshape(B, S, n * p)
            add(name, (tr(g * m[2]) @ UF).reshape(B, p, n, p))
        elif name == "M201":
            add(name, tr(G2 * m[3]) @ fs)
        elif name == "M002":
            add(name, tr(fs * m[2]) @ fs)
