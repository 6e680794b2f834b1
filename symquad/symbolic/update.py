r"""One SGD step as a map of the order parameters, and its drift: the only assembly of the ODE.

The update rule of docs/model.md §2 is written here once, as vectors in
``R^N``, for generic units ``i, j`` (symbols or integers):

.. math::

   w_i' &= w_i - η\,\overline{∂ℓ/∂w_i} - \frac{ηλ}{N} w_i,
        \qquad \overline{∂ℓ/∂w_i} = \frac{1}{b}\sum_{μ=1}^{b} g_i^μ \frac{x^μ}{\sqrt N}
        = \frac{X_i}{b\sqrt N},\\
   a_i' &= a_i - \frac{η_a}{N}\,\overline{h_i},\\
   w_i'' &= w_i'\,\frac{|w_i|}{|w_i'|} \quad\text{(constraint "sphere": the norm, } |w_i|^2 = N
        \text{ on the sphere, is restored)},

with the per-sample gradients ``g_i = ∂ℓ/∂λ_i``, ``h_i = ∂ℓ/∂a_i`` of
:mod:`symquad.symbolic.network` kept *opaque* (``g(i)``, ``h(i)``) and
``X_i = Σ_μ g_i^μ x^μ``, the batch's ``b`` fresh inputs.  The new overlaps
``Q'_ij = w_i''·w_j''/N``, ``ρ'_im = w_i''·w*_m/N`` follow by expanding the inner
products bilinearly with

* ``w_i·w_j = N Q_ij``, ``w_i·w*_m = N ρ_im``,
* ``X_i·w_j = √N Σ_μ g_i^μ λ_j^μ = √N b·Mean[g_i λ_j]``, ``X_i·w*_m = √N b·Mean[g_i ν_m]``,
* ``X_i·X_j = N b·Mean[g_i g_j r] + N b(b−1)·PairMean[g_i g_j r_×]``,

where ``Mean`` is the average over the batch, ``PairMean`` over ordered pairs
of distinct samples, ``r = |x^μ|²/N`` and ``r_× = x^μ·x^ν/N`` (``μ ≠ ν``).  With
``ε = 1/N`` every new overlap is a polynomial (for the sphere: a smooth
function) of ``ε`` whose value at ``ε = 0`` is the old one, and one step is
``dt = ε``.  The drift is therefore

.. math::  \frac{dX}{dt} = \frac{∂X'}{∂ε}\Big|_{ε=0}, \quad\text{with}\quad
           E[\mathrm{Mean}[f]] = E[f],\quad r \to 1,\quad r_× \to 0:

``E[f r] = E[f] + O(1/N)`` because ``x`` has ``N − p − p*`` directions outside
the span of the weights, independent of the fields, with ``E[x_⊥²] = (N −
p − p*)/N``; the part of ``x^μ·x^ν/N`` in that span is ``O(1/N)`` and the rest
has mean zero independently of both samples' fields, so ``E[f r_×] = O(1/N)``.

What comes out (:func:`drift`) is, before any constraint,

.. math::

   \frac{dQ_{ij}}{dt} &= -2ηλ Q_{ij} - η\,(E[g_i λ_j] + E[g_j λ_i]) + \frac{η^2}{b} E[g_i g_j],\\
   \frac{dρ_{im}}{dt} &= -ηλ ρ_{im} - η\,E[g_i ν_m], \qquad
   \frac{da_i}{dt} = -η_a E[h_i],

and for the sphere ``dQ_ij ← F_ij − ½ Q_ij (F_ii/Q_ii + F_jj/Q_jj)``,
``dρ_im ← F^ρ_im − ½ ρ_im F_ii/Q_ii`` — the batch divides the ``η²`` term by
``b`` (each step averages ``b`` independent gradients; the cross terms between
distinct samples vanish), weight decay adds the deterministic shrink, the
sphere projects onto ``Q_ii = const``.  None of this is typed anywhere else:
the entry route takes these expectations of the explicit network by Wick's
theorem (:mod:`symquad.symbolic.entries`), the matrix and tensor routes map
them to their moment kinds (:mod:`symquad.symbolic.moments`), the code
generator renders the same expressions into every kernel.

The per-sample increment of one sample (``b = 1``), ``F_X = ∂X'/∂ε``
before the expectation (:func:`increments`), is what the finite-``N``
theory's diffusion matrix is the covariance of.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

# the module, not model_fields: looked up when called, so a replacement in symquad.spec
# (tests' synthetic fields) takes effect here
from .. import spec
from ..spec import Model
from .symbols import BATCH, ETA, ETA_READOUT, PARAMS, WEIGHT_DECAY

__all__ = ["switched_off", "Qf", "RHOf", "Af", "G", "H", "LAM", "NU", "MEAN", "PAIR", "E", "R_NORM",
           "R_CROSS", "EPS", "Drift", "drift", "increments", "step_map", "UNITS"]


class Qf(sp.Function):
    """``Q_ij`` of generic units: symmetric, arguments kept in canonical order."""

    nargs = 2

    @classmethod
    def eval(cls, i, j):
        if sp.default_sort_key(j) < sp.default_sort_key(i):
            return cls(j, i)
        return None


#: ``ρ_im`` (student ``i``, teacher ``m``) and the student readout ``a_i``.
RHOf = sp.Function("rho")
Af = sp.Function("a")
#: Per-sample quantities: local gradient ``g_i``, readout gradient ``h_i``,
#: local fields ``λ_i`` and ``ν_m``.
G = sp.Function("g")
H = sp.Function("h")
LAM = sp.Function("lam")
NU = sp.Function("nu")
#: Batch mean, mean over pairs of distinct samples, and the expectation.
MEAN = sp.Function("Mean")
PAIR = sp.Function("PairMean")
E = sp.Function("E")
#: ``|x|²/N`` and ``x^μ·x^ν/N`` for distinct samples of one batch.
R_NORM = sp.Symbol("r", positive=True)
R_CROSS = sp.Symbol("r_x", real=True)
#: ``ε = 1/N``, the time of one step.
EPS = sp.Symbol("epsilon", positive=True)
#: Generic unit symbols: students ``k, l`` and teacher ``m``.
UNITS = tuple(sp.Symbol(name, integer=True, positive=True) for name in ("k", "l", "m"))

_RANDOM_HEADS = (G, H, LAM, NU)


def _inner(u: dict, v: dict, N) -> sp.Expr:
    """Inner product of two vectors given as ``{(kind, index): coefficient}``.

    Kinds: ``"w"`` student row, ``"ws"`` teacher row, ``"X"`` the batch sum
    ``X_i = Σ_μ g_i^μ x^μ`` (see the module docstring for the table).
    """
    b = BATCH

    def gram(x, y):
        (kx, ix), (ky, iy) = sorted((x, y), key=lambda t: ({"w": 0, "ws": 1, "X": 2}[t[0]],
                                                          sp.default_sort_key(t[1])))
        if (kx, ky) == ("w", "w"):
            return N * Qf(ix, iy)
        if (kx, ky) == ("w", "ws"):
            return N * RHOf(ix, iy)
        if (kx, ky) == ("w", "X"):
            return sp.sqrt(N) * b * MEAN(G(iy) * LAM(ix))
        if (kx, ky) == ("ws", "X"):
            return sp.sqrt(N) * b * MEAN(G(iy) * NU(ix))
        if (kx, ky) == ("X", "X"):
            return (N * b * MEAN(G(ix) * G(iy) * R_NORM)
                    + N * b * (b - 1) * PAIR(G(ix) * G(iy) * R_CROSS))
        raise KeyError((kx, ky))  # pragma: no cover - teacher-teacher is never needed

    return sp.Add(*[cu * cv * gram(x, y) for x, cu in u.items() for y, cv in v.items()])


def _updated_row(model: Model, i, N) -> dict:
    """``w_i' = (1 − ηλ/N) w_i − η X_i/(b√N)`` (before the constraint)."""
    return {("w", i): 1 - ETA * WEIGHT_DECAY / N, ("X", i): -ETA / (BATCH * sp.sqrt(N))}


