r"""The diffusion matrix of the order parameters: the covariance of the per-sample increments.

One SGD step of a mini-batch of ``b`` samples changes every order parameter
``X`` (the upper triangle of ``Q``, ``ρ`` and a trained readout ``a``) by

.. math::  ΔX = \frac1N\,\mathrm{Mean}_{μ=1..b}\big[φ_X(ξ^μ)\big] + O(N^{-3/2}),

with ``φ_X`` the summand of the first-order part of the update
(:func:`symquad.symbolic.update.increments` with ``batched=True``: the one
per-sample definition, from the update rule; ``φ`` has ``η²/b`` where the
single-sample increment ``F`` has ``η²``) and ``ξ^μ = (λ^μ, ν^μ, label noise)``
independent Gaussian samples of covariance ``[[Q, ρ], [ρᵀ, T]]``.  The drift is
``f_X = E[φ_X]``.  Over a unit of time there are ``N`` steps, each of
covariance ``N^{-2} Cov[Mean φ] = N^{-2} Cov[φ]/b``, so

.. math::  D_{XY} = \frac1b\,\big(E[φ_X φ_Y] − E[φ_X]\,E[φ_Y]\big), \qquad
           dX = f\,dt + \sqrt{D/N}\;dB .

The ``η²`` part of ``φ`` is itself ``O(1/b)``: in ``D`` the ``η²``-, ``η³``-
and ``η⁴``-terms scale like ``1/b``, ``1/b²`` and ``1/b³``.  The pair terms of
the batch (``x^μ·x^ν/N``, ``μ ≠ ν``) and the fluctuation of ``|x|²/N`` are
``O(N^{-1/2})``: they enter ``D`` at ``O(1/N)`` and are dropped (``r → 1``).
On the sphere ``φ`` is already projected to first order
(``φ_{Q_kl} ← φ_kl − ½Q_kl(φ_kk/Q_kk + φ_ll/Q_ll)``, the same projection as the
drift), so the rows of ``D`` for ``Q_kk`` vanish; deterministic terms (weight
decay) drop out of the covariance.

This module writes the covariance for generic units — ``(k, l, m)`` for ``X``
and ``(K, L, M)`` for ``Y`` — once (:func:`covariance_expressions`), and
evaluates it by two routes:

* **entries** (:func:`diffusion_entries`): every expectation taken of the
  explicit network by Wick's theorem, entry by entry (the small-``p``
  reference);
* **moment kinds** (:func:`moment_diffusion`): with ``g_k = a_k σ'(λ_k) δ``,
  ``h_k = σ(λ_k) δ`` every expectation is a *kind*
  ``M_{d,x,s}(i_1..i_d; j_1..j_x; k_1..k_s) = E[∏σ'(λ_i) ∏u_j ∏σ(λ_k)\,δ^{d+s}]``
  (``u_j`` any field, ``λ`` or ``ν``); the tensor and matrix routes evaluate
  the kinds (:mod:`symquad.symbolic.tensor_diffusion`,
  :mod:`symquad.symbolic.quadforms`) and the generated assembly combines them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

from ..spec import Model
from .symbols import BATCH, NOISE, PARAMS, XI, overlap_symbols, readout_symbols
from .update import E, G, H, LAM, NU, R_NORM, UNITS, Af, Qf, RHOf, increments
from .wick import RingGaussianFields, to_ring
from .entries import _structure
from .network import network
from ..numeric.layout import state_layout
from .moments import DSIG, SIG, _generic_gradients
from .network import ERROR

__all__ = ["UNITS_Y", "BLOCK_PAIRS", "per_sample", "covariance_expressions",
           "diffusion_entries", "moment_diffusion", "MomentDiffusion", "kind_name",
           "TEACHER_FIELD", "parse_kind", "used_kinds", "diffusion_polynomials", "entry_diffusion_estimate", "check_entry_diffusion_size"]

#: Units of the second entry ``Y`` of ``D_XY`` (students ``K, L``, teacher ``M``).
UNITS_Y = tuple(sp.Symbol(name, integer=True, positive=True) for name in ("K", "L", "M"))
#: Block pairs of ``D`` computed (the others are transposes), in state order.
BLOCK_PAIRS = (("Q", "Q"), ("Q", "rho"), ("Q", "a"), ("rho", "rho"), ("rho", "a"), ("a", "a"))
#: Marks a teacher field ``ν_m`` among the field arguments of a moment kind.
TEACHER_FIELD = sp.Function("tfield")

_RANDOM = (G, H, LAM, NU)


def per_sample(model: Model):
    """``(φ_Q(k,l), φ_ρ(k,m), φ_a(k) or None)``: the summand of one step's increment (``r → 1``)."""
    phis = increments(model, batched=True)
    return tuple(None if f is None else sp.expand(f.subs(R_NORM, 1)) for f in phis)


