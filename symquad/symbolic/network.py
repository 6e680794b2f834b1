"""The per-sample model: network, readouts and loss, written symbolically from a Model.

This is where every derivation starts (docs/model.md §1–§2).  Nothing
downstream knows the activations, the readouts or the loss: they are read off
the :class:`~symquad.spec.Model` here.

One sample ``x`` gives local fields ``λ_k = w_k·x/√N``, ``ν_m = w*_m·x/√N``,

.. math::  ŷ = \\sum_k a_k σ(λ_k),\\qquad y = \\sum_m b_m σ^*(ν_m) + \\sqrt{Δ}\\,ξ,\\qquad
           ℓ = \\tfrac12 (ŷ - y)^2 ,

and the two gradients the SGD update of :mod:`symquad.symbolic.update` needs:
``∂ℓ/∂w_k = g_k x/√N`` with the *local gradient* ``g_k = ∂ℓ/∂λ_k`` (chain rule
through ``λ_k = w_k·x/√N``), and the readout gradient ``h_k = ∂ℓ/∂a_k``.

The network is built twice from the same definition (:func:`_build`):

* :func:`network` — explicit: ``σ`` and ``σ*`` are the model's polynomials;
  the entry-by-entry route takes expectations of these polynomials directly;
* :func:`abstract_network` — ``σ``, ``σ*`` are undefined functions and the
  error ``ŷ − y`` is the symbol :data:`ERROR`, so that ``g_k`` and ``h_k``
  appear in factored form (``g_k = a_k σ'(λ_k) δ``); the matrix and tensor
  routes read their moment kinds off this form
  (:mod:`symquad.symbolic.moments`).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..spec import Model, error_signal_weight
from .symbols import NOISE, XI, field_symbols, readout_symbols

__all__ = ["Network", "network", "abstract_network", "activation_expr", "readout_values",
           "ERROR", "SIGMA", "SIGMA_STAR"]

#: The per-sample error signal ``e = ∂ℓ/∂ŷ`` (``δ = ŷ − y`` for the square loss, ``−y``
#: for the correlation loss; label noise included) as one symbol.
ERROR = sp.Symbol("delta", real=True)
#: Undefined student and teacher activations of :func:`abstract_network`.
SIGMA = sp.Function("sigma", real=True)
SIGMA_STAR = sp.Function("sigma_star", real=True)


def activation_expr(coeffs, z: sp.Symbol) -> sp.Expr:
    """``Σ_j c_j z^j`` with exact rational coefficients ``(c0, c1, …)``; for the names
    ``"erf"`` and ``"relu"`` the functions ``erf(z/√2)`` and ``max(z, 0)``."""
    if coeffs == "erf":
        return sp.erf(z / sp.sqrt(2))
    if coeffs == "relu":
        return sp.Max(z, 0)
    return sp.Add(*[sp.Rational(c.numerator, c.denominator) * z**j
                    for j, c in enumerate(coeffs)])


@dataclass(frozen=True)
class Network:
    """Symbolic teacher–student network of a model (one sample).

    Attributes
    ----------
    lam, nu : tuple of Symbol
        Local fields of the student (``λ_k``) and the teacher (``ν_m``).
    readout, teacher_readout : tuple of Symbol
        Output weights ``a_k`` and ``b_m`` (symbols; their values are
        parameters or, for a trained readout, state).
    student, teacher : Expr
        ``ŷ = Σ_k a_k σ(λ_k)`` and the clean label ``Σ_m b_m σ*(ν_m)``.
    error : Expr
        The loss's error signal ``e = ∂ℓ/∂ŷ = c ŷ − y`` with ``y`` = teacher
        ``+ √Δ ξ`` and ``c`` of :data:`symquad.spec.LOSSES` (square loss:
        ``δ = ŷ − y``; correlation loss: ``−y``); :data:`ERROR` in the
        abstract network.
    loss : Expr
        ``ℓ = ½ δ²`` (square) or ``ℓ = −y ŷ`` (correlation).
    grad : tuple of Expr
        ``g_k = ∂ℓ/∂λ_k``, so that ``∂ℓ/∂w_k = g_k x/√N``.
    readout_grad : tuple of Expr
        ``h_k = ∂ℓ/∂a_k``.
    """

    lam: tuple
    nu: tuple
    readout: tuple
    teacher_readout: tuple
    student: sp.Expr
    teacher: sp.Expr
    error: sp.Expr
    loss: sp.Expr
    grad: tuple
    readout_grad: tuple


def _build(model: Model, sigma, sigma_star, opaque_error: bool) -> Network:
    """The per-sample definition, with given callables for ``σ`` and ``σ*``."""
    lam, nu = field_symbols(model.p, model.p_star)
    a, b = readout_symbols(model.p, model.p_star)
    student = sp.Add(*[ak * sigma(l) for ak, l in zip(a, lam)])
    teacher = sp.Add(*[bm * sigma_star(n) for bm, n in zip(b, nu)])
    label = teacher + sp.sqrt(NOISE) * XI
    # the loss's error signal e = dl/dyhat = c yhat - y, c declared once (spec.LOSSES);
    # l is written so that dl/dyhat is exactly that (square: (yhat - y)^2/2, correlation:
    # -y yhat) and every gradient below is e times a factor of the network alone
    c = error_signal_weight(model)
    error = c * student - label
    loss = c * (student - label) ** 2 / 2 - (1 - c) * label * student
    grad = tuple(sp.diff(loss, l) for l in lam)
    readout_grad = tuple(sp.diff(loss, ak) for ak in a)
    if opaque_error:
        grad = tuple(_opaque(g, error) for g in grad)
        readout_grad = tuple(_opaque(h, error) for h in readout_grad)
        error = ERROR
    return Network(lam, nu, a, b, student, teacher, error, loss, grad, readout_grad)


def _opaque(expr: sp.Expr, error: sp.Expr) -> sp.Expr:
    """`expr` with the error expression replaced by :data:`ERROR` (checked complete)."""
    out = expr.subs(error, ERROR)
    if out.atoms(sp.Symbol) & {XI, NOISE}:  # pragma: no cover - ℓ is a function of δ alone
        raise AssertionError(f"the gradient {expr} is not a function of the error alone")
    return out


def network(model: Model) -> Network:
    """Build the explicit symbolic network, loss and gradients of ``model``."""
    z = sp.Dummy("z")
    sigma = sp.Lambda(z, activation_expr(model.activation, z))
    sigma_star = sp.Lambda(z, activation_expr(model.teacher_activation, z))
    return _build(model, sigma, sigma_star, opaque_error=False)


def abstract_network(model: Model) -> Network:
    """The network with undefined ``σ``, ``σ*`` and the error as :data:`ERROR`.

    Its ``grad`` and ``readout_grad`` are products of readout symbols, local
    factors (``σ(λ_k)``, ``σ'(λ_k)``) and powers of ``δ``: the form from which
    the matrix and tensor routes read which expectations they need.
    """
    return _build(model, SIGMA, SIGMA_STAR, opaque_error=True)


def readout_values(model: Model, trained_too: bool = False) -> dict:
    """``{b_m: value}`` and, for a fixed readout (or with `trained_too`), ``{a_k: value}``.

    The exact rationals of the model's readouts, to substitute into
    expressions of the network (the readout symbols of a trained readout are
    state, so they stay unless `trained_too`, which substitutes ``a(0)``).
    """
    a, b = readout_symbols(model.p, model.p_star)
    values = {s: sp.Rational(c.numerator, c.denominator)
              for s, c in zip(b, model.teacher_readout)}
    if trained_too or not model.readout_trained:
        values.update({s: sp.Rational(c.numerator, c.denominator)
                       for s, c in zip(a, model.readout)})
    return values