def step_map(model: Model, i, j, m):
    """New ``(Q'_ij, ρ'_im, a'_i)`` after one step, as functions of ``ε = 1/N``.

    Parameters
    ----------
    model : Model
        Only its ``constraint`` and the presence of a trained readout matter
        here; ``η``, ``λ``, ``b``, ``η_a`` stay symbols.
    i, j : Symbol or int
        Student units; ``m`` a teacher unit.

    Returns
    -------
    (Expr, Expr, Expr or None)
        In the symbols of this module (``Qf``, ``RHOf``, ``Af``, ``MEAN``, ...).
    """
    N = 1 / EPS
    wi, wj = _updated_row(model, i, N), _updated_row(model, j, N)
    q_new = sp.expand(_inner(wi, wj, N) / N)
    rho_new = sp.expand(_inner(wi, {("ws", m): 1}, N) / N)
    if model.constraint == "sphere":
        # w_i'' = w_i' |w_i| / |w_i'|: every row keeps its norm (|w_i|² = N on the sphere)
        def factor(u, row):
            return sp.sqrt(Qf(u, u) / sp.expand(_inner(row, row, N) / N))
        q_new = q_new * factor(i, wi) * factor(j, wj)
        rho_new = rho_new * factor(i, wi)
    a_new = Af(i) - ETA_READOUT * EPS * MEAN(H(i)) if model.readout_trained else None
    return q_new, rho_new, a_new