def _split(expr):
    """``[(coefficient, random monomial)]`` of an expanded expression (deterministic terms dropped)."""
    out = []
    for term in sp.Add.make_args(sp.expand(expr)):
        fixed, random = sp.Integer(1), sp.Integer(1)
        for factor in sp.Mul.make_args(term):
            if factor.has(*_RANDOM):
                random *= factor
            else:
                fixed *= factor
        if random != 1:
            out.append((fixed, random))
    return out


def _rename(expr):
    k, l, m = UNITS
    K, L, M = UNITS_Y
    return expr.xreplace({k: K, l: L, m: M})


@lru_cache(maxsize=8)
def _covariances(model: Model):
    phis = dict(zip(("Q", "rho", "a"), per_sample(model)))
    out = {}
    for x, y in BLOCK_PAIRS:
        if phis[x] is None or phis[y] is None:
            continue
        terms = []
        for cx, rx in _split(phis[x]):
            for cy, ry in _split(_rename(phis[y])):
                terms.append(cx * cy * (E(rx * ry) - E(rx) * E(ry)))
        out[(x, y)] = sp.Add(*terms) / BATCH
    return tuple(out.items())


def covariance_expressions(model: Model) -> dict:
    """``{(X, Y): D_XY}`` for generic units: ``X`` in ``(k, l, m)``, ``Y`` in ``(K, L, M)``.

    ``X, Y`` are block names (``"Q"`` for ``Q_kl``, ``"rho"`` for ``ρ_km``,
    ``"a"`` for ``a_k``); the expressions hold the state (``Qf``, ``RHOf``,
    ``Af``), the parameters and expectations ``E[…]`` of per-sample monomials.
    Depends on the model through its stand-in only (:meth:`symquad.Model.stand_in`:
    the constraint, the trained readout and any other field that is not a kernel
    parameter).
    """
    return dict(_covariances(model.stand_in()))


# ---- the entry route ----------------------------------------------------------------

def _entry_units(block, i, j, units):
    """``{unit symbol: 1-based integer}`` of a state entry ``(block, i, j)`` (0-based)."""
    k, l, m = units
    if block == "Q":
        return {k: i + 1, l: j + 1}
    if block == "rho":
        return {k: i + 1, m: j + 1}
    return {k: i + 1}


def entry_diffusion_estimate(model: Model) -> float:
    """Rough derivation time (s, 2-core machine) of :func:`diffusion_entries`.

    Measured on the shared 2-core development machine: ``σ = z²`` took 1.3 s at
    ``(p, p*) = (2, 1)``, 5.9 s at ``(2, 2)``, 26 s at ``(3, 2)``; ``z³ − 3z``
    14 s at ``(2, 1)``.  With ``E = dim(dim+1)/2`` entries of ``D`` and
    ``n = p + p*`` fields, ``t ≈ 6·10⁻³ · 10^{deg − 2} · E · n^{2.5}``
    (``deg`` the larger activation degree, at least 2).
    """
    p, k = model.p, model.p_star
    dim = p * (p + 1) // 2 + p * k + (p if model.readout_trained else 0)
    deg = max(model.degree, model.teacher_degree, 2)
    return 6e-3 * 10.0 ** (deg - 2) * dim * (dim + 1) / 2 * (p + k) ** 2.5


#: The entry route of the diffusion warns above this estimated time (s) and refuses above
#: the second.
ENTRY_DIFFUSION_WARN_SECONDS = 60.0
ENTRY_DIFFUSION_REFUSE_SECONDS = 3600.0


