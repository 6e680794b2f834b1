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
from itertools import product
from math import factorial, prod

import sympy as sp

from ..spec import Model, error_signal_weight
from . import special as S
from .moments import MB, MG, MGT, MR, moment_drift
from .symbols import NOISE, P, PARAMS
from .update import Af, Qf, RHOf

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
        Vertex ``v`` carries ``σ_v^{(shift)}`` (0: ``σ``, 1: ``σ'``); ``None`` for
        the identity vertex ``u_j``.
    terms : tuple of (dict, tuple)
        ``(edges, orders)``: edge multiplicities ``{(v, w): m}`` and, per
        vertex, the order ``j`` of its vertex function ``φ_j`` (``None`` for an
        identity vertex, whose factor is 1).  The term's value is
        ``∏ C^m/m! ∏ φ_{v, j}(D_v)``, with the vertex functions of the
        activation of field ``v`` (student ``σ`` or teacher ``σ*``).
    """

    name: str
    vertices: tuple
    shifts: tuple
    terms: tuple

    def expression(self, cov, variances, phi) -> sp.Expr:
        """The function as a SymPy expression.

        ``cov[(v, w)]`` and ``variances[v]`` give the covariance entries and
        variances to use; ``phi[v][j]`` (or ``phi[j]`` when every vertex has the
        same activation) is ``φ_j`` of vertex ``v`` as an expression in
        :data:`VARIANCE`.
        """
        per_vertex = isinstance(phi[0], (tuple, list))
        out = []
        for edges, orders in self.terms:
            factor = sp.Integer(1)
            for (a, b), m in edges.items():
                if m:
                    factor *= cov[(a, b)]**m / factorial(m)
            for v, j in enumerate(orders):
                if j is not None:
                    table = phi[v] if per_vertex else phi
                    value = table[j]
                    if variances[v] is not None:
                        value = value.subs(VARIANCE, variances[v])
                    factor *= value
            out.append(factor)
        return sp.Add(*out)

    def __repr__(self):
        return f"NPoint({self.name}{self.vertices}, {len(self.terms)} terms)"


def _npoint(name, vertices, shifts, nonzero, caps_of):
    """Multigraph terms of ``E[∏_v f_v(u_v)]`` with ``f_v = σ_v^{(shift_v)}`` or identity.

    ``nonzero[v][j]``: whether ``φ_j`` can be non-zero at vertex ``v`` (for a
    vertex summed over students and teachers: for either activation);
    ``caps_of[v]``: the degree of vertex ``v``'s polynomial.
    """
    caps = [1 if s is None else caps_of[v] - s for v, s in enumerate(shifts)]
    exact = {v: 1 for v, s in enumerate(shifts) if s is None}
    terms = []
    for edges in multigraphs(caps, exact):
        deg = [0] * len(vertices)
        for (a, b), m in edges.items():
            deg[a] += m
            deg[b] += m
        orders = tuple(None if s is None else deg[v] + s for v, s in enumerate(shifts))
        if all(j is None or nonzero[v][j] for v, j in enumerate(orders)):
            terms.append((edges, orders))
    return NPoint(name, tuple(vertices), tuple(shifts), tuple(terms))


@dataclass(frozen=True)
class TensorForm:
    """The width-independent derivation of one pair of activations ``(σ, σ*)``.

    Attributes
    ----------
    activation, teacher_activation : tuple of Fraction
        ``(c0, ..., cd)`` of the student's ``σ`` and the teacher's ``σ*``.
    phi, phi_teacher : tuple of Expr
        ``φ_j(D) = E[σ^{(j)}(x)]`` and ``E[σ*^{(j)}(x)]``, ``x ~ N(0, D)``, ``j = 0..d``
        (in :data:`VARIANCE`; padded with zeros to the larger degree).
    I2, J2, I3, I4 : NPoint
        The derived 2-, 3- and 4-point functions (see the module docstring);
        vertices ``k, l`` are students, ``a, b`` any field.
    """

    activation: tuple
    teacher_activation: tuple
    phi: tuple
    phi_teacher: tuple
    I2: NPoint
    J2: NPoint
    I3: NPoint
    I4: NPoint

    @property
    def degree(self) -> int:
        """The larger of the two activations' degrees."""
        return max(len(self.activation), len(self.teacher_activation)) - 1

    @property
    def same_activation(self) -> bool:
        """True when student and teacher share one activation."""
        return self.activation == self.teacher_activation

    @property
    def nonzero(self) -> tuple:
        """``φ_j ≢ 0`` for each ``j``, for the student or the teacher."""
        return tuple(f != 0 or g != 0 for f, g in zip(self.phi, self.phi_teacher))

    def vertex_phi(self, f: NPoint, teacher_vertices=()) -> tuple:
        """Per-vertex ``φ`` tables of `f` with the listed vertices on teacher fields."""
        return tuple(self.phi_teacher if v in teacher_vertices else self.phi
                     for v in range(len(f.vertices)))

    def __repr__(self):
        n = sum(len(f.terms) for f in (self.I2, self.J2, self.I3, self.I4))
        act = Model(1, 1, 1.0, activation=self.activation).activation_str
        if not self.same_activation:
            act += ", teacher " + Model(1, 1, 1.0, activation=self.teacher_activation).activation_str
        return f"TensorForm(activation={act!r}, {n} multigraph terms)"


@lru_cache(maxsize=32)
def derive_tensor_form(activation, teacher_activation=None) -> TensorForm:
    """Derive ``φ_j`` and the multigraph terms of ``I_2, J_2, I_3, I_4`` for ``(σ, σ*)``.

    Parameters
    ----------
    activation, teacher_activation : tuple of Fraction
        ``Model.activation`` and ``Model.teacher_activation`` (lowest order
        first; the teacher's defaults to the student's).  Nothing here depends
        on ``p``, ``p*``, the readouts or the learning parameters.
    """
    activation = tuple(activation)
    teacher_activation = activation if teacher_activation is None else tuple(teacher_activation)
    ds, dt = len(activation) - 1, len(teacher_activation) - 1
    d = max(ds, dt)
    phi = tuple(vertex_function(activation, j) for j in range(d + 1))
    phi_t = tuple(vertex_function(teacher_activation, j) for j in range(d + 1))
    pad = (False,) * 8
    student_nz = tuple(f != 0 for f in phi) + pad
    any_nz = tuple(f != 0 or g != 0 for f, g in zip(phi, phi_t)) + pad
    S, A = (student_nz, ds), (any_nz, d)     # student-only vertex, vertex over all fields

    def npoint(name, vertices, shifts, kinds):
        return _npoint(name, vertices, shifts, [k[0] for k in kinds], [k[1] for k in kinds])
    return TensorForm(
        activation, teacher_activation, phi, phi_t,
        I2=npoint("I2", ("a", "b"), (0, 0), (A, A)),
        J2=npoint("J2", ("k", "l"), (1, 1), (S, S)),
        I3=npoint("I3", ("k", "j", "a"), (1, None, 0), (S, A, A)),
        I4=npoint("I4", ("k", "l", "a", "b"), (1, 1, 0, 0), (S, S, A, A)),
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


def _vertex_phi_symbols(f: NPoint, tf: TensorForm, names):
    """Per-vertex ``φ`` tables for display: the student's polynomials at ``k, l``; at a
    vertex summed over all fields, the polynomials too when ``σ = σ*``, else the
    functions ``φ_j^{(a)}(C_aa)`` of that field's activation."""
    tables = []
    for v, shift in enumerate(f.shifts):
        if shift is None or tf.same_activation or f.vertices[v] in ("k", "l"):
            tables.append(tf.phi)
        else:
            tables.append(tuple(PHI(j, names[v], VARIANCE) for j in range(tf.degree + 1)))
    return tables


def npoint_definition(f: NPoint, tf: TensorForm) -> sp.Expr:
    """``f`` as a polynomial in the covariance entries ``C_{vw}`` of its index names."""
    names = [IDX[v] for v in f.vertices]
    cov = {(a, b): COV[names[a], names[b]] for a in range(len(names))
           for b in range(len(names)) if a < b}
    variances = [COV[x, x] for x in names]
    return sp.expand(f.expression(cov, variances, _vertex_phi_symbols(f, tf, names)))


def tensor_equations(model: Model):
    """Width-independent risk and ODEs of ``model`` (see :func:`_tensor_equations`).

    For erf (erf(z/√2)), ReLU and their mixed pairs the ODE is the same index
    sum and the definitions are the closed forms of :func:`special_definitions`.
    """
    if not model.is_polynomial:
        risk, dQ, drho, da = _display_drift(model.stand_in())
        return risk, dQ, drho, da, special_definitions(model.activation,
                                                       model.teacher_activation)
    risk, dQ, drho, da, definitions = _tensor_equations(
        tuple(model.activation), tuple(model.teacher_activation), model.stand_in())
    return risk, dQ, drho, da, dict(definitions)


#: Display functions of the folded erf-student four-point function: ``Λ(k, l) =
#: det(I + C_{kl})`` and ``N(k, l, a, b) = Λ C'_ab`` (:func:`symquad.symbolic.special.fold_definitions`).
LAMBDA_F, N_F = sp.Function("Lambda"), sp.Function("N")
#: Roles of the summed fields in a mixed pair: ``I_2^{st}(a, b)`` for a student ``a`` and a
#: teacher ``b``, etc.
ROLE_FUNCTIONS = {(name, role): sp.Function(f"{name}^{{{role}}}")
                  for name in ("I_2", "I_3", "I_4") for role in ("ss", "st", "tt", "s", "t")}


def _special_display(expr):
    """Covariance symbols ``C_vw`` of :mod:`symquad.symbolic.special` → ``C[v, w]`` (Indexed)."""
    sub = {}
    for sym in expr.free_symbols:
        name = sym.name
        if name.startswith("C_") and len(name) == 4:
            sub[sym] = COV[IDX[name[2]], IDX[name[3]]]
    Lam, Naa, Nab, Nbb = S.FOLD_SYMBOLS
    k, l, a, b = (IDX[x] for x in "klab")
    sub.update({Lam: LAMBDA_F(k, l), Naa: N_F(k, l, a, a), Nab: N_F(k, l, a, b),
                Nbb: N_F(k, l, b, b)})
    return expr.xreplace(sub)


#: Value of a definition without a closed form (display).
NO_CLOSED_FORM = sp.Symbol(r"\text{no closed form: one-dimensional quadrature (docs/"
                           r"special\_activations.md)}")


#: Value of a definition that closes but is not implemented (display).
NOT_IMPLEMENTED_FORM = sp.Symbol(r"\text{closes, not implemented (docs/special\_activations.md)}")


def _special_four_point(f, g, h):
    """The displayed ``I_4`` of one role: closed (folded for erf), or a marker."""
    if f == "erf":
        # the kernels' atan2(y, x) (consistent at singular covariances) displayed as
        # the asin(y/√(x² + y²)) it equals
        return S.four_point_folded(g, h).replace(
            lambda e: isinstance(e, sp.atan2),
            lambda e: sp.asin(e.args[0] / sp.sqrt(sp.expand(e.args[0]**2 + e.args[1]**2))))
    if f == "relu" and isinstance(g, str) != isinstance(h, str):
        return NOT_IMPLEMENTED_FORM
    try:
        return S.four_point(f, g, h, expand=False)
    except S.NotClosedError:
        return NO_CLOSED_FORM


@lru_cache(maxsize=16)
def _special_definitions(student, teacher):
    f, t = S.activation_key(student), S.activation_key(teacher)
    k, l, j, a, b = (IDX[x] for x in "kljab")
    same = f == t
    defs = {}
    for role, (g, h) in ((("ss", "st", "tt")[i], pair) for i, pair in
                         enumerate(((f, f), (f, t), (t, t)))):
        if same and role != "ss":
            continue
        key = I2F(a, b) if same else ROLE_FUNCTIONS[("I_2", role)](a, b)
        defs[key] = S.two_point(g, h)
    defs[J2F(k, l)] = S.noise_two_point(f)
    for role, g in (("s", f), ("t", t)):
        if same and role == "t":
            continue
        key = I3F(k, j, a) if same else ROLE_FUNCTIONS[("I_3", role)](k, j, a)
        defs[key] = S.three_point(f, g)
    for role, (g, h) in (("ss", (f, f)), ("st", (f, t)), ("tt", (t, t))):
        if same and role != "ss":
            continue
        key = I4F(k, l, a, b) if same else ROLE_FUNCTIONS[("I_4", role)](k, l, a, b)
        defs[key] = _special_four_point(f, g, h)
        if isinstance(f, tuple) and h == "relu" and g == "relu":
            merged = ROLE_FUNCTIONS[("I_4", role)](k, l, a, a) if not same else I4F(k, l, a, a)
            defs[merged] = S.four_point_merged_teacher(f, "relu")
    if f == "erf":
        Lam, Nab = fold_display()
        defs[LAMBDA_F(k, l)] = Lam
        defs[N_F(k, l, a, b)] = Nab
    return tuple((key, _special_display(value)) for key, value in defs.items())


def fold_display():
    r"""``Λ(k,l) = (1 + C_kk)(1 + C_ll) − C_kl²`` and ``N(k,l,a,b) = Λ C_ab − x_aᵀ adj(M) x_b``
    in readable (unexpanded) form, ``x_v = (C_kv, C_lv)``, ``M = I + C_{kl}``; equal to
    :func:`symquad.symbolic.special.fold_definitions` when expanded (tested)."""
    s = S.cov_symbols("k", "l", "a", "b")
    Ckk, Ckl, Cll = s[("k", "k")], s[("k", "l")], s[("l", "l")]
    Lam = sp.Mul(1 + Ckk, 1 + Cll, evaluate=False) - Ckl**2
    xa, xb = (s[("k", "a")], s[("l", "a")]), (s[("k", "b")], s[("l", "b")])
    quad = ((1 + Cll) * xa[0] * xb[0] + (1 + Ckk) * xa[1] * xb[1]
            - Ckl * (xa[0] * xb[1] + xa[1] * xb[0]))
    return Lam, S.FOLD_SYMBOLS[0] * s[("a", "b")] - quad


def special_definitions(student, teacher) -> dict:
    r"""Displayed definitions of ``I_2, J_2, I_3, I_4`` for a pair with erf or ReLU.

    Closed forms of :mod:`symquad.symbolic.special` in the entries ``C_{vw}``
    of the combined covariance.  When ``σ ≠ σ*`` each function has one variant
    per role of its summed fields (``I_2^{ss}``, ``I_2^{st}``, ``I_2^{tt}``,
    ``I_3^{s}``, ``I_3^{t}``, ``I_4^{ss}``, …; students ``a ≤ p``), and the ODE's
    ``I_2(a, b)`` means the variant of the roles of ``a, b``.  An erf student's
    ``I_4`` is given in the folded form with ``Λ(k, l)`` and ``N(k, l, a, b)``
    (defined once); a ReLU student's ``I_4`` with non-polynomial teachers has
    no closed form (:data:`NO_CLOSED_FORM`); a polynomial student with a ReLU
    teacher has the merged form at ``a = b``.
    """
    return dict(_special_definitions(student, teacher))


def _display_drift(probe):
    """The ODE as index sums of ``I_2, J_2, I_3, I_4`` (independent of the activations).

    The moment kinds are expectations against the loss's error signal ``e = c ŷ − y``
    (``c`` of :func:`symquad.spec.error_signal_weight`): their sums weight a student
    field ``a <= p`` by ``c w_a`` and a teacher field by ``w_a``, so for ``c ≠ 1`` each sum
    splits at ``p`` (``c = 0``, the correlation loss: the teacher fields alone); the risk
    keeps ``w`` (the square-loss error).
    """
    k, l, j, a, b, m = (IDX[x] for x in "kljabm")
    over_a, over_b = (a, 1, N_FIELDS), (b, 1, N_FIELDS)
    c = sp.Integer(error_signal_weight(probe))

    def error_sum(summand, *indices):
        """``Σ e_{i_1}/w_{i_1} ⋯ summand`` over the error's weights: ``c`` on students."""
        if c == 1:
            return sp.Sum(summand, *[(i, 1, N_FIELDS) for i in indices])
        total = sp.Integer(0)
        for students in product((True, False), repeat=len(indices)):
            weight = c ** sum(students)
            if weight != 0:
                total += weight * sp.Sum(summand, *[(i, 1, P) if s else (i, P + 1, N_FIELDS)
                                                    for i, s in zip(indices, students)])
        return total

    def three(x, y):
        return error_sum(WEIGHT[a] * I3F(x, y, a), a)

    def four(x, y):
        return (error_sum(WEIGHT[a] * WEIGHT[b] * I4F(x, y, a, b), a, b)
                + NOISE * J2F(x, y))

    def two(x):
        return error_sum(WEIGHT[a] * I2F(x, a), a)

    K, L, M = sp.symbols("k l m", integer=True, positive=True)
    index = {K: k, L: l, M: m}
    table = {MG: lambda x, y: three(index[x], index[y]),
             MGT: lambda x, y: three(index[x], P + index[y]),
             MB: lambda x, y: four(index[x], index[y]),
             MR: lambda x: two(index[x]),
             Qf: lambda x, y: COV[index[x], index[y]],
             RHOf: lambda x, y: COV[index[x], P + index[y]],
             Af: lambda x: READOUT[index[x]]}
    md = moment_drift(probe)

    def display(expr):
        if expr is None:
            return None
        return expr.replace(lambda e: e.func in table, lambda e: table[e.func](*e.args))
    risk = sp.Rational(1, 2) * sp.Sum(WEIGHT[a] * WEIGHT[b] * I2F(a, b), over_a, over_b)
    return risk, display(md.dQ), display(md.drho), display(md.da)


#: ``φ_j^{(a)}(D)``: vertex function ``j`` of field ``a``'s activation (display only).
PHI = sp.Function("varphi")
#: Student readout ``a_k`` (display), and teacher index offset.
READOUT = sp.IndexedBase("a")


@lru_cache(maxsize=32)
def _tensor_equations(activation, teacher_activation, probe):
    """Width-independent risk and ODEs as SymPy expressions with index sums.

    The drift is :func:`symquad.symbolic.moments.moment_drift` with each moment
    kind written as its index sum of ``I_2, J_2, I_3, I_4``.

    Returns
    -------
    risk, dQ, drho, da : Expr
        ``dQ`` stands for ``dQ_kl/dt``, ``drho`` for ``dρ_km/dt`` (field index
        ``p + m``), ``da`` for ``da_k/dt`` (None for a fixed readout); sums run
        over ``a, b = 1..n``; ``w_a`` are the output weights ``(a, −b)``.
    definitions : tuple of (Expr, Expr)
        ``I_2(a,b) = polynomial``, ``J_2(k,l)``, ``I_3(k,j,a)``, ``I_4(k,l,a,b)``
        (and, when ``σ ≠ σ*``, the vertex functions of both activations).
    """
    tf = derive_tensor_form(activation, teacher_activation)
    k, l, j, a, b = (IDX[x] for x in "kljab")
    definitions = {
        I2F(a, b): npoint_definition(tf.I2, tf),
        J2F(k, l): npoint_definition(tf.J2, tf),
        I3F(k, j, a): npoint_definition(tf.I3, tf),
        I4F(k, l, a, b): npoint_definition(tf.I4, tf),
    }
    if not tf.same_activation:
        for name, table in (("student", tf.phi), ("teacher", tf.phi_teacher)):
            for order, f in enumerate(table):
                definitions[PHI(order, sp.Symbol(name), VARIANCE)] = f
    risk, dQ, drho, da = _display_drift(probe)
    return risk, dQ, drho, da, tuple(definitions.items())


# ---- multiprecision reference (conditioning of the float64 kernels) ----------------

def _mp_function(f: NPoint):
    """``f`` lambdified with exact rational coefficients (mpmath printer).

    The returned ``call(C, phi, idx)`` takes the covariance as a numpy object
    array of mpf, the vertex-function values ``phi[a][j] = φ_j(D_a)`` of every
    field (an object array, each field with its own activation) and, per
    vertex, an index or an index array; numpy broadcasts the vertex indices,
    so one call evaluates ``f`` over a whole index grid (element by element in
    mpf arithmetic).
    """
    nv = len(f.vertices)
    order = [(a, b) for a in range(nv) for b in range(a + 1, nv)]
    cov_args = {pair: sp.Dummy(f"c{pair[0]}{pair[1]}") for pair in order}
    top = 1 + max((j for _, orders in f.terms for j in orders if j is not None), default=0)
    phi_args = [[sp.Dummy(f"f{v}_{j}") for j in range(top)] for v in range(nv)]
    expr = f.expression(cov_args, [None] * nv, phi_args)
    flat_phi = [s for row in phi_args for s in row]
    fn = sp.lambdify(list(cov_args.values()) + flat_phi, expr, "mpmath")

    def call(C, phi, idx):
        args = [C[idx[a], idx[b]] for a, b in order]
        args += [phi[idx[v], j] for v in range(nv) for j in range(top)]
        return fn(*args)
    return call


def reference_entries(model: Model, Q, rho, T, dq_entries=(), drho_entries=(),
                      risk: bool = False, dps: int = 40, readout=None,
                      da_entries=()) -> dict:
    r"""Selected ODE entries evaluated in ``dps``-digit arithmetic (mpmath).

    Evaluates the derived polynomials ``I_2, J_2, I_3, I_4`` (expanded in the
    covariance entries, as printed by ``symquad equations``) at every index
    combination, sums them into the moment kinds with :func:`mpmath.fsum` —
    without the kernels' grouping into Hadamard powers, pair sums and matrix
    products — and combines the moments with the one assembly of the drift
    (:func:`symquad.symbolic.moments.moment_drift`): a second route for the
    kernels and the yardstick of their float64 rounding error.  Cost ``O(n²)``
    mpf operations per ``dQ`` entry and for the risk, ``O(n)`` per ``dρ`` entry.

    Parameters
    ----------
    readout : array_like, optional
        The student readout ``a`` (default the model's, exactly).

    Returns
    -------
    dict
        ``{("dQ", k, l): mpf, ("drho", k, m): mpf, ("da", k): mpf, ("risk",): mpf}``
        (0-based indices).
    """
    import mpmath
    import numpy as np
    tf = derive_tensor_form(model.activation, model.teacher_activation)
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
        a_vals = ([mp(c.numerator) / c.denominator for c in model.readout] if readout is None
                  else [mp(float(x)) for x in np.asarray(readout, float)])
        w = np.array(a_vals + [-mp(c.numerator) / c.denominator for c in model.teacher_readout],
                     dtype=object)
        D = sp.Symbol("D")
        top = tf.degree + 2
        phi = np.empty((n, top), dtype=object)
        for field in range(n):
            table = tf.phi if field < p else tf.phi_teacher
            for j in range(top):
                f = table[j] if j < len(table) else sp.Integer(0)
                phi[field, j] = sp.lambdify(VARIANCE, f, "mpmath")(C[field, field]) \
                    if f.free_symbols else mp(sp.Rational(f).p) / sp.Rational(f).q
        params = model.kernel_params()
        values = {sym: mp(float(params[sym.name])) for sym in PARAMS}
        I2, J2, I3, I4 = (_mp_function(getattr(tf, name)) for name in ("I2", "J2", "I3", "I4"))
        a_col, b_row = np.arange(n)[:, None], np.arange(n)[None, :]
        a_all = np.arange(n)
        ww = w[:, None] * w[None, :]
        # the moment kinds are taken against the loss's error signal e = c yhat - y: the
        # students' weights times c (spec.error_signal_weight); the risk keeps w
        c = error_signal_weight(model)
        we = np.array([c * x for x in w[:p]] + list(w[p:]), dtype=object)
        wwe = we[:, None] * we[None, :]

        def total(x):
            return mpmath.fsum(np.broadcast_to(x, (n,) * np.ndim(x)).ravel())

        def moment(func, *units):
            if func is MG:
                return total(we * I3(C, phi, (units[0], units[1], a_all)))
            if func is MGT:
                return total(we * I3(C, phi, (units[0], p + units[1], a_all)))
            if func is MB:
                return (total(wwe * I4(C, phi, (units[0], units[1], a_col, b_row)))
                        + values[PARAMS[1]] * J2(C, phi, units))
            return total(we * I2(C, phi, (units[0], a_all)))

        md = moment_drift(model)

        def evaluate(expr, k, l, m):
            unit = {sp.Symbol("k", integer=True, positive=True): k,
                    sp.Symbol("l", integer=True, positive=True): l,
                    sp.Symbol("m", integer=True, positive=True): m}
            cache = {}

            def value(e):
                args = tuple(unit[x] for x in e.args)
                if e.func is Qf:
                    return C[args[0], args[1]]
                if e.func is RHOf:
                    return C[args[0], p + args[1]]
                if e.func is Af:
                    return w[args[0]]
                key = (e.func, args)
                if key not in cache:
                    cache[key] = moment(e.func, *args)
                return cache[key]
            atoms = sorted(expr.atoms(sp.Function), key=sp.default_sort_key)
            dummies = [sp.Dummy() for _ in atoms]
            fn = sp.lambdify(dummies + list(PARAMS), expr.xreplace(dict(zip(atoms, dummies))),
                             "mpmath")
            return fn(*[value(e) for e in atoms], *[values[s] for s in PARAMS])

        out = {}
        for k, l in dq_entries:
            out[("dQ", k, l)] = evaluate(md.dQ, k, l, 0)
        for k, m in drho_entries:
            out[("drho", k, m)] = evaluate(md.drho, k, k, m)
        for k in da_entries:
            out[("da", k)] = evaluate(md.da, k, k, 0)
        if risk:
            out[("risk",)] = total(ww * I2(C, phi, (a_col, b_row))) / 2
        return out