def _first_order(expr: sp.Expr) -> sp.Expr:
    """``∂expr/∂ε`` at ``ε = 0``, after checking that ``expr`` is the old value there."""
    return sp.expand(sp.diff(expr, EPS).subs(EPS, 0))


def _is_random(factor) -> bool:
    return factor.has(*_RANDOM_HEADS) or factor.has(R_NORM, R_CROSS)


def _linear_expectation(expr: sp.Expr, head=E, limits=True) -> sp.Expr:
    """Replace every ``Mean[·]``/``PairMean[·]`` by ``head[·]`` of random monomials.

    Linearity: the non-random factors (overlaps, readouts, parameters) are
    pulled out, so each ``head`` holds one monomial of per-sample quantities.
    With `limits`, ``r → 1`` and ``r_× → 0`` (the module docstring).
    """
    out = []
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, rest = sp.Integer(1), []
        for factor in sp.Mul.make_args(term):
            if factor.func in (MEAN, PAIR):
                inner = factor.args[0]
                if limits:
                    inner = inner.subs({R_NORM: 1, R_CROSS: 0})
                parts = [_linear_expectation_monomial(mono, head)
                         for mono in sp.Add.make_args(sp.expand(inner))]
                rest.append(sp.Add(*parts))
            else:
                coeff *= factor
        out.append(coeff * sp.Mul(*rest))
    return sp.expand(sp.Add(*out))


def _linear_expectation_monomial(mono: sp.Expr, head) -> sp.Expr:
    if mono == 0:
        return sp.Integer(0)
    fixed, random = sp.Integer(1), sp.Integer(1)
    for factor in sp.Mul.make_args(mono):
        if _is_random(factor):
            random *= factor
        else:
            fixed *= factor
    return fixed * head(random)


@dataclass(frozen=True)
class Drift:
    """The drift of the order parameters for generic units (:data:`UNITS` ``k, l, m``).

    Attributes
    ----------
    dQ, drho : Expr
        ``dQ_kl/dt`` and ``dρ_km/dt`` in ``Qf``, ``RHOf``, ``Af``, the parameter
        symbols and expectations ``E[monomial of g, h, λ, ν]``.
    da : Expr or None
        ``da_k/dt`` (trained readout only).
    """

    dQ: sp.Expr
    drho: sp.Expr
    da: sp.Expr | None

    def at(self, k, l, m):
        """``(dQ_kl, dρ_km, da_k)`` at concrete units (integers or symbols)."""
        K, L, M = UNITS
        sub = {K: k, L: l, M: m}
        return (self.dQ.xreplace(sub), self.drho.xreplace(sub),
                None if self.da is None else self.da.xreplace(sub))