def check_entry_diffusion_size(model: Model) -> None:
    """Refuse (ValueError) or warn (RuntimeWarning) before a long entry-route derivation of D."""
    import warnings
    estimate = entry_diffusion_estimate(model)
    text = (f"the entry-by-entry diffusion matrix for p={model.p}, p_star={model.p_star}, "
            f"activation {model.activation_str!r} would take about {estimate:.3g} s")
    if estimate > ENTRY_DIFFUSION_REFUSE_SECONDS:
        raise ValueError(f"{text} (> {ENTRY_DIFFUSION_REFUSE_SECONDS:.0f} s allowed); use "
                         "form='tensor' or, for quadratic activations, form='matrix'")
    if estimate > ENTRY_DIFFUSION_WARN_SECONDS:
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def diffusion_entries(model: Model) -> sp.Matrix:
    """``D`` (dim × dim, state order of :class:`~symquad.numeric.layout.StateLayout`), entry by entry.

    Explicit SymPy in the entry symbols ``Q_i_j``, ``rho_i_m``, ``T_l_m``, the
    readout symbols ``a_i``, ``b_m`` and the parameters (``η``, ``Δ``, ``b``,
    ``η_a``); every expectation is taken of the explicit network of
    :func:`symquad.symbolic.network.network` by Wick's theorem.  Only the
    model's structure matters (cached per structure); the size is checked
    first (:func:`check_entry_diffusion_size`).
    """
    check_entry_diffusion_size(model)
    return _diffusion_entries(_structure(model))


class _RingEntries:
    """The entry route's arithmetic in a sparse polynomial ring (fast, exact).

    Generators: the entry symbols of ``Q, ρ, T``, the readouts, the parameters,
    ``1/b`` and ``1/Q_kk`` (the sphere's projection divides by them), ``√Δ``
    and the random fields ``λ, ν, ξ``; the expectation is the Isserlis
    recursion of :class:`~symquad.symbolic.wick.RingGaussianFields`.
    """

    def __init__(self, model: Model):
        from sympy.polys.rings import ring
        p, k = model.p, model.p_star
        Q, rho, T = overlap_symbols(p, k)
        a, b = readout_symbols(p, k)
        net = network(model)
        self.sqrt_noise = sp.Symbol("sqrt_Delta", positive=True)
        self.inv_batch = sp.Symbol("inv_batch_size", positive=True)
        self.inv_q = [sp.Symbol(f"inv_Q_{i + 1}_{i + 1}", positive=True) for i in range(p)]
        overlaps = sorted(Q.free_symbols | rho.free_symbols | T.free_symbols,
                          key=sp.default_sort_key)
        randoms = list(net.lam) + list(net.nu) + [XI]
        gens = (overlaps + list(a) + list(b) + list(PARAMS) + [self.inv_batch] + self.inv_q
                + [self.sqrt_noise] + randoms)
        self.R, *elements = ring(gens, sp.QQ)
        self.gen = dict(zip(gens, elements))
        C = sp.Matrix(sp.BlockMatrix([[Q, rho], [rho.T, T]]))
        n = p + k
        cov = [[self.R.from_expr(C[i, j]) for j in range(n)] + [self.R.zero] for i in range(n)]
        cov.append([self.R.zero] * n + [self.R.one])
        self.fields = RingGaussianFields(self.R, [self.gen[r] for r in randoms], cov)
        to_ring = {sp.sqrt(NOISE): self.sqrt_noise}
        self.values = {
            G: [self.R.from_expr(g.xreplace(to_ring)) for g in net.grad],
            H: [self.R.from_expr(h.xreplace(to_ring)) for h in net.readout_grad],
            LAM: [self.gen[x] for x in net.lam], NU: [self.gen[x] for x in net.nu]}
        self.state = {}
        for i in range(p):
            for j in range(i, p):
                self.state[Qf(i + 1, j + 1)] = self.gen[Q[i, j]]
            for m in range(k):
                self.state[RHOf(i + 1, m + 1)] = self.gen[rho[i, m]]
            self.state[Af(i + 1)] = self.gen[a[i]]
        self.inverse = {BATCH: self.gen[self.inv_batch]}
        self.inverse.update({Qf(i + 1, i + 1): self.gen[self.inv_q[i]] for i in range(p)})
        back = {self.inv_batch: 1 / BATCH, self.sqrt_noise: sp.sqrt(NOISE)}
        back.update({self.inv_q[i]: 1 / Q[i, i] for i in range(p)})
        self.back = [back.get(g, g) for g in gens]
        self.memo = {}

    def expectation(self, monomial):
        if monomial not in self.memo:
            value = self.R.one
            for factor in sp.Mul.make_args(monomial):
                base, exp = factor.as_base_exp()
                value *= self.values[base.func][int(base.args[0]) - 1] ** int(exp)
            self.memo[monomial] = self.fields.expectation(value)
        return self.memo[monomial]

    def convert(self, expr):
        """A covariance expression at concrete units as a ring element."""
        return to_ring(expr, self.R, self.inverse, self._leaf)

    def _leaf(self, expr):
        if expr.func == E:
            return self.expectation(expr.args[0])
        if expr in self.state:
            return self.state[expr]
        return self.gen[expr]

    def to_expr(self, element):
        # a sum of monomials already: the generators are mapped back, nothing to expand
        return element.as_expr(*self.back)


