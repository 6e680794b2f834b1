"""Entry-by-entry derivation of the ODEs and the risk (any polynomial activations).

The independent small-width reference.  The drift of
:func:`symquad.symbolic.update.drift` — the one assembly of the ODE from the
update rule — is instantiated at every pair of concrete units, and each of
its expectations ``E[g_i λ_j]``, ``E[g_i g_j]``, ``E[g_i ν_m]``, ``E[h_i]`` is
taken of the *explicit* per-sample polynomials of
:func:`symquad.symbolic.network.network` (``g_i = ∂ℓ/∂λ_i`` with the model's
``σ``, ``σ*``, readout symbols ``a_i``, ``b_m`` and label noise) over

``(λ, ν) ~ N(0, [[Q, ρ], [ρᵀ, T]])``, ``ξ ~ N(0, 1)`` independent,

by the Wick/Isserlis engine :class:`~symquad.symbolic.wick.GaussianFields`.
Nothing here knows which moment kinds exist: the matrix and tensor routes,
which do, are checked against this one (``tests/test_routes_agree.py``).
The risk is ``ε = ½ E[(ŷ − y_clean)²]``.

Readouts stay symbols (``a_1..a_p``, ``b_1..b_p*``), and ``η``, ``Δ``, ``λ``,
``b``, ``η_a`` are parameters: one derivation serves every value.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from ..spec import Model
from .network import network
from .symbols import XI, overlap_symbols, readout_symbols
from .update import Af, E, G, H, LAM, NU, Qf, RHOf, drift
from .wick import GaussianFields
from ..spec import activation_label

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
    """Refuse (ValueError) or warn (RuntimeWarning) before a long entry-route derivation.

    Non-polynomial activations (erf, relu) are refused first: the route takes
    Wick/Isserlis expectations of polynomials.
    """
    import warnings
    if not model.is_polynomial:
        names = ", ".join(f"{f}={getattr(model, f)!r} ({activation_label(getattr(model, f))})"
                          for f in ("activation", "teacher_activation")
                          if isinstance(getattr(model, f), str))
        raise ValueError(
            f"the entry-by-entry route needs polynomial activations (it takes Wick/Isserlis "
            f"expectations of polynomials), got {names}; use form='tensor' (the default: the "
            f"closed forms of I_2, J_2, I_3, I_4 as definitions and the ODE as index sums; "
            f"sq.kernels for numbers)")
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


class _ExplicitExpectations:
    """``E[monomial of g, h, λ, ν]`` of the explicit network, memoised per monomial."""

    def __init__(self, model: Model):
        self.net = network(model)
        self.fields = model_fields(model)
        self.memo = {}
        net = self.net
        self.values = {G: lambda i: net.grad[i - 1], H: lambda i: net.readout_grad[i - 1],
                       LAM: lambda i: net.lam[i - 1], NU: lambda m: net.nu[m - 1]}

    def __call__(self, monomial):
        if monomial not in self.memo:
            explicit = monomial.replace(lambda e: e.func in self.values,
                                        lambda e: self.values[e.func](int(e.args[0])))
            self.memo[monomial] = self.fields.expectation(explicit)
        return self.memo[monomial]


def _explicit_state(model: Model) -> dict:
    """``Qf(i, j) -> Q_i_j``, ``RHOf(i, m) -> rho_i_m``, ``Af(i) -> a_i`` (1-based units)."""
    p, k = model.p, model.p_star
    Q, rho, _ = overlap_symbols(p, k)
    a, _ = readout_symbols(p, k)
    table = {Qf(i + 1, j + 1): Q[i, j] for i in range(p) for j in range(i, p)}
    table.update({RHOf(i + 1, m + 1): rho[i, m] for i in range(p) for m in range(k)})
    table.update({Af(i + 1): a[i] for i in range(p)})
    return table


@lru_cache(maxsize=32)
def derive_entries(model: Model):
    """``(risk, dQ, drho, da)`` as explicit SymPy expressions in the entry symbols.

    ``da`` (the readout's drift, a p×1 Matrix) is None for a fixed readout.
    ``η``, ``Δ`` and the other parameters stay symbolic, and so do the readouts;
    only the structure of ``model`` (widths, activations, constraint, trained
    or fixed readout) matters, so the cache is keyed by it.  The cost grows
    fast with the widths: :func:`check_entry_route_size` runs first.
    """
    check_entry_route_size(model)
    return _derive_entries(_structure(model))


def _structure(model: Model) -> Model:
    """The model with the fields that stay symbols reset (one cache entry per structure).

    Its stand-in (:meth:`symquad.Model.stand_in`) with its widths and activations:
    every field that is not a kernel parameter keeps its value, so a field added later
    gets its own cache entry.
    """
    return model.stand_in(model.p, model.p_star, activations=True)


@lru_cache(maxsize=32)
def _derive_entries(model: Model):
    expect = _ExplicitExpectations(model)
    state = _explicit_state(model)
    d = drift(model)
    p, k = model.p, model.p_star

    def evaluate(expr):
        expr = expr.replace(lambda e: e.func == E, lambda e: expect(e.args[0]))
        return sp.expand(expr.xreplace(state))

    dQ = sp.zeros(p, p)
    drho = sp.zeros(p, k)
    da = sp.zeros(p, 1) if d.da is not None else None
    for i in range(1, p + 1):
        for j in range(i, p + 1):
            dQ[i - 1, j - 1] = dQ[j - 1, i - 1] = evaluate(d.at(i, j, 1)[0])
        for m in range(1, k + 1):
            drho[i - 1, m - 1] = evaluate(d.at(i, i, m)[1])
        if da is not None:
            da[i - 1, 0] = evaluate(d.at(i, i, 1)[2])
    net = expect.net
    risk = expect.fields.expectation((net.student - net.teacher) ** 2 / 2)
    return risk, dQ, drho, da