@lru_cache(maxsize=8)
def _drift(probe: Model) -> Drift:
    k, l, m = UNITS
    q_new, rho_new, a_new = step_map(probe, k, l, m)
    for value, old in ((q_new, Qf(k, l)), (rho_new, RHOf(k, m))):
        if sp.simplify(value.subs(EPS, 0) - old) != 0:  # pragma: no cover - algebra guard
            raise AssertionError("one step does not reduce to the identity as N -> oo")
    dQ = _linear_expectation(_first_order(q_new))
    drho = _linear_expectation(_first_order(rho_new))
    da = None if a_new is None else _linear_expectation(_first_order(a_new))
    return Drift(dQ, drho, da)


def switched_off(model: Model) -> dict:
    """The learning parameters at their "off" value (weight decay 0, batch size 1).

    Routes that print equations substitute these, so that a feature the model
    does not use leaves no term behind; those switched on stay symbols, like
    ``η`` and ``Δ``.
    """
    by_name = {sym.name: sym for sym in PARAMS}
    # only kernel parameters become symbols: an "off" value of another field (a structural
    # switch) has nothing to substitute
    return {by_name[f.metadata["param"]]: sp.Integer(f.metadata["off"])
            for f in spec.model_fields() if "off" in f.metadata and "param" in f.metadata
            and getattr(model, f.name) == f.metadata["off"]}


def drift(model: Model) -> Drift:
    """The drift of ``model``'s order parameters for generic units (see the module docstring).

    Depends on the model only through its stand-in (:meth:`symquad.Model.stand_in`:
    the constraint, whether the readout is trained, and every other field that is not
    a kernel parameter); everything else is a symbol or sits in the per-sample
    gradients.
    """
    return _drift(model.stand_in(1, 1))


@lru_cache(maxsize=8)
def _increments(probe: Model, batched: bool = False):
    k, l, m = UNITS
    q_new, rho_new, a_new = step_map(probe, k, l, m)
    unbatched = {} if batched else {BATCH: 1}

    def integrand(expr):
        first = _first_order(expr).subs(unbatched)
        # one sample: the batch mean is the sample itself (batched: the summand of
        # the batch mean; the pair terms carry r_× = O(N^-1/2) and drop out)
        return sp.expand(first.replace(MEAN, lambda f: f).replace(PAIR, lambda f: 0))
    return (integrand(q_new), integrand(rho_new),
            None if a_new is None else integrand(a_new))


def increments(model: Model, batched: bool = False):
    """Per-sample increments ``F = N ΔX`` of one sample (``b = 1``), before the expectation.

    Returns ``(F_Q(k,l), F_ρ(k,m), F_a(k) or None)`` in the per-sample symbols
    ``g, h, λ, ν, r``; ``dX/dt = E[F_X]`` with ``r → 1``.  A mini-batch of
    ``b`` samples averages ``b`` independent copies of the first-order part
    (:func:`drift` divides the ``η²`` term by ``b``).

    With ``batched=True`` the batch size stays the symbol ``b``
    (:data:`~symquad.symbolic.symbols.BATCH`) and the result is the summand
    ``φ`` of the step's first-order part ``N ΔX = Mean_μ[φ^μ] +
    (b−1)/b·PairMean[…]``: each term of ``∂X'/∂ε`` holds one batch mean, so
    the mean can be taken outside (``φ`` has ``η²/b`` where ``F`` has
    ``η²``); the pair term holds ``r_× = x^μ·x^ν/N = O(N^{-1/2})`` with mean
    ``O(1/N)`` and is dropped.  At ``b = 1`` it is ``F``.
    """
    return _increments(model.stand_in(1, 1), bool(batched))
