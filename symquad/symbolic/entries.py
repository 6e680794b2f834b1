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

__all__ = ["model_fields", "derive_entries"]


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
    activation) matters, so the cache is keyed by it.
    """
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