@lru_cache(maxsize=16)
def _diffusion_ring(model: Model):
    """``(engine, {(I, J): ring element})`` of ``D`` over the upper triangle (state order)."""
    engine = _RingEntries(model)
    cov = covariance_expressions(model)
    entries = state_layout(model).entries
    order = {"Q": 0, "rho": 1, "a": 2}
    out = {}
    for I, (bx, i, j) in enumerate(entries):
        for J in range(I, len(entries)):
            by, i2, j2 = entries[J]
            if order[bx] <= order[by]:      # stored as (X, Y) with X in units k, l, m
                key, ux, uy = (bx, by), _entry_units(bx, i, j, UNITS), \
                    _entry_units(by, i2, j2, UNITS_Y)
            else:
                key, ux, uy = (by, bx), _entry_units(bx, i, j, UNITS_Y), \
                    _entry_units(by, i2, j2, UNITS)
            out[(I, J)] = engine.convert(cov[key].xreplace({**ux, **uy}))
    return engine, out


def diffusion_polynomials(model: Model):
    """The entry route's ``D`` as sparse polynomials (what the entry kernels evaluate).

    Returns ``(generators, entries)``: the names of the polynomial ring's
    generators (entry symbols, readouts, parameters, ``inv_batch_size = 1/b``,
    ``inv_Q_k_k = 1/Q_kk``, ``sqrt_Delta = √Δ``) and ``{(I, J): [(numerator,
    denominator, exponents), ...]}`` over the upper triangle ``I <= J``.
    The size is checked first (:func:`check_entry_diffusion_size`).
    """
    check_entry_diffusion_size(model)
    engine, ring_entries = _diffusion_ring(_structure(model))
    randoms = len(engine.fields.fields)
    gens = [str(g) for g in engine.R.symbols][:-randoms]
    out = {}
    for key, element in ring_entries.items():
        terms = []
        for monom, coeff in sorted(element.terms()):
            if any(monom[-randoms:]):  # pragma: no cover - the expectation removed them
                raise AssertionError("a random field survived the expectation")
            terms.append((int(coeff.numerator), int(coeff.denominator), monom[:-randoms]))
        out[key] = terms
    return gens, out


@lru_cache(maxsize=16)
def _diffusion_entries(model: Model) -> sp.Matrix:
    engine, ring_entries = _diffusion_ring(model)
    dim = state_layout(model).dim
    D = sp.zeros(dim, dim)
    for (I, J), element in ring_entries.items():
        D[I, J] = D[J, I] = engine.to_expr(element)
    return D


# ---- moment kinds -------------------------------------------------------------------

def kind_name(nd: int, nx: int, ns: int) -> str:
    """Name ``M<d><x><s>`` of the kind ``E[∏_d σ'(λ) ∏_x u ∏_s σ(λ) δ^{d+s}]``."""
    return f"M{nd}{nx}{ns}"


