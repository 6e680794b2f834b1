"""The network, the loss and one SGD step, written symbolically from a Model.

This is where every derivation starts.  Nothing downstream knows the
activation or the loss: they are read off the :class:`~symquad.spec.Model`
here, so a model change changes every equation.

One SGD step on sample ``x`` moves ``w_k ← w_k − η ∂ℓ/∂w_k`` with
``∂ℓ/∂w_k = g_k x/√N`` and ``g_k = ∂ℓ/∂λ_k`` (the chain rule through
``λ_k = w_k·x/√N``).  :func:`sgd_increments` expands the new inner products
``w'_k·w'_l/N`` and ``w'_k·w*_m/N`` bilinearly, using only

``w_k·w_l = N Q_kl``, ``w_k·w*_m = N ρ_km``, ``w_k·x = √N λ_k``,
``w*_m·x = √N ν_m``, ``x·x = N r`` (``r = ‖x‖²/N → 1``),

which gives the exact one-step increments ``N ΔQ`` and ``N Δρ``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..spec import Model
from .symbols import ETA, NOISE, XI, field_symbols, overlap_symbols

__all__ = ["Network", "network", "sgd_increments", "R_NORM"]

#: ``r = ‖x‖²/N``; it concentrates at 1, its fluctuations are O(N^-1/2) and
#: enter the drift only at order 1/N.
R_NORM = sp.Symbol("r", positive=True)


def activation_expr(model: Model, z: sp.Symbol) -> sp.Expr:
    """``σ(z) = Σ_j c_j z^j`` with the model's exact rational coefficients."""
    return sp.Add(*[sp.Rational(c.numerator, c.denominator) * z**j
                    for j, c in enumerate(model.activation)])


@dataclass(frozen=True)
class Network:
    """Symbolic teacher–student network of a model.

    Attributes
    ----------
    lam, nu : tuple of Symbol
        Local fields of the student (``λ_k``) and the teacher (``ν_m``).
    student, teacher : Expr
        ``ŷ = (1/p) Σ_k σ(λ_k)`` and the clean label ``(1/p*) Σ_m σ(ν_m)``.
    error : Expr
        ``δ = ŷ − y`` with ``y`` = teacher ``+ √Δ ξ``.
    loss : Expr
        ``ℓ = ½ δ²``.
    grad : tuple of Expr
        ``g_k = ∂ℓ/∂λ_k``, so that ``∂ℓ/∂w_k = g_k x/√N``.
    """

    lam: tuple
    nu: tuple
    student: sp.Expr
    teacher: sp.Expr
    error: sp.Expr
    loss: sp.Expr
    grad: tuple


def network(model: Model) -> Network:
    """Build the symbolic network, loss and local gradient of ``model``."""
    lam, nu = field_symbols(model.p, model.p_star)
    z = sp.Dummy("z")
    sigma = sp.Lambda(z, activation_expr(model, z))
    student = sp.Add(*[sigma(l) for l in lam]) / model.p
    teacher = sp.Add(*[sigma(n) for n in nu]) / model.p_star
    error = student - (teacher + sp.sqrt(NOISE) * XI)
    loss = error**2 / 2
    grad = tuple(sp.diff(loss, l) for l in lam)
    return Network(lam, nu, student, teacher, error, loss, grad)


def _inner(u: dict, v: dict, gram) -> sp.Expr:
    return sp.Add(*[cu * cv * gram(a, b) for a, cu in u.items() for b, cv in v.items()])


def sgd_increments(model: Model, net: Network | None = None):
    """Exact one-step increments ``(N ΔQ, N Δρ)`` of the order parameters.

    Returns p×p and p×p* SymPy matrices, polynomials in the fields, ``ξ``,
    ``η`` and ``r = ‖x‖²/N``.  With ``dt = 1/N`` their expectations are the
    ODE right-hand sides.

    Notes
    -----
    Vectors are kept as linear combinations of the basis ``{w_k, w*_m, x}``
    and inner products are expanded bilinearly (see the module docstring);
    ``N`` cancels exactly, leaving

    ``N ΔQ_kl = −η (g_k λ_l + g_l λ_k) + η² r g_k g_l``,
    ``N Δρ_km = −η g_k ν_m``.
    """
    net = net or network(model)
    N = sp.Symbol("N", positive=True)
    p, k = model.p, model.p_star
    Q, rho, _ = overlap_symbols(p, k)
    lam, nu, g = net.lam, net.nu, net.grad

    def gram(a, b):
        (ka, ia), (kb, ib) = sorted((a, b))
        table = {
            ("w", "w"): lambda: N * Q[ia, ib],
            ("w", "ws"): lambda: N * rho[ia, ib],
            ("w", "x"): lambda: sp.sqrt(N) * lam[ia],
            ("ws", "x"): lambda: sp.sqrt(N) * nu[ia],
            ("x", "x"): lambda: N * R_NORM,
        }
        return table[(ka, kb)]()

    step = -ETA / sp.sqrt(N)
    w_new = [{("w", i): 1, ("x", 0): step * g[i]} for i in range(p)]
    w_old = [{("w", i): 1} for i in range(p)]
    teacher = [{("ws", m): 1} for m in range(k)]
    dQ = sp.Matrix(p, p, lambda i, j: sp.expand(
        (_inner(w_new[i], w_new[j], gram) - _inner(w_old[i], w_old[j], gram))))
    drho = sp.Matrix(p, k, lambda i, m: sp.expand(
        _inner(w_new[i], teacher[m], gram) - _inner(w_old[i], teacher[m], gram)))
    # Both are exactly N^0 times the per-step change times N: check, then drop N.
    if (dQ.free_symbols | drho.free_symbols) & {N}:  # pragma: no cover - algebra guard
        raise AssertionError("N did not cancel in the SGD increments")
    return dQ, drho
