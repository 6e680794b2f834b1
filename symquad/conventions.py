r"""Conversions between symquad's conventions and others used in the field.

symquad's model (docs/model.md §1–§4) normalises both outputs by the width,
``ŷ = (1/p) Σ_k σ(λ_k)``, ``y = (1/p*) Σ_l σ(ν_l)``, and measures time in
samples per input dimension, ``t = steps/N``.  Two other conventions are common
(docs/model.md §7):

**The τ clock.**  Codes such as committee_learning measure time as
``τ = steps·η/(p N)``, absorbing the learning rate and the width into the
clock.  Then

.. math::  τ = \frac{η}{p}\,t,\qquad t = \frac{p}{η}\,τ,\qquad
           \frac{dQ}{dτ} = \frac{p}{η}\,\frac{dQ}{dt}.

At small ``η`` the ODE in ``τ`` tends to gradient flow, independent of ``η``;
the ``η²`` term is ``O(η/p)`` in these units.

**Un-normalised outputs.**  ``ŷ' = Σ_k σ(λ'_k)``, ``y' = Σ_l σ(ν'_l) + √Δ ξ``
with learning rate ``η'``.  For a homogeneous activation ``σ(z) = c z^d`` this
is symquad's model after rescaling the weights, ``w̃_k = a w'_k`` with
``a = p^{1/d}`` and ``w̃*_l = a* w*'_l`` with ``a* = p*^{1/d}``: then
``(1/p) σ(λ̃_k) = σ(λ'_k)``, the outputs, the loss and the risk are the same
functions of the data, and one SGD step on ``w'`` with ``η'`` is one SGD step
on ``w̃`` with ``η = a² η'`` (because ``∇_{w'} = a ∇_{w̃}``).  The overlaps
map as ``Q = a² Q'``, ``ρ = a a* ρ'``, ``T = a*² T'``; time ``t = steps/N``
and the label noise ``Δ`` are unchanged.  (For ``σ = z²``: ``η = p η'``,
``Q = p Q'``, ``ρ = √(p p*) ρ'``, ``T = p* T'``.)  A non-homogeneous
activation has no such map: the two conventions are then different models.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .numeric.checks import as_real_array
from .spec import Model
from .stages import declare

__all__ = ["tau_from_t", "t_from_tau", "rate_per_tau", "from_unnormalised",
           "to_unnormalised", "overlaps_from_unnormalised", "overlaps_to_unnormalised"]


def _homogeneous_degree(model: Model) -> int:
    """Degree ``d`` of ``σ(z) = c z^d`` (ignoring a constant, which cancels in ŷ − y).

    ReLU is positively homogeneous of degree 1 (``relu(s z) = s relu(z)``, ``s > 0``);
    erf(z/√2) is not homogeneous: Saad & Solla's un-normalised soft committee
    machine is ``Model(..., activation="erf", readout=1, teacher_readout=1)``.
    """
    if model.activation == "relu" and model.teacher_activation == "relu":
        return 1
    if isinstance(model.activation, str) or isinstance(model.teacher_activation, str):
        raise ValueError(
            f"un-normalised outputs map to symquad's model by rescaling the weights only for "
            f"a homogeneous activation (c*z**d, or relu for student and teacher); got "
            f"activation={model.activation_str!r}, teacher_activation="
            f"{model.teacher_activation_str!r}; for erf(z/sqrt(2)) give the un-normalised "
            f"readouts directly (readout=1, teacher_readout=1)")
    nonzero = [j for j, c in enumerate(model.activation) if c != 0 and j > 0]
    if len(nonzero) != 1:
        raise ValueError(
            f"un-normalised outputs map to symquad's model only for a homogeneous activation "
            f"c*z**d (plus a constant); got activation {model.activation_str!r}")
    return nonzero[0]


def _scales(model: Model) -> tuple[float, float]:
    """``(a, a*) = (p^{1/d}, p*^{1/d})``: weight rescalings from un-normalised to symquad."""
    d = _homogeneous_degree(model)
    return model.p ** (1.0 / d), model.p_star ** (1.0 / d)


def _clock_eta(model: Model, unnormalised: bool) -> float:
    if not unnormalised:
        return model.eta
    a, _ = _scales(model)
    return model.eta / a**2


def _as_times(name, values):
    arr = as_real_array(values, name, finite=False)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and >= 0")
    return arr if arr.ndim else float(arr)


def tau_from_t(model: Model, t, *, unnormalised: bool = False):
    r"""``τ = t·η/p``: symquad's time ``t = steps/N`` on the clock ``τ = steps·η/(pN)``.

    Parameters
    ----------
    model : Model
        The symquad model (``η = model.eta``).
    t : float or array, >= 0
    unnormalised : bool
        True when the other code also uses un-normalised outputs: its learning
        rate ``η' = η/p^{2/d}`` (see :func:`to_unnormalised`) is the one in its
        clock.

    Examples
    --------
    >>> m = Model(p=4, p_star=2, lr=0.1)
    >>> tau_from_t(m, 100.0)
    2.5
    """
    declare(model, "the time conventions")
    return _as_times("t", t) * _clock_eta(model, unnormalised) / model.p


def t_from_tau(model: Model, tau, *, unnormalised: bool = False):
    r"""``t = p τ/η``: inverse of :func:`tau_from_t`."""
    declare(model, "the time conventions")
    return _as_times("tau", tau) * model.p / _clock_eta(model, unnormalised)


def rate_per_tau(model: Model, rate_per_t, *, unnormalised: bool = False):
    r"""A time derivative or growth rate per unit ``t`` expressed per unit ``τ``.

    ``dX/dτ = (p/η) dX/dt``; e.g. the plateau rate ``κ`` of
    :func:`symquad.plateau` becomes ``p κ/η``.
    """
    declare(model, "the time conventions")
    rate = as_real_array(rate_per_t, "rate_per_t", finite=False)
    return (rate if rate.ndim else float(rate)) * model.p / _clock_eta(model, unnormalised)


def from_unnormalised(p: int, p_star: int, lr: float, noise: float = 0.0,
                      activation=(0, 0, 1)) -> Model:
    r"""The symquad :class:`Model` equivalent to SGD with un-normalised outputs.

    The other code: ``ŷ' = Σ_k σ(λ'_k)``, ``y' = Σ_l σ(ν'_l) + √Δ ξ``, step
    ``w'_k ← w'_k − η' ∂ℓ/∂w'_k`` with ``η' = lr``.  For ``σ = c z^d`` this is
    symquad's model with ``η = p^{2/d} η'`` (``lr_scaling="fixed"``), the same
    activation and noise, on rescaled weights (:func:`overlaps_from_unnormalised`).

    Raises
    ------
    ValueError
        If the activation is not homogeneous (no such map exists).
    """
    probe = Model(p=p, p_star=p_star, lr=lr, noise=noise, activation=activation)
    a, _ = _scales(probe)
    return probe.replace(lr=float(lr) * a**2)


def to_unnormalised(model: Model) -> dict:
    r"""Parameters ``{p, p_star, lr, noise, activation}`` of the un-normalised code.

    Inverse of :func:`from_unnormalised`: ``lr = η/p^{2/d}`` with ``η = model.eta``;
    ``activation`` as exact coefficients (lowest order first).
    """
    declare(model, "the time conventions")
    a, _ = _scales(model)
    return {"p": model.p, "p_star": model.p_star, "lr": model.eta / a**2,
            "noise": model.noise, "activation": (model.activation if isinstance(
                model.activation, str) else tuple(Fraction(c) for c in model.activation))}


def _scale_overlaps(model, Q, rho, T, power):
    a, b = _scales(model)
    # NaN allowed: trajectories may hold diverged replicas
    Q, rho, T = (as_real_array(x, n, finite=False) for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
    p, k = model.p, model.p_star
    for name, arr, shape in (("Q", Q, (p, p)), ("rho", rho, (p, k)), ("T", T, (k, k))):
        if arr.shape[-2:] != shape:
            raise ValueError(f"{name} must have shape (..., {shape[0]}, {shape[1]}) for "
                             f"p={p}, p_star={k}; got {arr.shape}")
    return Q * a ** (2 * power), rho * (a * b) ** power, T * b ** (2 * power)


def overlaps_from_unnormalised(model: Model, Q, rho, T):
    r"""``(Q, ρ, T) = (a² Q', a a* ρ', a*² T')``: un-normalised overlaps in symquad's units.

    ``model`` is the symquad model (from :func:`from_unnormalised`); arrays may
    carry leading axes (times, replicas).  ``a = p^{1/d}``, ``a* = p*^{1/d}``.
    """
    declare(model, "the time conventions")
    return _scale_overlaps(model, Q, rho, T, +1)


def overlaps_to_unnormalised(model: Model, Q, rho, T):
    r"""Inverse of :func:`overlaps_from_unnormalised`: ``(Q/a², ρ/(a a*), T/a*²)``."""
    declare(model, "the time conventions")
    return _scale_overlaps(model, Q, rho, T, -1)