def parse_kind(name: str) -> tuple:
    """``(nd, nx, ns)`` of a kind name (inverse of :func:`kind_name`)."""
    return tuple(int(c) for c in name[1:])


@lru_cache(maxsize=None)
def _kind_function(name: str):
    return sp.Function(name)


def _classify(random, dsig, sig, error):
    """The kind of a monomial of local factors ``σ'(λ_i)``, ``λ_j``, ``ν_m``, ``σ(λ_k)``, ``δ^r``."""
    ds, xs, ss, power = [], [], [], 0
    for factor in sp.Mul.make_args(random):
        base, exp = factor.as_base_exp()
        exp = int(exp)
        if base == error:
            power += exp
        elif base.func == dsig:
            ds += [base.args[0]] * exp
        elif base.func == sig:
            ss += [base.args[0]] * exp
        elif base.func == LAM:
            xs += [base.args[0]] * exp
        elif base.func == NU:
            xs += [TEACHER_FIELD(base.args[0])] * exp
        else:
            raise NotImplementedError(f"no moment kind for the factor {factor} of E[{random}]")
    if power != len(ds) + len(ss):
        raise NotImplementedError(
            f"E[{random}]: the moment kinds hold δ^(d+s) (one δ per gradient), got δ^{power}")
    key = sp.default_sort_key
    args = sorted(ds, key=key) + sorted(xs, key=key) + sorted(ss, key=key)
    return _kind_function(kind_name(len(ds), len(xs), len(ss)))(*args)


@dataclass(frozen=True)
class MomentDiffusion:
    """The diffusion matrix for generic units in moment kinds.

    Attributes
    ----------
    blocks : dict
        ``{(X, Y): expression}`` over :data:`BLOCK_PAIRS` (those of the state),
        in ``Qf``, ``RHOf``, ``Af``, the parameters and kind functions
        ``M<d><x><s>(i..; j..; k..)`` (:func:`kind_name`); a field argument is a
        student unit (``λ_j``) or ``tfield(m)`` (``ν_m``).
    """

    blocks: dict

    def kinds(self) -> tuple:
        """Names of the kinds used, sorted."""
        names = set()
        for expr in self.blocks.values():
            for f in expr.atoms(sp.Function):
                if f.func.__name__.startswith("M") and f.func.__name__[1:].isdigit():
                    names.add(f.func.__name__)
        return tuple(sorted(names))


@lru_cache(maxsize=8)
def _moment_diffusion(model: Model) -> MomentDiffusion:
    g, h = _generic_gradients(model)

    def to_kinds(monomial):
        inner = sp.expand(monomial.replace(G, g).replace(H, h))
        out = []
        for term in sp.Add.make_args(inner):
            fixed = sp.Mul(*[f for f in sp.Mul.make_args(term)
                             if not f.has(DSIG, SIG, LAM, NU, ERROR)])
            random = sp.Mul(*[f for f in sp.Mul.make_args(term)
                              if f.has(DSIG, SIG, LAM, NU, ERROR)])
            out.append(fixed * _classify(random, DSIG, SIG, ERROR))
        return sp.Add(*out)

    blocks = {}
    for key, expr in covariance_expressions(model).items():
        blocks[key] = sp.expand(expr.replace(lambda e: e.func == E,
                                             lambda e: to_kinds(e.args[0])))
    return MomentDiffusion(blocks)


def moment_diffusion(model: Model) -> MomentDiffusion:
    """The diffusion matrix of ``model`` in moment kinds (see the module docstring)."""
    return _moment_diffusion(model.stand_in())


@lru_cache(maxsize=1)
def used_kinds() -> tuple:
    """Every kind the diffusion of any model uses (both constraints, fixed or trained readout)."""
    names = set()
    for constraint in ("none", "sphere"):
        for trained in (False, True):
            names.update(moment_diffusion(Model(2, 1, 1.0, constraint=constraint,
                                                lr_readout=1.0 if trained else 0.0)).kinds())
    return tuple(sorted(names))


# re-exported for the code generator
K, L, M = UNITS
KY, LY, MY = UNITS_Y
__all__ += ["K", "L", "M", "KY", "LY", "MY", "Qf", "RHOf", "Af"]
