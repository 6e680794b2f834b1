r"""Width-independent ("tensor") derivation for any polynomial activation.

Every expectation in the ODEs involves at most four local fields.  Write the
student and teacher fields as one centred Gaussian vector
``u = (λ_1..λ_p, ν_1..ν_p*)`` of length ``n = p + p*`` with covariance

.. math::  C = \begin{pmatrix} Q & ρ \\ ρ^T & T \end{pmatrix},

and the clean error as ``ŷ − y_clean = Σ_a w_a σ(u_a)`` with weights
``w_a = 1/p`` (student) and ``w_a = −1/p*`` (teacher).  With
``g_k = δ σ'(λ_k)/p``, ``δ = Σ_a w_a σ(u_a) − √Δ ξ``, the ODEs of
:mod:`symquad.symbolic.entries` become

.. math::

   \frac{dQ_{kl}}{dt} &= -\frac{η}{p}\,(G_{kl} + G_{lk})
       + \frac{η^2}{p^2}\Big(\sum_{ab} w_a w_b\, I_4(k,l,a,b) + Δ\, J_2(k,l)\Big), \\
   \frac{dρ_{km}}{dt} &= -\frac{η}{p}\, G_{k,p+m}, \qquad
   G_{kj} = \sum_a w_a\, I_3(k,j,a), \qquad
   ε = \tfrac12 \sum_{ab} w_a w_b\, I_2(a,b),

with the four functions of the covariance of the fields they name

* ``I_2(a,b) = E[σ(u_a) σ(u_b)]`` (risk),
* ``J_2(k,l) = E[σ'(u_k) σ'(u_l)]`` (label noise),
* ``I_3(k,j,a) = E[σ'(u_k)\, u_j\, σ(u_a)]``,
* ``I_4(k,l,a,b) = E[σ'(u_k) σ'(u_l) σ(u_a) σ(u_b)]``.

**The multigraph expansion.**  For jointly Gaussian centred ``x`` with
covariance ``C`` and polynomials ``f_a``,

.. math::

   E\Big[\prod_a f_a(x_a)\Big] = \sum_{m} \prod_{a<b} \frac{C_{ab}^{m_{ab}}}{m_{ab}!}
   \prod_a E\big[f_a^{(d_a)}(x_a)\big]_{x_a \sim N(0, C_{aa})}, \qquad d_a = \sum_{b≠a} m_{ab},

summed over symmetric non-negative integer edge multiplicities ``m``
(multigraphs without loops on the vertices ``a``).

*Proof.*  For a polynomial ``F`` and a symmetric positive-definite ``C``,
``u(s, x) = E[F(x + \sqrt{s} z)]``, ``z ~ N(0, C)``, solves the heat equation
``∂_s u = ½ ∂ᵀC∂ u`` with ``u(0) = F``; since ``F`` is a polynomial the
series of ``exp(s · ½ ∂ᵀC∂)`` terminates and ``E_C[F] = [exp(½ ∂ᵀC∂) F](0)``.
Both sides are polynomials in the entries of ``C``, so the identity holds for
every symmetric ``C`` (positive semi-definite or not).  Split
``C = D + O`` into its diagonal and off-diagonal parts: the constant-coefficient
operators ``½∂ᵀD∂`` and ``½∂ᵀO∂ = Σ_{a<b} C_ab ∂_a∂_b`` commute, hence
``E_C[F] = E_D[exp(Σ_{a<b} C_ab ∂_a ∂_b) F]``.  Expanding the exponential,
``exp(Σ_{a<b} C_ab ∂_a∂_b) = Σ_m ∏_{a<b} C_ab^{m_ab} (∂_a∂_b)^{m_ab}/m_ab!``; on
``F = ∏_a f_a(x_a)`` the derivatives collect to ``∏_a f_a^{(d_a)}(x_a)``, and
under ``E_D`` (independent coordinates) the expectation factorises.  ∎

**Coincident indices.**  The identity only uses the covariance *submatrix* of
the named fields, and holds for singular ones.  When an index of a sum equals
``k`` or ``l`` (say ``a = k``) the submatrix has ``C_ka = C_kk`` and two equal
rows: that is exactly the covariance of the pair ``(u_k, u_k)``, so the same
function evaluated on the full index range is correct for every coincidence
pattern — the merged vertex with the product polynomial ``σ'σ`` is what the
expansion reproduces (``tests/test_tensor.py`` checks this against the entry
route, whose expectations treat coincident fields as one field).

**Vertex functions.**  Every vertex here carries ``σ``, ``σ'`` or the
identity, and ``E[(σ')^{(d)}] = E[σ^{(d+1)}]``, so the only activation-
dependent ingredients are the polynomials in the variance ``D``

.. math::  φ_j(D) = E[σ^{(j)}(x)],\ x ~ N(0, D)
          = \sum_{i ≥ j,\ i-j\ \mathrm{even}} c_i \frac{i!}{(i-j)!} (i-j-1)!!\, D^{(i-j)/2},

``j = 0..deg σ`` (the identity vertex has ``E[x] = 0``, ``E[1] = 1``: exactly
one edge).  A term is dropped when one of its vertex functions is identically
zero (``φ_j ≡ 0`` for ``j > deg σ``, and by parity, e.g. ``φ_0 = φ_2 = 0`` for
``σ = z³``).

Each term of ``Σ_ab w_a w_b I_4(k,l,a,b)`` is a product of Hadamard powers of
``C`` contracted over two indices, so the kernel costs ``O(p²(p+p*)²)`` and
nothing symbolic grows with ``p``; see :mod:`symquad.codegen.tensor_render`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import factorial, prod

import sympy as sp

from ..spec import Model

__all__ = ["TensorForm", "derive_tensor_form", "vertex_function", "multigraphs",
           "NPoint", "VARIANCE", "tensor_equations", "npoint_definition"]

#: The variance ``D`` of a vertex field (argument of the vertex functions).
VARIANCE = sp.Symbol("D", nonnegative=True)


def _double_factorial(k: int) -> int:
    return prod(range(k, 0, -2)) if k > 0 else 1


def vertex_function(coeffs, order: int, D=VARIANCE) -> sp.Expr:
    """``φ_order(D) = E[σ^{(order)}(x)]`` for ``x ~ N(0, D)``, ``σ = Σ c_i z^i``.

    Uses ``E[x^{2r}] = (2r−1)!! D^r`` and ``E[x^{odd}] = 0``.
    """
    terms = []
    for i, c in enumerate(coeffs):
        r = i - order
        if c == 0 or r < 0 or r % 2:
            continue
        c = sp.Rational(c.numerator, c.denominator) if hasattr(c, "numerator") else sp.nsimplify(c)
        terms.append(c * (factorial(i) // factorial(r)) * _double_factorial(r - 1) * D**(r // 2))
    return sp.expand(sp.Add(*terms))


def multigraphs(caps, exact=None):
    """Edge multiplicities on ``len(caps)`` vertices with vertex degrees bounded by ``caps``.

    Parameters
    ----------
    caps : sequence of int
        ``d_a <= caps[a]`` for each vertex.
    exact : dict, optional
        ``{vertex: degree}`` for vertices whose degree is fixed (e.g. 1 for an
        identity vertex).

    Yields
    ------
    dict
        ``{(a, b): m_ab}`` over pairs ``a < b`` (zeros included), in a fixed order.
    """
    n = len(caps)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    exact = exact or {}

    def rec(i, degrees, chosen):
        if i == len(pairs):
            if all(degrees[v] == d for v, d in exact.items()):
                yield dict(zip(pairs, chosen))
            return
        a, b = pairs[i]
        top = min(caps[a] - degrees[a], caps[b] - degrees[b])
        for m in range(top + 1):
            degrees[a] += m
            degrees[b] += m
            yield from rec(i + 1, degrees, chosen + [m])
            degrees[a] -= m
            degrees[b] -= m

    yield from rec(0, [0] * n, [])


@dataclass(frozen=True)
class NPoint:
    """One of the derived functions ``I_2, J_2, I_3, I_4`` as a sum over multigraphs.

    Attributes
    ----------
    name : str
        ``"I2"``, ``"J2"``, ``"I3"`` or ``"I4"``.
    vertices : tuple of str
        Index names of the fields, e.g. ``("k", "l", "a", "b")``.
    shifts : tuple of int or None
        Vertex ``v`` carries ``σ^{(shift)}`` (0: ``σ``, 1: ``σ'``); ``None`` for
        the identity vertex ``u_j``.
    terms : tuple of (dict, tuple)
        ``(edges, orders)``: edge multiplicities ``{(v, w): m}`` and, per
        vertex, the order ``j`` of its vertex function ``φ_j`` (``None`` for an
        identity vertex, whose factor is 1).  The term's value is
        ``∏ C^m/m! ∏ φ_j(D_v)``.
    """

    name: str
    vertices: tuple
    shifts: tuple
    terms: tuple

    def expression(self, cov, variances, phi) -> sp.Expr:
        """The function as a SymPy expression.

        ``cov[(v, w)]`` and ``variances[v]`` give the covariance entries and
        variances to use; ``phi[j]`` is ``φ_j`` as an expression in :data:`VARIANCE`.
        """
        out = []
        for edges, orders in self.terms:
            factor = sp.Integer(1)
            for (a, b), m in edges.items():
                if m:
                    factor *= cov[(a, b)]**m / factorial(m)
            for v, j in enumerate(orders):
                if j is not None:
                    factor *= phi[j].subs(VARIANCE, variances[v])
            out.append(factor)
        return sp.Add(*out)

    def __repr__(self):
        return f"NPoint({self.name}{self.vertices}, {len(self.terms)} terms)"


def _npoint(name, vertices, shifts, phi_nonzero, degree):
    """Multigraph terms of ``E[∏_v f_v(u_v)]`` with ``f_v = σ^{(shift_v)}`` or identity."""
    caps = [1 if s is None else degree - s for s in shifts]
    exact = {v: 1 for v, s in enumerate(shifts) if s is None}
    terms = []
    for edges in multigraphs(caps, exact):
        deg = [0] * len(vertices)
        for (a, b), m in edges.items():
            deg[a] += m
            deg[b] += m
        orders = tuple(None if s is None else deg[v] + s for v, s in enumerate(shifts))
        if all(j is None or phi_nonzero[j] for j in orders):
            terms.append((edges, orders))
    return NPoint(name, tuple(vertices), tuple(shifts), tuple(terms))


@dataclass(frozen=True)
class TensorForm:
    """The width-independent derivation of one activation.

    Attributes
    ----------
    activation : tuple of Fraction
        ``(c0, ..., cd)`` of ``σ``.
    phi : tuple of Expr
        ``φ_j(D) = E[σ^{(j)}(x)]``, ``x ~ N(0, D)``, ``j = 0..d`` (in :data:`VARIANCE`).
    I2, J2, I3, I4 : NPoint
        The derived 2-, 3- and 4-point functions (see the module docstring).
    """

    activation: tuple
    phi: tuple
    I2: NPoint
    J2: NPoint
    I3: NPoint
    I4: NPoint

    @property
    def degree(self) -> int:
        return len(self.activation) - 1

    @property
    def nonzero(self) -> tuple:
        """``φ_j ≢ 0`` for each ``j``."""
        return tuple(f != 0 for f in self.phi)

    def __repr__(self):
        n = sum(len(f.terms) for f in (self.I2, self.J2, self.I3, self.I4))
        return (f"TensorForm(activation={Model(1, 1, 1.0, activation=self.activation).activation_str!r}"
                f", {n} multigraph terms)")


@lru_cache(maxsize=32)
def derive_tensor_form(activation) -> TensorForm:
    """Derive ``φ_j`` and the multigraph terms of ``I_2, J_2, I_3, I_4`` for ``σ``.

    Parameters
    ----------
    activation : tuple of Fraction
        ``Model.activation`` (lowest order first).  Nothing here depends on
        ``p``, ``p*``, ``η`` or ``Δ``.
    """
    activation = tuple(activation)
    d = len(activation) - 1
    phi = tuple(vertex_function(activation, j) for j in range(d + 1))
    nz = tuple(f != 0 for f in phi) + (False,) * 8
    return TensorForm(
        activation, phi,
        I2=_npoint("I2", ("a", "b"), (0, 0), nz, d),
        J2=_npoint("J2", ("k", "l"), (1, 1), nz, d),
        I3=_npoint("I3", ("k", "j", "a"), (1, None, 0), nz, d),
        I4=_npoint("I4", ("k", "l", "a", "b"), (1, 1, 0, 0), nz, d),
    )


# ---- width-independent equations (for display and derive(form="tensor")) ----------

#: Combined covariance ``C`` of ``u = (λ, ν)`` and output weights ``w``.
COV = sp.IndexedBase("C")
WEIGHT = sp.IndexedBase("w")
#: Index symbols: ``k, l`` students, ``j`` any field, ``a, b`` summed over all fields.
IDX = {name: sp.Symbol(name, integer=True, positive=True) for name in "kljabm"}
#: Number of fields ``n = p + p*``.
N_FIELDS = sp.Symbol("n", integer=True, positive=True)
I2F, J2F, I3F, I4F = (sp.Function(name) for name in ("I_2", "J_2", "I_3", "I_4"))


def npoint_definition(f: NPoint, tf: TensorForm) -> sp.Expr:
    """``f`` as a polynomial in the covariance entries ``C_{vw}`` of its index names."""
    names = [IDX[v] for v in f.vertices]
    cov = {(a, b): COV[names[a], names[b]] for a in range(len(names))
           for b in range(len(names)) if a < b}
    variances = [COV[x, x] for x in names]
    return sp.expand(f.expression(cov, variances, tf.phi))


def tensor_equations(model: Model):
    """Width-independent risk and ODEs of ``model`` (see :func:`_tensor_equations`)."""
    risk, dQ, drho, definitions = _tensor_equations(tuple(model.activation))
    return risk, dQ, drho, dict(definitions)


@lru_cache(maxsize=32)
def _tensor_equations(activation):
    """Width-independent risk and ODEs as SymPy expressions with index sums.

    Returns
    -------
    risk, dQ, drho : Expr
        ``dQ`` stands for ``dQ_kl/dt``, ``drho`` for ``dρ_km/dt`` (field index
        ``p + m``); sums run over ``a, b = 1..n``.
    definitions : dict
        ``{I_2(a,b): polynomial, J_2(k,l): ..., I_3(k,j,a): ..., I_4(k,l,a,b): ...}``.
    """
    from .symbols import ETA, NOISE, P
    tf = derive_tensor_form(activation)
    k, l, j, a, b, m = (IDX[x] for x in "kljabm")
    definitions = {
        I2F(a, b): npoint_definition(tf.I2, tf),
        J2F(k, l): npoint_definition(tf.J2, tf),
        I3F(k, j, a): npoint_definition(tf.I3, tf),
        I4F(k, l, a, b): npoint_definition(tf.I4, tf),
    }
    over_a, over_b = (a, 1, N_FIELDS), (b, 1, N_FIELDS)
    risk = sp.Rational(1, 2) * sp.Sum(WEIGHT[a] * WEIGHT[b] * I2F(a, b), over_a, over_b)
    g_kl = sp.Sum(WEIGHT[a] * I3F(k, l, a), over_a)
    g_lk = sp.Sum(WEIGHT[a] * I3F(l, k, a), over_a)
    four = sp.Sum(WEIGHT[a] * WEIGHT[b] * I4F(k, l, a, b), over_a, over_b)
    dQ = -ETA / P * (g_kl + g_lk) + ETA**2 / P**2 * (four + NOISE * J2F(k, l))
    drho = -ETA / P * sp.Sum(WEIGHT[a] * I3F(k, P + m, a), over_a)
    return risk, dQ, drho, tuple(definitions.items())


# ---- multiprecision reference (conditioning of the float64 kernels) ----------------

def _mp_function(f: NPoint, tf: TensorForm):
    """``f`` lambdified with exact rational coefficients (mpmath printer).

    The returned ``call(C, idx)`` takes the covariance as a numpy object array
    of mpf and, per vertex, an index or an index array; numpy broadcasts the
    vertex indices, so one call evaluates ``f`` over a whole index grid
    (element by element in mpf arithmetic).
    """
    expr = npoint_definition(f, tf)
    names = [IDX[v] for v in f.vertices]
    order = [(a, b) for a in range(len(names)) for b in range(a, len(names))]
    args = [sp.Dummy(f"c{a}{b}") for a, b in order]
    expr = expr.xreplace({COV[names[a], names[b]]: s for (a, b), s in zip(order, args)})
    expr = expr.xreplace({COV[names[b], names[a]]: s for (a, b), s in zip(order, args)})
    fn = sp.lambdify(args, expr, "mpmath")

    def call(C, idx):
        return fn(*[C[idx[a], idx[b]] for a, b in order])
    return call


def reference_entries(model: Model, Q, rho, T, dq_entries=(), drho_entries=(),
                      risk: bool = False, dps: int = 40) -> dict:
    r"""Selected ODE entries evaluated in ``dps``-digit arithmetic (mpmath).

    Evaluates the derived polynomials ``I_2, J_2, I_3, I_4`` (expanded in the
    covariance entries, as printed by ``symquad equations``) at every index
    combination and sums them with :func:`mpmath.fsum` — without the kernels'
    grouping into Hadamard powers, pair sums and matrix products: a second
    route for the kernels and the yardstick of their float64 rounding error.
    Cost ``O(n²)`` mpf operations per ``dQ`` entry and for the risk, ``O(n)``
    per ``dρ`` entry.

    Returns
    -------
    dict
        ``{("dQ", k, l): mpf, ("drho", k, m): mpf, ("risk",): mpf}``.
    """
    import mpmath
    import numpy as np
    tf = derive_tensor_form(model.activation)
    p, pk = model.p, model.p_star
    n = p + pk
    Cf = np.block([[np.asarray(Q, float), np.asarray(rho, float)],
                   [np.asarray(rho, float).T, np.asarray(T, float)]])
    with mpmath.workdps(dps):
        mp = mpmath.mpf
        C = np.empty((n, n), dtype=object)
        for i in range(n):
            for j in range(n):
                C[i, j] = mp(float(Cf[i, j]))
        w = np.array([mp(1) / p] * p + [mp(-1) / pk] * pk, dtype=object)
        eta, noise = mp(float(model.eta)), mp(float(model.noise))
        I2, J2, I3, I4 = (_mp_function(getattr(tf, name), tf) for name in ("I2", "J2", "I3", "I4"))
        a_col, b_row = np.arange(n)[:, None], np.arange(n)[None, :]
        a_all = np.arange(n)
        ww = w[:, None] * w[None, :]

        def total(values):
            return mpmath.fsum(np.broadcast_to(values, (n,) * np.ndim(values)).ravel())

        def G(k, j):
            return total(w * I3(C, (k, j, a_all)))

        out = {}
        for k, l in dq_entries:
            four = total(ww * I4(C, (k, l, a_col, b_row)))
            out[("dQ", k, l)] = (-eta / p * (G(k, l) + G(l, k))
                                 + eta**2 / p**2 * (four + noise * J2(C, (k, l))))
        for k, m in drho_entries:
            out[("drho", k, m)] = -eta / p * G(k, p + m)
        if risk:
            out[("risk",)] = total(ww * I2(C, (a_col, b_row))) / 2
        return out
