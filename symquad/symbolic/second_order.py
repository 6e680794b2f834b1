r"""The O(1/N) terms of one SGD step's mean, and the drift's second derivatives (entry route).

One step maps the state ``X`` (:class:`~symquad.numeric.layout.StateLayout`) to
``X' = X + Φ/N``.  :func:`symquad.symbolic.update.step_map` writes ``X'`` exactly
as a function of ``ε = 1/N``; the drift is the first Taylor coefficient's mean in
the limit ``r = |x|²/N → 1``, ``r_× = x^μ·x^ν/N → 0``.  Here the mean is kept to
the next order,

.. math::  E[Φ] = f + f_1/N + O(N^{-2}), \qquad
           f_1 = \underbrace{\partial_ε E[A_1]}_{|x|^2/N,\ x^μ·x^ν/N}
               + \underbrace{E[A_2]}_{\text{second order of the map}},

with ``X' = X + ε A_1 + ε² A_2 + O(ε³)`` (``A_1``, ``A_2`` random).  Two exact
Gaussian identities (``x ~ N(0, I_N)``, fields ``z = (λ, ν) = W̃x/√N`` of
covariance ``Ω = W̃W̃ᵀ/N = [[Q, ρ], [ρᵀ, T]]``, any ``N``) give the first part:

* **the norm** ``r = |x|²/N``: by Stein's lemma in ``R^N``,
  ``E[x_a² F] = E[F] + E[∂²F/∂x_a²]`` and ``Σ_a ∂²/∂x_a² = Σ_kl Ω_kl ∂_k∂_l / N``
  on functions of the fields, so

  .. math::  E[F(z)\,r] = E[F] + \frac1N E[\mathcal L F], \qquad
             \mathcal L = \sum_{kl} Ω_{kl}\,\partial_{z_k}\partial_{z_l}

  (equivalently ``x = x_∥ + x_⊥``, ``|x_∥|² = zᵀΩ⁻¹z``, ``|x_⊥|² ~ χ²_{N−n}``
  independent of ``z``, and ``E[g zᵀΩ⁻¹z] = n E[g] + tr(Ω E[∇∇ᵀg])``: the ``n``
  cancels against ``E[χ²_{N−n}] = N − n``; no inverse is needed);
* **the batch cross terms** ``r_× = x^μ·x^ν/N``, ``μ ≠ ν``, independent samples:
  ``E[F(z^μ) G(z^ν) x^μ·x^ν] = Σ_a E[F x_a] E[G x_a]`` and ``E[F x_a] =
  Σ_k E[∂_k F] W̃_ka/√N``, so

  .. math::  E[F(z^μ)\,G(z^ν)\,r_×] = \frac1N \sum_{kl} E[\partial_k F]\,Ω_{kl}\,E[\partial_l G].

The label noise ``ξ`` is not a field of ``x``: ``𝓛`` and ``∂`` act on ``λ, ν`` only.
The second part takes the mean of ``A_2`` in the limit: each batch mean comes
with one ``ε``, so ``A_2`` holds at most two of them, and for ``b`` independent
samples ``E[Mean X · Mean Y] = E[X]E[Y] + (E[XY] − E[X]E[Y])/b``; a pair mean in
``A_2`` has mean ``O(1/N)`` and drops.  What this contains, field by field:

* weight decay: ``(1 − ηλ/N)²`` gives ``η²λ² Q_kl`` and the cross term
  ``ηλ·η(E[g_k λ_l] + E[g_l λ_k])`` in ``f_1^Q``; ``ρ'`` and ``a'`` are *linear*
  in ``ε`` (``f_1^ρ`` from the constraint only, ``f_1^a = 0``: a trained
  readout's update has no ``1/N`` term);
* the batch: the ``|x|²/N`` term is ``(η²/b) E[𝓛(g_k g_l)]``, the cross term
  ``η²(b−1)/b · E[∇g_k]ᵀ Ω E[∇g_l]``;
* the sphere: ``√(Q_kk/Q̃'_kk)`` to second order in ``ε``, with the products of
  batch means above (and ``f_1`` of ``Q_kk`` vanishes: the norm is exact).

Everything is derived for generic units once (:func:`mean_correction_expressions`)
and evaluated entry by entry by Wick's theorem like the drift
(:mod:`symquad.symbolic.entries`); :func:`second_order_polynomials` converts
``f_1`` and the drift's exact second derivatives ``∂²f_I/∂X_J∂X_K`` (for the
curvature term ``½ ∂²f : Σ`` of the mean) to sparse polynomials, which
:func:`symquad.codegen.diffusion_render.render_second_order_entries_module`
renders into a cached kernel module (beside the Jacobian's).
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from ..spec import Model
from .symbols import BATCH, overlap_symbols
from .update import (EPS, MEAN, PAIR, R_CROSS, R_NORM, UNITS, E, _is_random, drift, step_map)

__all__ = ["ELAP", "ECROSS", "MeanCorrection", "mean_correction_expressions",
           "mean_correction_entries", "second_order_polynomials", "second_order_estimate",
           "check_second_order_size", "SECOND_ORDER_AUTO_SECONDS", "SECOND_ORDER_REFUSE_SECONDS"]

# the cost law lives beside the specification, so that deciding costs no SymPy import
from ..second_order_cost import (SECOND_ORDER_AUTO_SECONDS, SECOND_ORDER_REFUSE_SECONDS,  # noqa: E402
                                 second_order_estimate)
from .entries import _ExplicitExpectations
from .entries import _explicit_state
from .entries import _structure, check_entry_route_size
from ..numeric.layout import state_layout
from .entries import derive_entries
from .jacobian import _Ring, _terms
from .symbols import readout_symbols


def check_second_order_size(model: Model) -> None:
    """Refuse (ValueError) or warn (RuntimeWarning) before a long second-order derivation."""
    import warnings
    estimate = second_order_estimate(model)
    text = (f"the O(1/N) mean correction (f1 and the drift's dim^3 second derivatives) for "
            f"p={model.p}, p_star={model.p_star}, activation {model.activation_str!r} would "
            f"take about {estimate:.3g} s to derive")
    if estimate > SECOND_ORDER_REFUSE_SECONDS:
        raise ValueError(f"{text} (> {SECOND_ORDER_REFUSE_SECONDS:.0f} s allowed); use smaller "
                         "p, p_star or fluctuations(..., second_order=False)")
    if estimate > SECOND_ORDER_AUTO_SECONDS:
        warnings.warn(text + " (once per model structure; cached afterwards)", RuntimeWarning,
                      stacklevel=3)

#: ``E[𝓛 F]`` of one per-sample monomial ``F`` (``𝓛 = Σ Ω_kl ∂_k ∂_l`` on the fields).
ELAP = sp.Function("ELap")
#: ``Σ_kl E[∂_k F] Ω_kl E[∂_l G]`` of two per-sample factors of distinct samples.
ECROSS = sp.Function("ECross")


def _split_random(mono):
    """``(fixed, random)`` factors of one monomial."""
    fixed, random = sp.Integer(1), sp.Integer(1)
    for factor in sp.Mul.make_args(mono):
        if _is_random(factor):
            random *= factor
        else:
            fixed *= factor
    return fixed, random


def _norm_cross_correction(first: sp.Expr) -> sp.Expr:
    r"""``N (E[A_1] − E[A_1]|_{r→1, r_×→0})`` of the map's first Taylor coefficient.

    ``Mean[F r] → ELap(F)`` and ``PairMean[F G r_×] → ECross(F, G)`` (module
    docstring); the terms without ``r`` or ``r_×`` have no ``1/N`` part.
    """
    out = []
    for term in sp.Add.make_args(sp.expand(first)):
        coeff, heads = sp.Integer(1), []
        for factor in sp.Mul.make_args(term):
            if factor.func in (MEAN, PAIR):
                heads.append(factor)
            else:
                coeff *= factor
        if not heads:
            continue
        if len(heads) != 1:  # pragma: no cover - the first order is linear in the batch means
            raise AssertionError(f"a first-order term with {len(heads)} batch means: {term}")
        head = heads[0]
        parts = []
        for mono in sp.Add.make_args(sp.expand(head.args[0])):
            fixed, random = _split_random(mono)
            if head.func == MEAN:
                power = sp.degree(random, R_NORM) if random.has(R_NORM) else 0
                if power == 0:
                    continue
                if power != 1:  # pragma: no cover
                    raise AssertionError(f"|x|^2/N to the power {power}")
                parts.append(fixed * ELAP(random.subs(R_NORM, 1)))
            else:
                factors = []
                for f in sp.Mul.make_args(random.subs(R_CROSS, 1)):
                    base, power = f.as_base_exp()
                    factors += [base] * int(power)
                if len(factors) != 2 or not random.has(R_CROSS):  # pragma: no cover
                    raise AssertionError(f"a pair term that is not g_k^mu g_l^nu r_x: {mono}")
                parts.append(fixed * ECROSS(*sorted(factors, key=sp.default_sort_key)))
        out.append(coeff * sp.Add(*parts))
    return sp.expand(sp.Add(*out))


def _second_order_mean(second: sp.Expr) -> sp.Expr:
    r"""``E[A_2]`` in the limit: products of at most two batch means of ``b`` samples.

    ``E[Mean X] = E[X]``, ``E[Mean X · Mean Y] = (1 − 1/b) E[X] E[Y] + E[XY]/b``
    (``X``, ``Y`` of one sample, then of independent ones); terms with a pair mean
    have mean ``O(1/N)`` here and drop; ``r → 1``.
    """
    out = []
    for term in sp.Add.make_args(sp.expand(second)):
        coeff, heads = sp.Integer(1), []
        for factor in sp.Mul.make_args(term):
            base, power = factor.as_base_exp()
            if getattr(base, "func", None) in (MEAN, PAIR):
                heads += [base] * int(power)
            else:
                coeff *= factor
        if any(h.func == PAIR for h in heads):
            continue
        inner = [sp.expand(h.args[0].subs(R_NORM, 1)) for h in heads]
        if len(inner) == 0:
            out.append(coeff)
        elif len(inner) == 1:
            out.append(coeff * _expect_linear(inner[0]))
        elif len(inner) == 2:
            x, y = inner
            out.append(coeff * ((1 - 1 / BATCH) * _expect_linear(x) * _expect_linear(y)
                                + _expect_linear(sp.expand(x * y)) / BATCH))
        else:  # pragma: no cover - every batch mean carries one epsilon
            raise AssertionError(f"{len(inner)} batch means at second order")
    return sp.expand(sp.Add(*out))


def _expect_linear(inner: sp.Expr) -> sp.Expr:
    """``E[·]`` of a sum of per-sample monomials (fixed factors pulled out)."""
    parts = []
    for mono in sp.Add.make_args(sp.expand(inner)):
        fixed, random = _split_random(mono)
        parts.append(fixed * (E(random) if random != 1 else 1))
    return sp.Add(*parts)


class MeanCorrection:
    """``f_1`` of ``Q_kl``, ``ρ_km`` and ``a_k`` for generic units (:data:`UNITS`).

    Attributes
    ----------
    dQ, drho : Expr
        In ``Qf``, ``RHOf``, ``Af``, the parameters and the heads ``E``, ``ELAP``, ``ECROSS``.
    da : Expr or None
        Trained readout only (identically zero: ``a'`` is linear in ``1/N``).
    """

    def __init__(self, dQ, drho, da):
        self.dQ, self.drho, self.da = dQ, drho, da

    def at(self, k, l, m):
        K, L, M = UNITS
        sub = {K: k, L: l, M: m}
        return (self.dQ.xreplace(sub), self.drho.xreplace(sub),
                None if self.da is None else self.da.xreplace(sub))


@lru_cache(maxsize=8)
def _mean_correction(constraint: str, trained: bool) -> MeanCorrection:
    probe = Model(1, 1, 1.0, constraint=constraint, lr_readout=1.0 if trained else 0.0)
    k, l, m = UNITS
    exact = step_map(probe, k, l, m)
    reference = drift(probe)
    out = []
    for value, lead in zip(exact, (reference.dQ, reference.drho, reference.da)):
        if value is None:
            out.append(None)
            continue
        first = sp.expand(sp.diff(value, EPS).subs(EPS, 0))
        second = sp.expand(sp.diff(value, EPS, 2).subs(EPS, 0) / 2)
        out.append(sp.expand(_norm_cross_correction(first) + _second_order_mean(second)))
    return MeanCorrection(*out)


def mean_correction_expressions(model: Model) -> MeanCorrection:
    """``f_1`` for generic units (module docstring); depends on the constraint and readout only."""
    return _mean_correction(model.constraint, model.readout_trained)


class _EntryHeads:
    """Entry-route values of ``E``, ``ELAP`` and ``ECROSS`` for the explicit network."""

    def __init__(self, model: Model):
        self.expect = _ExplicitExpectations(model)
        net = self.expect.net
        Q, rho, T = overlap_symbols(model.p, model.p_star)
        self.fields = tuple(net.lam) + tuple(net.nu)
        self.omega = sp.Matrix(sp.BlockMatrix([[Q, rho], [rho.T, T]]))
        self.memo = {}

    def explicit(self, mono):
        values = self.expect.values
        return sp.expand(mono.replace(lambda e: e.func in values,
                                      lambda e: values[e.func](int(e.args[0]))))

    def laplacian(self, mono):
        key = ("lap", mono)
        if key not in self.memo:
            P = self.explicit(mono)
            z, W = self.fields, self.omega
            grad = [sp.diff(P, zk) for zk in z]
            L = sp.Add(*[W[i, j] * sp.diff(grad[i], z[j]) for i in range(len(z))
                         for j in range(len(z)) if W[i, j] != 0])
            self.memo[key] = self.expect.fields.expectation(sp.expand(L))
        return self.memo[key]

    def mean_gradient(self, factor):
        key = ("grad", factor)
        if key not in self.memo:
            P = self.explicit(factor)
            self.memo[key] = [self.expect.fields.expectation(sp.diff(P, zk)) for zk in self.fields]
        return self.memo[key]

    def cross(self, u, v):
        gu, gv, W = self.mean_gradient(u), self.mean_gradient(v), self.omega
        n = len(self.fields)
        return sp.expand(sp.Add(*[gu[i] * W[i, j] * gv[j] for i in range(n) for j in range(n)]))

    def __call__(self, expr):
        expr = expr.replace(lambda e: e.func == ELAP, lambda e: self.laplacian(e.args[0]))
        expr = expr.replace(lambda e: e.func == ECROSS, lambda e: self.cross(*e.args))
        return expr.replace(lambda e: e.func == E, lambda e: self.expect(e.args[0]))


@lru_cache(maxsize=16)
def _mean_correction_entries(model: Model):
    heads = _EntryHeads(model)
    state = _explicit_state(model)
    corr = mean_correction_expressions(model)
    p, k = model.p, model.p_star
    dQ, drho = sp.zeros(p, p), sp.zeros(p, k)
    da = sp.zeros(p, 1) if corr.da is not None else None

    def evaluate(expr):
        return sp.expand(heads(expr).xreplace(state))
    for i in range(1, p + 1):
        for j in range(i, p + 1):
            dQ[i - 1, j - 1] = dQ[j - 1, i - 1] = evaluate(corr.at(i, j, 1)[0])
        for m in range(1, k + 1):
            drho[i - 1, m - 1] = evaluate(corr.at(i, i, m)[1])
        if da is not None:
            da[i - 1, 0] = evaluate(corr.at(i, i, 1)[2])
    return dQ, drho, da


def mean_correction_entries(model: Model):
    """``(f1_Q, f1_ρ, f1_a)``: explicit SymPy matrices in the entry symbols (cached per structure)."""
    check_entry_route_size(model)
    return _mean_correction_entries(_structure(model))


def second_order_polynomials(model: Model):
    """``(generators, f1, hess)`` as sparse polynomials (entry route, exact).

    ``f1`` has ``dim`` polynomials (state order), ``hess`` ``dim³``:
    ``∂²f_I/∂X_J∂X_K`` at index ``(I·dim + J)·dim + K``.  The generators are the
    Jacobian's (:mod:`symquad.symbolic.jacobian`: entry symbols, readouts,
    parameters, ``1/b``, ``1/Q_kk``).
    """
    check_entry_route_size(model)
    check_second_order_size(model)
    return _second_order_polynomials(_structure(model))


@lru_cache(maxsize=16)
def _second_order_polynomials(model: Model):
    _, dQ, drho, da = derive_entries(model)
    cQ, crho, ca = _mean_correction_entries(model)
    ring = _Ring(model)
    Q, rho, _ = overlap_symbols(model.p, model.p_star)
    a, _ = readout_symbols(model.p, model.p_star)
    layout = state_layout(model)
    drift_, corr, state = [], [], []
    for block, i, j in layout.entries:
        if block == "Q":
            drift_.append(dQ[i, j]), corr.append(cQ[i, j]), state.append(Q[i, j])
        elif block == "rho":
            drift_.append(drho[i, j]), corr.append(crho[i, j]), state.append(rho[i, j])
        else:
            drift_.append(da[i, 0]), corr.append(ca[i, 0]), state.append(a[i])
    f1 = [_terms(ring.convert(sp.expand(c))) for c in corr]
    hess = []
    for f in drift_:
        element = ring.convert(sp.expand(f))
        for x in state:
            first = ring.derivative(element, x)
            hess += [_terms(ring.derivative(first, y)) for y in state]
    return [str(g) for g in ring.gens], f1, hess
