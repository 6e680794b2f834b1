r"""The drift in moment form: what the matrix and tensor routes must evaluate.

The drift of :func:`symquad.symbolic.update.drift` holds expectations of
per-sample gradients, ``E[g_k λ_l]``, ``E[g_k g_l]``, ``E[g_k ν_m]``,
``E[h_k]``.  The abstract network (:func:`symquad.symbolic.network.abstract_network`)
writes the gradients in factored form, ``g_k = a_k σ'(λ_k) δ`` and
``h_k = σ(λ_k) δ`` with ``δ = ŷ − y``.  Substituting them and pulling the
readout factors out of the expectations leaves a small set of *moment kinds*,
expectations of local factors times a power of the error:

=======  =============================  ==========  ==========================
kind     expectation                    shape       tensor form (n = p + p*)
=======  =============================  ==========  ==========================
``G``    ``E[σ'(λ_k) λ_l δ]``           (p, p)      ``Σ_a w_a I_3(k, l, a)``
``Gt``   ``E[σ'(λ_k) ν_m δ]``           (p, p*)     ``Σ_a w_a I_3(k, p+m, a)``
``B``    ``E[σ'(λ_k) σ'(λ_l) δ²]``      (p, p)      ``Σ_ab w_a w_b I_4(k,l,a,b) + Δ J_2(k,l)``
``R``    ``E[σ(λ_k) δ]``                (p,)        ``Σ_a w_a I_2(k, a)``
=======  =============================  ==========  ==========================

with output weights ``w = (a_1..a_p, −b_1..−b_p*)``.  Each route implements an
evaluator per kind (:mod:`symquad.codegen`), never the sum: the sum is
:func:`moment_drift`, rendered into the kernels by
:mod:`symquad.codegen.assembly`.  A model whose update needs an expectation of
another shape (a new loss, say) raises :class:`NotImplementedError` naming it:
the matrix and tensor routes then refuse the model rather than compute
another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

from ..spec import Model
from .network import ERROR, SIGMA, abstract_network
from .update import Af, E, G, H, LAM, NU, UNITS, drift

__all__ = ["MomentDrift", "moment_drift", "MOMENT_KINDS", "MG", "MGT", "MB", "MR",
           "DSIG", "SIG"]

#: Local factors of the factored gradients: ``σ'(λ_u)`` and ``σ(λ_u)``.
DSIG = sp.Function("dsigma")
SIG = sp.Function("sigma_f")
#: The moment kinds (see the module docstring).
MG = sp.Function("G")
MGT = sp.Function("Gt")
MB = sp.Function("B")
MR = sp.Function("R")
MOMENT_KINDS = {"G": MG, "Gt": MGT, "B": MB, "R": MR}


def _generic_gradients(model: Model):
    """``g(u)`` and ``h(u)`` of the abstract network for a generic unit ``u``.

    Read off unit 1 of the model's abstract network and checked, for every
    other unit, to be the same expression with the unit renamed (the model is
    the same for every unit: nothing else would be a per-unit definition).
    """
    net = abstract_network(model)
    u = sp.Dummy("u", integer=True, positive=True)

    def generic(expr, i):
        lam = net.lam[i]
        return (expr.replace(sp.Derivative(SIGMA(lam), lam), DSIG(u))
                .replace(SIGMA(lam), SIG(u)).xreplace({net.readout[i]: Af(u)}))

    forms = []
    for gradients in (net.grad, net.readout_grad):
        form = generic(gradients[0], 0)
        for i in range(1, model.p):
            if generic(gradients[i], i) != form:  # pragma: no cover - algebra guard
                raise AssertionError("the per-sample gradient differs between units")
        forms.append(sp.Lambda(u, form))
    return forms


def _classify(random: sp.Expr) -> sp.Expr:
    """The moment kind of a random monomial (local factors × power of δ)."""
    counts = {}
    for factor in sp.Mul.make_args(random):
        base, power = factor.as_base_exp()
        counts.setdefault(base.func if base != ERROR else ERROR, []).extend(
            [base.args[0] if base != ERROR else None] * int(power))
    ds, lam, nu = counts.pop(DSIG, []), counts.pop(LAM, []), counts.pop(NU, [])
    sig, err = counts.pop(SIG, []), len(counts.pop(ERROR, []))
    if not counts:
        if len(ds) == 1 and len(lam) == 1 and not nu and not sig and err == 1:
            return MG(ds[0], lam[0])
        if len(ds) == 1 and len(nu) == 1 and not lam and not sig and err == 1:
            return MGT(ds[0], nu[0])
        if len(ds) == 2 and not (lam or nu or sig) and err == 2:
            return MB(*ds)
        if len(sig) == 1 and not (ds or lam or nu) and err == 1:
            return MR(sig[0])
    raise NotImplementedError(
        f"the matrix and tensor routes have no evaluator for the expectation E[{random}]; "
        "add a moment kind to symquad.symbolic.moments and its evaluators, or use "
        "form='entries'")


def _is_random(factor) -> bool:
    return factor.has(DSIG, SIG, LAM, NU, ERROR)


def _to_moments(expr: sp.Expr, g, h) -> sp.Expr:
    def expand_expectation(monomial):
        inner = sp.expand(monomial.replace(G, g).replace(H, h))
        out = []
        for term in sp.Add.make_args(inner):
            fixed = sp.Mul(*[f for f in sp.Mul.make_args(term) if not _is_random(f)])
            random = sp.Mul(*[f for f in sp.Mul.make_args(term) if _is_random(f)])
            out.append(fixed * _classify(random))
        return sp.Add(*out)
    return sp.expand(expr.replace(lambda e: e.func == E, lambda e: expand_expectation(e.args[0])))


@dataclass(frozen=True)
class MomentDrift:
    """The drift for generic units ``k, l`` (students) and ``m`` (teacher) in moment form.

    Attributes
    ----------
    dQ, drho, da : Expr
        In the state symbols (``Qf``, ``RHOf``, ``Af`` of
        :mod:`symquad.symbolic.update`), the parameters and the moment kinds
        ``G(k, l)``, ``Gt(k, m)``, ``B(k, l)``, ``R(k)`` (``da`` is None for a
        fixed readout).
    """

    dQ: sp.Expr
    drho: sp.Expr
    da: sp.Expr | None

    def kinds(self) -> set:
        """Names of the moment kinds the drift uses."""
        exprs = [e for e in (self.dQ, self.drho, self.da) if e is not None]
        return {name for name, f in MOMENT_KINDS.items() if any(e.has(f) for e in exprs)}


@lru_cache(maxsize=8)
def _moment_drift(model: Model) -> MomentDrift:
    g, h = _generic_gradients(model)
    d = drift(model)
    return MomentDrift(_to_moments(d.dQ, g, h), _to_moments(d.drho, g, h),
                       None if d.da is None else _to_moments(d.da, g, h))


def moment_drift(model: Model) -> MomentDrift:
    """The drift of ``model`` in moment form (see the module docstring).

    Raises
    ------
    NotImplementedError
        If the update needs an expectation that is not one of :data:`MOMENT_KINDS`.
    """
    return _moment_drift(model.stand_in())


# the generic units, re-exported for the code generator
K, L, M = UNITS
