r"""The exact Jacobian of the drift, the gradient and the Hessian of the risk (entry route).

The linear-noise approximation (:func:`symquad.fluctuations`) needs
``J = ∂f/∂X`` along the ODE and ``∇ε`` to turn the covariance of the state into
the spread of the risk.  Both are derived here from the entry route's drift and
risk (:func:`symquad.symbolic.entries.derive_entries`, the one assembly of the
drift from the update rule, evaluated entry by entry): every entry is a
polynomial in the entry symbols (with ``1/Q_kk`` for the sphere and ``1/b`` for a
mini-batch), converted to a sparse polynomial ring and differentiated *exactly*
with respect to each state entry ``X_J`` (upper triangle of ``Q``, ``ρ``, a trained
``a``; ``∂(1/Q_kk)/∂Q_kk = −1/Q_kk²``).  No finite differences.

The state entry ``Q_ij`` (``i < j``) stands for both ``Q_ij`` and ``Q_ji``: the entry
symbols are shared by the two positions, so the derivative is the one of the
state vector.  Cost: that of the entry route (checked first), then one ring
derivative per entry pair.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from ..spec import Model
from .entries import _structure, check_entry_route_size, derive_entries
from .symbols import BATCH, PARAMS, overlap_symbols, readout_symbols
from .wick import to_ring
from ..numeric.layout import state_layout

__all__ = ["jacobian_polynomials"]


class _Ring:
    """Entry symbols, readouts, parameters and the inverses ``1/b``, ``1/Q_kk`` as a ring."""

    def __init__(self, model: Model):
        from sympy.polys.rings import ring
        p, k = model.p, model.p_star
        Q, rho, T = overlap_symbols(p, k)
        a, b = readout_symbols(p, k)
        self.inv_batch = sp.Symbol("inv_batch_size", positive=True)
        self.inv_q = [sp.Symbol(f"inv_Q_{i + 1}_{i + 1}", positive=True) for i in range(p)]
        overlaps = sorted(Q.free_symbols | rho.free_symbols | T.free_symbols,
                          key=sp.default_sort_key)
        self.gens = overlaps + list(a) + list(b) + list(PARAMS) + [self.inv_batch] + self.inv_q
        self.R, *elements = ring(self.gens, sp.QQ)
        self.gen = dict(zip(self.gens, elements))
        self.inverse = {BATCH: self.gen[self.inv_batch]}
        self.inverse.update({Q[i, i]: self.gen[self.inv_q[i]] for i in range(p)})
        self.diag_inverse = {Q[i, i]: self.gen[self.inv_q[i]] for i in range(p)}

    def convert(self, expr):
        return to_ring(expr, self.R, self.inverse, self.gen.__getitem__)

    def derivative(self, element, symbol):
        """``d element / d symbol`` with the chain rule through ``1/Q_kk``."""
        out = element.diff(self.gen[symbol])
        inv = self.diag_inverse.get(symbol)
        if inv is not None:
            out -= element.diff(inv) * inv**2
        return out


def _terms(element):
    return [(int(c.numerator), int(c.denominator), tuple(m)) for m, c in sorted(element.terms())]


def jacobian_polynomials(model: Model):
    """``(generators, J, grad, hess)``: Jacobian, risk gradient and risk Hessian as sparse polynomials.

    ``J`` is a list of ``dim²`` polynomials (row ``I`` = ``f_I``, column ``J`` =
    state entry ``X_J``, row by row), ``grad`` of ``dim``, ``hess`` of ``dim²``
    (``∂²ε/∂X_I∂X_J`` row by row); each a list of
    ``(numerator, denominator, exponents over generators)``.  Only the model's
    structure matters (cached); the entry route's size is checked first.
    """
    check_entry_route_size(model)
    return _jacobian_polynomials(_structure(model))


@lru_cache(maxsize=16)
def _jacobian_polynomials(model: Model):
    risk, dQ, drho, da = derive_entries(model)
    ring = _Ring(model)
    p, k = model.p, model.p_star
    Q, rho, _ = overlap_symbols(p, k)
    a, _ = readout_symbols(p, k)
    layout = state_layout(model)
    drift, state = [], []
    for block, i, j in layout.entries:
        if block == "Q":
            drift.append(dQ[i, j])
            state.append(Q[i, j])
        elif block == "rho":
            drift.append(drho[i, j])
            state.append(rho[i, j])
        else:
            drift.append(da[i, 0])
            state.append(a[i])
    drift = [ring.convert(sp.expand(f)) for f in drift]
    jac = [_terms(ring.derivative(f, x)) for f in drift for x in state]
    r = ring.convert(sp.expand(risk))
    first = [ring.derivative(r, x) for x in state]
    grad = [_terms(g) for g in first]
    hess = [_terms(ring.derivative(g, y)) for g in first for y in state]
    return [str(g) for g in ring.gens], jac, grad, hess
