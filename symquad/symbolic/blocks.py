r"""The drift of per-block order parameters for inputs with a spectrum (docs/derivation.md §1a).

Inputs ``x ~ N(0, Σ)``, ``Σ = Σ_b s_b P_b`` (``Model.spectrum``; ``P_b`` orthogonal
projectors of rank ``f_b N``).  The state is ``Q^c = W P_c Wᵀ/N``, ``ρ^c = W P_c W*ᵀ/N`` for
every block ``c`` (``T^c = W* P_c W*ᵀ/N`` is constant).  The update rule is the one of
:mod:`symquad.symbolic.update` (``w_i' = (1 − ηλ/N) w_i − η X_i/(b√N)``, ``X_i = Σ_μ g_i^μ
x^μ``, the readout step, the sphere's ``w_i'' = w_i' |w_i|/|w_i'|``); here the new overlaps
are inner products *through* ``P_c``:

* ``w_i·P_c w_j = N Q^c_ij``, ``w_i·P_c w*_m = N ρ^c_im``, and the Euclidean
  ``w_i·w_j = N Q_ij`` with ``Q = Σ_c Q^c`` (the sphere's norms);
* ``X_i·P_c w_j = √N b·Mean[g_i μ^c_j]`` with the *block field* ``μ^c_j = w_j P_c x/√N``
  (``μ*^c_m`` likewise for a teacher row); without a projector the field ``λ_j``;
* ``X_i·P_c X_j = N b·Mean[g_i g_j r_c] + N b(b−1)·PairMean[g_i g_j r_c×]`` with
  ``r_c = xᵀP_c x/N`` and ``r_c× = x^μᵀP_c x^ν/N``; without a projector ``r = |x|²/N``.

As ``N → ∞``: ``r_c → E[xᵀP_c x]/N = tr(Σ P_c)/N = f_c s_c`` (the part of ``P_c x``
outside the weights' span has ``f_c N − O(1)`` independent coordinates of variance
``s_c``, independent of the fields), ``r → Σ_c f_c s_c = tr Σ/N``, and ``r_c× → 0`` (mean
zero outside the span, ``O(1/N)`` inside).  The drift is ``∂X'/∂ε`` at ``ε = 1/N = 0``:

.. math::

   \frac{dQ^c_{kl}}{dt} &= -2ηλ Q^c_{kl} - η\,(E[g_k μ^c_l] + E[g_l μ^c_k])
        + \frac{η^2}{b} f_c s_c\, E[g_k g_l],\\
   \frac{dρ^c_{km}}{dt} &= -ηλ ρ^c_{km} - η\,E[g_k μ^{*c}_m], \qquad
   \frac{da_k}{dt} = -η_a E[h_k],

and on the sphere (the norm is the Euclidean one, ``Q_kk = Σ_c Q^c_kk``)
``dQ^c_kl ← F^c_kl − ½ Q^c_kl (F_kk/Q_kk + F_ll/Q_ll)``, ``dρ^c_km ← F^{ρc}_km − ½ ρ^c_km
F_kk/Q_kk`` with ``F_kk = Σ_c F^c_kk`` the unconstrained drift of the Euclidean norm —
derived here from the update map like every other term (:func:`block_drift`).

The expectations are over the joint Gaussian law of the fields ``z = (λ, ν)`` (covariance
``Ω = Σ_c s_c [[Q^c, ρ^c], [ρ^cᵀ, T^c]]``) and the block fields, whose covariances with
the fields are ``Cov(μ^c_l, z) = s_c ([Q^c ρ^c])_l`` and ``Cov(μ^{*c}_m, z) =
s_c ([ρ^cᵀ T^c])_m``.  Two routes evaluate them:

* the **moment kinds** (:func:`block_moment_drift`): with ``g_k = a_k σ'(λ_k) δ`` the new
  expectations are ``Gb(c; k, l) = E[σ'(λ_k) μ^c_l δ]`` and ``Gtb(c; k, m)``; the block
  field enters linearly, so by Stein's lemma ``E[σ'(λ_k) μ δ] = Σ_j Cov(μ, z_j)
  E[∂_j(σ'(λ_k) δ)]`` — the three-point sum of the isotropic kinds with the block field's
  covariances in place of the field ``z_j``'s (the kernels' *legs*,
  :mod:`symquad.runtime.tensor_engine`); ``B`` and ``R`` are the isotropic kinds at ``Ω``;
* the **entry route for blocks** (:func:`block_entries`, the small-width reference): every
  expectation of the explicit network by Wick's theorem on the joint Gaussian of
  ``(λ, ν, μ^c, μ^{*c}, ξ)`` with its covariance written out entry by entry — no Stein,
  no moment kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy as sp

import numpy as np

from ..spec import Model
from .moments import DSIG as MOMENT_DSIG
from .moments import SIG, _classify
from .network import ERROR, network
from .network import readout_values as model_readouts
from .symbols import BATCH, ETA, ETA_READOUT, PARAMS, WEIGHT_DECAY, XI, readout_symbols
from .update import (Af, E, EPS, G, H, LAM, MEAN, NU, PAIR, R_CROSS, R_NORM, UNITS,
                     _first_order)
from .wick import GaussianFields

__all__ = ["QBf", "QTf", "RHOBf", "MU", "MUS", "FS", "TR_SIGMA", "CB", "BlockDrift",
           "block_drift", "block_moment_drift", "block_entries", "block_symbols", "MGB",
           "MGTB"]


class _Symmetric(sp.Function):
    """An overlap of two units (last two arguments) kept in canonical order."""

    @classmethod
    def eval(cls, *args):
        *head, i, j = args
        if sp.default_sort_key(j) < sp.default_sort_key(i):
            return cls(*head, j, i)
        return None


class QBf(_Symmetric):
    """``Q^c_ij`` of a generic block ``c`` and units ``i, j``."""

    nargs = 3


class QTf(_Symmetric):
    """The Euclidean overlap ``Q_ij = Σ_c Q^c_ij`` (the sphere's norms)."""

    nargs = 2


#: ``ρ^c_im``; the block fields ``μ^c_i = w_i P_c x/√N`` and ``μ*^c_m = w*_m P_c x/√N``;
#: ``r_c = xᵀP_c x/N`` and its pair version; ``f_c s_c`` (the limit of ``r_c``).
RHOBf = sp.Function("rhob")
MU = sp.Function("mu")
MUS = sp.Function("mus")
R_BLOCK = sp.Function("r_block")
R_BLOCK_CROSS = sp.Function("r_block_x")
FS = sp.Function("fs")
#: ``tr Σ/N = Σ_c f_c s_c``: the limit of ``|x|²/N``.
TR_SIGMA = sp.Symbol("trSigma", positive=True)
#: The generic block.
CB = sp.Symbol("c", integer=True, positive=True)
#: Moment kinds of the block fields: ``Gb(c, k, l) = E[σ'(λ_k) μ^c_l δ]``,
#: ``Gtb(c, k, m) = E[σ'(λ_k) μ^{*c}_m δ]``.
MGB = sp.Function("Gb")
MGTB = sp.Function("Gtb")

_RANDOM = (G, H, LAM, NU, MU, MUS)


def _inner(u: dict, v: dict, N, c) -> sp.Expr:
    """``u·P_c v`` (``c`` a block) or ``u·v`` (``c`` None) of vectors ``{(kind, unit): coeff}``.

    Kinds ``"w"`` (student row), ``"ws"`` (teacher row), ``"X"`` (the batch sum), as in
    :func:`symquad.symbolic.update._inner`; the module docstring has the table.
    """
    b = BATCH

    def gram(x, y):
        (kx, ix), (ky, iy) = sorted((x, y), key=lambda t: ({"w": 0, "ws": 1, "X": 2}[t[0]],
                                                          sp.default_sort_key(t[1])))
        if (kx, ky) == ("w", "w"):
            return N * (QTf(ix, iy) if c is None else QBf(c, ix, iy))
        if (kx, ky) == ("w", "ws"):
            if c is None:                 # pragma: no cover - the sphere needs norms only
                raise KeyError("the Euclidean student-teacher overlap is never needed")
            return N * RHOBf(c, ix, iy)
        if (kx, ky) == ("w", "X"):
            return sp.sqrt(N) * b * MEAN(G(iy) * (LAM(ix) if c is None else MU(c, ix)))
        if (kx, ky) == ("ws", "X"):
            return sp.sqrt(N) * b * MEAN(G(iy) * (NU(ix) if c is None else MUS(c, ix)))
        if (kx, ky) == ("X", "X"):
            r = R_NORM if c is None else R_BLOCK(c)
            r_x = R_CROSS if c is None else R_BLOCK_CROSS(c)
            return N * b * MEAN(G(ix) * G(iy) * r) + N * b * (b - 1) * PAIR(G(ix) * G(iy) * r_x)
        raise KeyError((kx, ky))  # pragma: no cover

    return sp.Add(*[cu * cv * gram(x, y) for x, cu in u.items() for y, cv in v.items()])


def _row(i, N) -> dict:
    """``w_i' = (1 − ηλ/N) w_i − η X_i/(b√N)`` (the update of :mod:`symquad.symbolic.update`)."""
    return {("w", i): 1 - ETA * WEIGHT_DECAY / N, ("X", i): -ETA / (BATCH * sp.sqrt(N))}


def block_step_map(model: Model, c, i, j, m):
    """New ``(Q^c'_ij, ρ^c'_im, a'_i)`` after one step, as functions of ``ε = 1/N``."""
    N = 1 / EPS
    wi, wj = _row(i, N), _row(j, N)
    q_new = sp.expand(_inner(wi, wj, N, c) / N)
    rho_new = sp.expand(_inner(wi, {("ws", m): 1}, N, c) / N)
    if model.constraint == "sphere":
        # w_i'' = w_i' |w_i|/|w_i'|: the Euclidean norm of the whole row is restored
        def factor(u, row):
            return sp.sqrt(QTf(u, u) / sp.expand(_inner(row, row, N, None) / N))
        q_new = q_new * factor(i, wi) * factor(j, wj)
        rho_new = rho_new * factor(i, wi)
    a_new = Af(i) - ETA_READOUT * EPS * MEAN(H(i)) if model.readout_trained else None
    return q_new, rho_new, a_new


def _is_random(factor) -> bool:
    return factor.has(*_RANDOM) or factor.has(R_NORM, R_CROSS, R_BLOCK, R_BLOCK_CROSS)


def _expectation(expr: sp.Expr) -> sp.Expr:
    """Batch means → ``E[monomial]`` with the limits ``r_c → f_c s_c``, ``r → tr Σ/N``, pairs → 0."""
    limits = {R_NORM: TR_SIGMA, R_CROSS: 0}
    out = []
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, rest = sp.Integer(1), []
        for factor in sp.Mul.make_args(term):
            if factor.func in (MEAN, PAIR):
                inner = factor.args[0].xreplace(limits)
                inner = inner.replace(R_BLOCK, FS).replace(R_BLOCK_CROSS, lambda c: 0)
                parts = []
                for mono in sp.Add.make_args(sp.expand(inner)):
                    if mono == 0:
                        continue
                    fixed = sp.Mul(*[f for f in sp.Mul.make_args(mono) if not _is_random(f)])
                    random = sp.Mul(*[f for f in sp.Mul.make_args(mono) if _is_random(f)])
                    parts.append(fixed * E(random))
                rest.append(sp.Add(*parts))
            else:
                coeff *= factor
        out.append(coeff * sp.Mul(*rest))
    return sp.expand(sp.Add(*out))


@dataclass(frozen=True)
class BlockDrift:
    """The drift of block ``c`` (:data:`CB`) for generic units ``k, l, m`` (:data:`UNITS`).

    ``dQ``, ``drho`` in ``QBf``, ``RHOBf``, ``QTf`` (sphere), ``Af``, ``FS(c)``,
    ``trSigma``, the parameters and expectations ``E[…]`` of ``g, h, λ, μ, μ*``;
    ``da`` (trained readout) or None.
    """

    dQ: sp.Expr
    drho: sp.Expr
    da: sp.Expr | None


@lru_cache(maxsize=8)
def _block_drift(probe: Model) -> BlockDrift:
    k, l, m = UNITS
    q_new, rho_new, a_new = block_step_map(probe, CB, k, l, m)
    for value, old in ((q_new, QBf(CB, k, l)), (rho_new, RHOBf(CB, k, m))):
        if sp.simplify(value.subs(EPS, 0) - old) != 0:  # pragma: no cover - algebra guard
            raise AssertionError("one step does not reduce to the identity as N -> oo")
    dQ = _expectation(_first_order(q_new))
    drho = _expectation(_first_order(rho_new))
    da = None if a_new is None else _expectation(_first_order(a_new))
    return BlockDrift(dQ, drho, da)


def block_drift(model: Model) -> BlockDrift:
    """The per-block drift of `model` (see the module docstring), from the update map."""
    return _block_drift(model.stand_in(1, 1))


# ---- moment form -------------------------------------------------------------------
DSIG = sp.Function("dsigma")


def _moment(random: sp.Expr) -> sp.Expr:
    """The moment kind of ``E[random]`` once ``g_k = a_k σ'(λ_k) δ``, ``h_k = σ(λ_k) δ``."""
    factors = sp.Mul.make_args(random)
    mu = [f for f in factors if f.func in (MU, MUS)]
    if not mu:
        return _classify(random)
    rest = [f for f in factors if f.func not in (MU, MUS)]
    ds = [f.args[0] for f in rest if f.func == DSIG]
    err = [f for f in rest if f == ERROR]
    if len(mu) == 1 and len(ds) == 1 and len(err) == 1 and len(rest) == 2:
        f = mu[0]
        return (MGB if f.func == MU else MGTB)(f.args[0], ds[0], f.args[1])
    raise NotImplementedError(f"no moment kind for E[{random}]")   # pragma: no cover


@lru_cache(maxsize=8)
def _block_moments(probe: Model) -> BlockDrift:
    d = _block_drift(probe)
    u = sp.Dummy("u")
    g = sp.Lambda(u, Af(u) * DSIG(u) * ERROR)
    h = sp.Lambda(u, SIG(u) * ERROR)

    def convert(expr):
        if expr is None:
            return None

        def expand_expectation(mono):
            inner = sp.expand(mono.replace(G, g).replace(H, h))
            out = []
            for term in sp.Add.make_args(inner):
                fixed = sp.Mul(*[f for f in sp.Mul.make_args(term)
                                 if not f.has(DSIG, SIG, LAM, NU, MU, MUS, ERROR)])
                random = sp.Mul(*[f for f in sp.Mul.make_args(term)
                                  if f.has(DSIG, SIG, LAM, NU, MU, MUS, ERROR)])
                out.append(fixed * _moment(random.replace(DSIG, _dsig_for_classify)))
            return sp.Add(*out)
        return sp.expand(expr.replace(lambda e: e.func == E,
                                      lambda e: expand_expectation(e.args[0])))
    return BlockDrift(convert(d.dQ), convert(d.drho), convert(d.da))


def _dsig_for_classify(u):
    """The moment module's ``σ'`` head (its classifier reads it)."""
    return MOMENT_DSIG(u)


def block_moment_drift(model: Model) -> BlockDrift:
    """The per-block drift in moment kinds: ``Gb``, ``Gtb`` (:data:`MGB`, :data:`MGTB`),
    the isotropic ``G`` (its diagonal, on the sphere), ``B``, ``R``, all at ``Ω``."""
    return _block_moments(model.stand_in(1, 1))


# ---- the entry route for blocks (the reference) -------------------------------------
def block_symbols(p: int, p_star: int, B: int):
    """Entry symbols ``Qb<c>_i_j`` (symmetric), ``rhob<c>_i_m``, ``Tb<c>_l_m`` and ``fs<c>``,
    ``s<c>`` (1-based), as lists over the blocks of sympy Matrices / symbols."""
    def sym(name, n):
        return sp.ImmutableMatrix(n, n, lambda i, j: sp.Symbol(
            f"{name}_{min(i, j) + 1}_{max(i, j) + 1}", real=True))
    Q = [sym(f"Qb{c + 1}", p) for c in range(B)]
    rho = [sp.ImmutableMatrix(p, p_star, lambda i, m, c=c: sp.Symbol(
        f"rhob{c + 1}_{i + 1}_{m + 1}", real=True)) for c in range(B)]
    T = [sym(f"Tb{c + 1}", p_star) for c in range(B)]
    s = [sp.Symbol(f"s{c + 1}", positive=True) for c in range(B)]
    f = [sp.Symbol(f"f{c + 1}", positive=True) for c in range(B)]
    return Q, rho, T, s, f


def block_entries_at(model: Model, Q, rho, T, a=None):
    """The entry route for blocks at one point, in exact rational arithmetic.

    As :func:`block_entries`, but with the overlaps ``Q`` (B, p, p), ``rho`` (B, p, p*),
    ``T`` (B, p*, p*), the readouts, the spectrum and the kernel parameters substituted
    *before* the Wick recursion, each float converted exactly (``sympy.Rational`` of its
    binary value): every expectation is then an exact rational, and the result a float
    reference with no round-off of its own (the Wick sums over the symbolic covariance
    cost minutes at ``(2, 1)``, ``B = 3`` on the sphere; this takes a second).
    Returns ``(risk, dQ (B, p, p), drho (B, p, p*), da (p,) or None)`` as floats.
    """
    B = model.n_blocks
    exact = lambda x: sp.Rational(float(x))                       # noqa: E731
    Qn = [sp.Matrix(np.asarray(Q[c], float)).applyfunc(exact) for c in range(B)]
    Rn = [sp.Matrix(np.asarray(rho[c], float)).applyfunc(exact) for c in range(B)]
    Tn = [sp.Matrix(np.asarray(T[c], float)).applyfunc(exact) for c in range(B)]
    readout = model.readout if a is None else a
    values = {s_: sp.Rational(x.numerator, x.denominator) if hasattr(x, "numerator")
              else exact(x) for s_, x in zip(readout_symbols(model.p, model.p_star)[0],
                                              readout)}
    risk, dQ, drho, da = _block_entries(model, B, (Qn, Rn, Tn), values)
    as_float = lambda m: np.array(m.tolist(), dtype=float)        # noqa: E731
    return (float(risk), np.stack([as_float(x) for x in dQ]), np.stack([as_float(x) for x in drho]),
            None if da is None else as_float(da).ravel())


@lru_cache(maxsize=16)
def block_entries(model: Model, B: int):
    """``(risk, dQ, drho, da)`` of `model` with ``B`` input blocks, entry by entry.

    Every expectation of :func:`block_drift` instantiated at concrete blocks and units is
    taken of the explicit network (:func:`symquad.symbolic.network.network`) by Wick's
    theorem on the joint Gaussian of ``(λ, ν, μ^c, μ^{*c}, ξ)`` whose covariance is
    written out from the definitions ``λ = W x/√N``, ``μ^c = W P_c x/√N``, ``x ~ N(0, Σ)``:
    ``Cov(μ^c_i, μ^d_j) = δ_cd s_c Q^c_ij``, ``Cov(μ^c_i, λ_j) = s_c Q^c_ij``,
    ``Cov(λ_i, λ_j) = Σ_c s_c Q^c_ij`` (and the same with ``ρ^c``, ``T^c``).  Returns SymPy
    objects in :func:`block_symbols` (``dQ``, ``drho`` lists over blocks of Matrices), the
    readout symbols and the parameters.  Small widths only (polynomial activations; the
    Wick recursion over ``(1 + B)(p + p*) + 1`` fields).
    """
    return _block_entries(model, B)


def _block_entries(model: Model, B: int, numbers=None, readout_values=None):
    """:func:`block_entries`, symbolic or, with `numbers` ``(Q, rho, T)`` (lists of exact
    Matrices) and `readout_values`, at that point (spectrum and parameters exact too)."""
    if not model.is_polynomial:
        raise ValueError("the entry route for blocks takes Wick expectations of "
                         "polynomials; got a non-polynomial activation")
    net = network(model)
    p, k = model.p, model.p_star
    Q, rho, T, s, f = block_symbols(p, k, B)
    subs = {}
    if numbers is not None:
        Q, rho, T = numbers
        s = [sp.Rational(x.numerator, x.denominator) for _, x in model.spectrum]
        f = [sp.Rational(x.numerator, x.denominator) for x, _ in model.spectrum]
        subs = dict(model_readouts(model))
        subs.update(readout_values or {})
        subs.update({sym: sp.Rational(model.kernel_params()[sym.name]) for sym in PARAMS})
        net = _substituted(net, subs)
    mu = [[sp.Symbol(f"mu{c + 1}_{i + 1}", real=True) for i in range(p)] for c in range(B)]
    mus = [[sp.Symbol(f"mus{c + 1}_{m + 1}", real=True) for m in range(k)] for c in range(B)]
    # one block's Gram matrix of (student rows, teacher rows) through P_c, times s_c
    def block_gram(c):
        return sp.Matrix(sp.BlockMatrix([[Q[c], rho[c]], [rho[c].T, T[c]]])) * s[c]
    n = p + k
    fields = list(net.lam) + list(net.nu)
    for c in range(B):
        fields += mu[c] + mus[c]
    size = n * (1 + B) + 1
    cov = sp.zeros(size, size)
    total = sp.zeros(n, n)
    for c in range(B):
        total += block_gram(c)
    cov[:n, :n] = total
    for c in range(B):
        o = n * (1 + c)
        gram = block_gram(c)
        cov[o:o + n, o:o + n] = gram          # distinct blocks: orthogonal projectors
        cov[o:o + n, :n] = gram               # P_c x against x: P_c Σ = s_c P_c
        cov[:n, o:o + n] = gram
    cov[size - 1, size - 1] = 1
    gauss = GaussianFields(fields + [XI], cov)
    memo = {}

    def expect(mono):
        if mono not in memo:
            values = {G: lambda i: net.grad[int(i) - 1], H: lambda i: net.readout_grad[int(i) - 1],
                      LAM: lambda i: net.lam[int(i) - 1], NU: lambda j: net.nu[int(j) - 1],
                      MU: lambda c, i: mu[int(c) - 1][int(i) - 1],
                      MUS: lambda c, j: mus[int(c) - 1][int(j) - 1]}
            explicit = mono.replace(lambda e: e.func in values,
                                    lambda e: values[e.func](*e.args))
            memo[mono] = gauss.expectation(explicit)
        return memo[mono]

    d = block_drift(model)
    K, L, M = UNITS
    a_syms, _ = readout_symbols(p, k)

    def state(c):
        table = {QBf(c + 1, i + 1, j + 1): Q[c][i, j] for i in range(p) for j in range(i, p)}
        table.update({RHOBf(c + 1, i + 1, m + 1): rho[c][i, m]
                      for i in range(p) for m in range(k)})
        table.update({QTf(i + 1, j + 1): sum((Q[b][i, j] for b in range(B)), sp.Integer(0))
                      for i in range(p) for j in range(i, p)})
        table.update({Af(i + 1): a_syms[i] for i in range(p)})
        table.update({FS(c + 1): f[c] * s[c], TR_SIGMA: sum(
            (f[b] * s[b] for b in range(B)), sp.Integer(0))})
        return table

    def evaluate(expr, c, i, j, m):
        expr = expr.xreplace({CB: c + 1, K: i, L: j, M: m})
        expr = expr.replace(lambda e: e.func == E, lambda e: expect(e.args[0]))
        return sp.expand(expr.xreplace(state(c)))

    dQ, drho = [], []
    for c in range(B):
        q = sp.zeros(p, p)
        r = sp.zeros(p, k)
        for i in range(1, p + 1):
            for j in range(i, p + 1):
                q[i - 1, j - 1] = q[j - 1, i - 1] = evaluate(d.dQ, c, i, j, 1)
            for m in range(1, k + 1):
                r[i - 1, m - 1] = evaluate(d.drho, c, i, i, m)
        dQ.append(q)
        drho.append(r)
    da = None
    if d.da is not None:
        da = sp.Matrix([evaluate(d.da, 0, i, i, 1) for i in range(1, p + 1)])
    risk = gauss.expectation((net.student - net.teacher) ** 2 / 2)
    if subs:
        risk = risk.xreplace(subs)
        dQ = [x.xreplace(subs) for x in dQ]
        drho = [x.xreplace(subs) for x in drho]
        da = None if da is None else da.xreplace(subs)
    return risk, dQ, drho, da


def _substituted(net, values):
    """The explicit network with readouts and parameters replaced by numbers."""
    from dataclasses import replace
    return replace(net, student=net.student.xreplace(values),
                   teacher=net.teacher.xreplace(values),
                   grad=tuple(g.xreplace(values) for g in net.grad),
                   readout_grad=tuple(h.xreplace(values) for h in net.readout_grad))
