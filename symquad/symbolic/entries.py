"""Entry-by-entry derivation of the ODEs and the risk (any polynomial activation).

The one-step increments of :func:`~symquad.symbolic.network.sgd_increments`
are polynomials in the fields ``(λ, ν)``, the label noise ``ξ`` and
``r = ‖x‖²/N``.  Their expectations over

``(λ, ν) ~ N(0, [[Q, ρ], [ρᵀ, T]])``, ``ξ ~ N(0, 1)`` independent,

with ``r → 1`` (``E[r f] = E[f] + O(1/N)`` because ``x`` has ``N − p − p*``
directions outside the span of the weights), are the ODE right-hand sides:

``dQ_kl/dt = E[−η (g_k λ_l + g_l λ_k) + η² g_k g_l]``,
``dρ_km/dt = E[−η g_k ν_m]``,  ``g_k = ∂ℓ/∂λ_k``.

The risk is ``ε = ½ E[(ŷ − y_clean)²]``.  Expectations come from the
Wick/Isserlis engine :class:`~symquad.symbolic.wick.GaussianFields`.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from ..spec import Model
from .network import R_NORM, network, sgd_increments
from .symbols import XI, overlap_symbols
from .wick import GaussianFields

__all__ = ["model_fields", "derive_entries", "entry_route_estimate", "check_entry_route_size",
           "ENTRY_WARN_SECONDS", "ENTRY_REFUSE_SECONDS"]

#: The entry route warns above this estimated derivation time (seconds) ...
ENTRY_WARN_SECONDS = 60.0
#: ... and refuses above this one.
ENTRY_REFUSE_SECONDS = 3600.0


def entry_route_estimate(model: Model) -> float:
    """Rough derivation time (seconds, 2-core machine) of the entry route for ``model``.

    Fitted to measured derivation times on the project's 2-core machine:
    ``σ = z³`` took 8.9 s at ``(p, p*) = (4, 3)``, 19 s at ``(5, 3)`` and 180 s
    at ``(8, 4)``; ``z⁴`` 34 s at ``(4, 2)``, ``z⁵`` 121 s at ``(3, 2)``.  With
    ``E = p(p+1)/2 + p p*`` entries and ``n = p + p*`` fields,
    ``t ≈ 4.4·10⁻⁴ · 10^{deg σ − 3} · E · n^{3.5}`` (within a factor ~2 on those
    points; the entry route also fails to compile some modules past
    ``p ≈ 8``).
    """
    p, k = model.p, model.p_star
    entries = p * (p + 1) // 2 + p * k
    return 4.4e-4 * 10.0 ** (max(model.degree, 2) - 3) * entries * (p + k) ** 3.5


def check_entry_route_size(model: Model) -> None:
    """Refuse (ValueError) or warn (RuntimeWarning) before a long entry-route derivation."""
    import warnings
    estimate = entry_route_estimate(model)
    advice = ("the width-independent tensor route (form='tensor') has no such cost")
    if estimate > ENTRY_REFUSE_SECONDS:
        raise ValueError(
            f"the entry-by-entry route for p={model.p}, p_star={model.p_star}, "
            f"activation {model.activation_str!r} would take about {estimate:.3g} s "
            f"(> {ENTRY_REFUSE_SECONDS:.0f} s allowed); use smaller p, p_star — {advice}")
    if estimate > ENTRY_WARN_SECONDS:
        warnings.warn(
            f"the entry-by-entry route for p={model.p}, p_star={model.p_star}, activation "
            f"{model.activation_str!r} will take about {estimate:.3g} s; {advice}",
            RuntimeWarning, stacklevel=3)



def model_fields(model: Model) -> GaussianFields:
    """The Gaussian fields ``(λ, ν, ξ)`` of a model with symbolic covariance."""
    net = network(model)
    Q, rho, T = overlap_symbols(model.p, model.p_star)
    C = sp.Matrix(sp.BlockMatrix([[Q, rho], [rho.T, T]]))
    cov = sp.diag(C, sp.Integer(1))
    return GaussianFields(net.lam + net.nu + (XI,), cov)


@lru_cache(maxsize=32)
def derive_entries(model: Model):
    """``(risk, dQ, drho)`` as explicit SymPy expressions in the entry symbols.

    ``η`` and ``Δ`` stay symbolic; only the structure of ``model`` (widths and
    activation) matters, so the cache is keyed by it.  The cost grows fast
    with the widths: :func:`check_entry_route_size` runs first.
    """
    check_entry_route_size(model)
    net = network(model)
    fields = model_fields(model)
    dQ_inc, drho_inc = sgd_increments(model, net)
    p, k = model.p, model.p_star

    def expect(expr):
        return fields.expectation(expr.subs(R_NORM, 1))

    dQ = sp.zeros(p, p)
    for i in range(p):
        for j in range(i, p):
            dQ[i, j] = dQ[j, i] = expect(dQ_inc[i, j])
    drho = sp.Matrix(p, k, lambda i, m: expect(drho_inc[i, m]))
    risk = fields.expectation((net.student - net.teacher) ** 2 / 2)
    return risk, dQ, drho
