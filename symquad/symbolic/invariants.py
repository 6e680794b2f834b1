r"""Symbolic proof that ``S = ρ(ρᵀρ)^{-1/2}`` is conserved, and where it is not.

The ODE is never typed by hand here: every step takes ``(dQ/dt, dρ/dt)`` from
``symquad.derive(model).explicit()`` (η and Δ symbolic, so the η² term and the
label noise are included) and substitutes structured points into it.

Statement (σ(z) = c z², any η > 0, Δ ≥ 0, p ≥ p*)
--------------------------------------------------
Write ``ρ = S P`` (polar decomposition, ``P = (ρᵀρ)^{1/2} ≻ 0``), ``Π = SSᵀ`` and
``A = SᵀQS``.  Let

.. math:: \mathcal I_T = \{(Q, ρ):\ \operatorname{rank}ρ = p^*,\ [Q, Π] = 0,\
          [A, P] = [A, T] = [P, T] = 0\}.

1. *Instantaneous condition.*  ``dS/dt = 0`` iff ``(I − Π)ρ̇ = 0`` and ``Sᵀρ̇`` is
   symmetric.  In the gauge ``ρ = [P; 0]`` the derived ODE gives
   ``(I−Π)ρ̇ = κ₀ Q₂₁ P`` and ``Sᵀρ̇ − ρ̇ᵀS = κ₁[A, P] + κ₂[P, T]`` with explicit
   constants ``κ₀, κ₁ ≠ 0``.  Hence for ``T ∝ I``: ``dS/dt = 0 ⇔ (Q, ρ) ∈ I_T``.
2. *Invariance.*  The ODE is ``O(p) × O(p*)`` equivariant (checked
   infinitesimally and for one reflection each); every point of ``I_T`` is
   mapped by the group into the linear subspace ``D`` of diagonal ``Q``, ``T`` and
   ``ρ = [diag(π); 0]``; the vector field is tangent to ``D`` and
   ``dπ_i/dt = π_i g_i`` with ``g_i`` polynomial, so ``π_i`` keeps its sign.
   Hence ``I_T`` is invariant and ``S(t) = S(0)`` for every start in ``I_T``.
3. *Counterexamples* (exact rationals): dropping ``[Q, Π] = 0``, or ``[A, P] = 0``,
   or ``[P, T] = 0`` gives ``dS/dt ≠ 0`` at realisable points.

So for ``T ∝ I`` the conserved-S starts are exactly those with ``Q`` block
diagonal w.r.t. ``span ρ ⊕ (span ρ)^⊥`` and ``SᵀQS`` commuting with ``ρᵀρ``;
the part of ``Q`` orthogonal to ``span ρ`` need *not* be isotropic
(``Q = cI + ρMρᵀ`` qualifies iff ``[M, ρᵀρ] = 0``).  For ``T`` not ∝ I the
instantaneous condition (``Q₂₁ = 0``, ``κ₁[A, P] + κ₂[P, T] = 0``) is weaker than
``I_T``; only the sufficiency of ``I_T`` is proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import sympy as sp

from ..applicability import RULES, check
from ..spec import Model, check_model, require
from .symbols import BATCH
from .latex import latex_names_for
from .latex import to_latex
from .latex import LINE_WIDTH_PT, tex_width
from .._describe import describe_model
from .latex import align_rows, display_rhs
from .latex import document
from .symbols import readout_symbols
from .derive import derive

#: ``1/b`` of a mini-batch as one symbol (the proof's polynomial arithmetic needs it).
INVERSE_BATCH = sp.Symbol("inverse_batch_size", positive=True)

__all__ = [
    "ProofError", "ConservationProof", "prove_conservation", "ode_explicit",
    "instantaneous_condition", "diagonal_gauge_invariance", "equivariance",
    "exact_dS_dt", "counterexamples", "positive_control", "cayley_orthogonal",
    "conservation_latex", "typical_start", "start_counterexample", "ConservationVerdict",
    "conservation_verdict",
]


class ProofError(AssertionError):
    """A step of a symbolic proof did not hold."""


# ----------------------------------------------------------------------------
# the ODE, from the symbolic core
# ----------------------------------------------------------------------------
@lru_cache(maxsize=None)
def ode_explicit(m: Model):
    """``(dQ, drho, (Q, rho, T), eta, noise)`` from ``symquad.derive(m).explicit()``.

    The ODE of the proof steps: the model's changes must be those the theorem is
    derived for (:data:`symquad.applicability.RULES` ``["conservation"]``).
    """
    check_model(m, "m")
    check(m, "the conservation proof", "conservation")
    if not m.is_quadratic:
        raise ValueError(
            f"the conservation of S is derived for sigma(z) = c z**2 (+ c0); the model has "
            f"activation {m.activation_str!r}")
    if m.p < m.p_star:
        raise ValueError(
            f"S = rho (rho^T rho)^(-1/2) needs p >= p_star (rank rho = p_star); got p={m.p}, "
            f"p_star={m.p_star}")
    eq = derive(m)
    _, dQ, drho = eq.explicit()[:3]
    # the batch size enters as 1/b: a symbol for 1/b keeps the drift polynomial
    inv = {BATCH: 1 / INVERSE_BATCH}
    dQ, drho = (sp.Matrix(X).xreplace(inv).applyfunc(sp.expand) for X in (dQ, drho))
    return sp.ImmutableMatrix(dQ), sp.ImmutableMatrix(drho), eq.entry_symbols, eq.eta, eq.noise


def _subs(m, Q=None, rho=None, T=None):
    """Map entry symbols to the given values (upper triangles of Q and T)."""
    dQ, drho, (Qs, rs, Ts), _, _ = ode_explicit(m)
    out = {}
    if Q is not None:
        out.update({Qs[i, j]: Q[i, j] for i in range(m.p) for j in range(i, m.p)})
    if rho is not None:
        out.update({rs[i, a]: rho[i, a] for i in range(m.p) for a in range(m.p_star)})
    if T is not None:
        out.update({Ts[a, b]: T[a, b] for a in range(m.p_star) for b in range(a, m.p_star)})
    return out


def _rhs_at(m, Q=None, rho=None, T=None):
    dQ, drho, _, _, _ = ode_explicit(m)
    s = _subs(m, Q, rho, T)
    return (dQ.xreplace(s).applyfunc(sp.expand), drho.xreplace(s).applyfunc(sp.expand))


def _sym_matrix(name, n, **assumptions):
    return sp.Matrix(n, n, lambda i, j: sp.Symbol(f"{name}_{min(i, j) + 1}{max(i, j) + 1}",
                                                  **assumptions))


def _comm(X, Y):
    return X * Y - Y * X


def _solve_ansatz(residual: sp.Matrix, unknowns, gens):
    """Solve ``residual ≡ 0`` (as polynomials in ``gens``) for ``unknowns``; unique or error."""
    eqs = set()
    for e in residual:
        e = sp.expand(e)
        if e == 0:
            continue
        eqs.update(sp.Poly(e, *gens).coeffs())
    if not eqs:
        return {u: sp.Integer(0) for u in unknowns}, True
    sol = sp.solve(list(eqs), unknowns, dict=True)
    if len(sol) != 1 or set(sol[0]) != set(unknowns):
        raise ProofError(f"ansatz has no unique solution for {unknowns}: {sol}")
    return sol[0], False


# ----------------------------------------------------------------------------
# step 1: the instantaneous condition
# ----------------------------------------------------------------------------
def instantaneous_condition(m: Model) -> dict:
    r"""``(I−Π)ρ̇`` and ``Sᵀρ̇ − ρ̇ᵀS`` at ``ρ = [P; 0]`` (``S = E = [I; 0]``).

    ``P`` is a general symmetric matrix (symbols ``pi_ab``); ``Q`` and ``T`` are
    the general entry symbols.  Finds by ansatz and verifies identically:

    ``ρ̇[p*:, :] = κ₀ Q₂₁ P`` and ``ρ̇[:p*, :] − ρ̇[:p*, :]ᵀ = κ₁ [A, P] + κ₂ [P, T]``
    where ``A = Q[:p*, :p*]`` and ``Q₂₁ = Q[p*:, :p*]``.
    """
    dQ, drho, (Qs, rs, Ts), eta, _ = ode_explicit(m)
    p, k = m.p, m.p_star
    Pm = _sym_matrix("pi", k, real=True)
    rho_g = sp.Matrix.vstack(Pm, sp.zeros(p - k, k))
    _, rdot = _rhs_at(m, rho=rho_g)
    A = sp.Matrix(Qs)[:k, :k]
    Q21 = sp.Matrix(Qs)[k:, :k]
    T = sp.Matrix(Ts)
    gens = sorted(set(Pm.free_symbols) | set(Qs.free_symbols) | set(Ts.free_symbols),
                  key=lambda s: s.name)
    k0, k1, k2 = sp.symbols("kappa_0 kappa_1 kappa_2")
    lower = rdot[k:, :]
    if p > k:
        sol0, _ = _solve_ansatz(lower - k0 * Q21 * Pm, [k0], gens)
        kappa0 = sp.factor(sol0[k0])
    else:
        kappa0 = None
    upper = rdot[:k, :]
    K = upper - upper.T
    if k > 1:
        sol12, _ = _solve_ansatz(K - k1 * _comm(A, Pm) - k2 * _comm(Pm, T), [k1, k2], gens)
        kappa1, kappa2 = sp.factor(sol12[k1]), sp.factor(sol12[k2])
    else:
        if any(sp.expand(e) != 0 for e in K):
            raise ProofError("1x1 S^T rho_dot - rho_dot^T S must vanish")
        kappa1 = kappa2 = None
    for name, val in (("kappa_0", kappa0), ("kappa_1", kappa1)):
        if val is not None and sp.simplify(val.subs(eta, 1)) == 0:
            raise ProofError(f"{name} vanishes: the condition would not be necessary")
    return {"P": Pm, "rho": rho_g, "rho_dot": rdot, "kappa0": kappa0, "kappa1": kappa1,
            "kappa2": kappa2, "A": A, "Q21": Q21, "T": T, "eta": eta}


# ----------------------------------------------------------------------------
# step 2: invariance (diagonal gauge + equivariance)
# ----------------------------------------------------------------------------
def diagonal_gauge_invariance(m: Model) -> dict:
    r"""Tangency of the ODE to ``D = {Q, T diagonal, ρ = [diag(π); 0]}``.

    Returns the reduced ODE on ``D`` (``dα_i``, ``dβ_j``, ``dπ_i``) and the growth
    rates ``g_i = (dπ_i/dt)/π_i`` (verified to be polynomials).  Raises
    :class:`ProofError` if an off-diagonal entry of ``dQ`` or ``dρ`` is not
    identically zero on ``D``.
    """
    p, k = m.p, m.p_star
    alpha = sp.symbols(f"alpha_1:{k + 1}", real=True)
    beta = sp.symbols(f"beta_1:{p - k + 1}", real=True) if p > k else ()
    pis = sp.symbols(f"pi_1:{k + 1}", positive=True)
    taus = sp.symbols(f"tau_1:{k + 1}", positive=True)
    Q = sp.diag(*alpha, *beta)
    rho = sp.Matrix.vstack(sp.diag(*pis), sp.zeros(p - k, k))
    T = sp.diag(*taus)
    Qd, rd = _rhs_at(m, Q, rho, T)
    bad = [(f"dQ[{i},{j}]", Qd[i, j]) for i in range(p) for j in range(p)
           if i != j and Qd[i, j] != 0]
    bad += [(f"drho[{i},{a}]", rd[i, a]) for i in range(p) for a in range(k)
            if i != a and rd[i, a] != 0]
    if bad:
        raise ProofError(f"vector field not tangent to the diagonal gauge: {bad[:3]}")
    growth = []
    for a in range(k):
        g = sp.cancel(rd[a, a] / pis[a])
        if sp.denom(g).has(pis[a]):
            raise ProofError(f"d pi_{a + 1}/dt is not divisible by pi_{a + 1}")
        growth.append(sp.expand(g))
    return {"alpha": alpha, "beta": beta, "pi": pis, "tau": taus,
            "dalpha": [Qd[a, a] for a in range(k)],
            "dbeta": [Qd[k + j, k + j] for j in range(p - k)],
            "dpi": [rd[a, a] for a in range(k)], "growth": growth}


def _mm(X, Y):
    """Product of matrices given as lists of lists (entries: polynomial ring elements)."""
    return [[sum((X[i][r] * Y[r][j] for r in range(len(Y))), X[i][0] * 0)
             for j in range(len(Y[0]))] for i in range(len(X))]


def _madd(X, Y, sign=1):
    return [[x + sign * y for x, y in zip(rx, ry)] for rx, ry in zip(X, Y)]


def equivariance(m: Model) -> dict:
    r"""``O(p) × O(p*)`` equivariance of the derived ODE.

    Action ``(U, V)·(Q, ρ, T) = (UQUᵀ, UρV, VᵀTV)``.  Checked (i) infinitesimally
    for each basis generator ``Ω = E_ij − E_ji`` of ``so(p)`` and ``Θ`` of
    ``so(p*)``: ``DF(x)[ξ(x)] = (ΩQ̇ − Q̇Ω, Ωρ̇ + ρ̇Θ)`` with
    ``ξ = (ΩQ − QΩ, Ωρ + ρΘ, TΘ − ΘT)``, as an identity of polynomials in all
    entries and η, Δ (sparse polynomial arithmetic over ℚ), and (ii) for the
    reflections ``U = diag(−1, 1, …)``, ``V = diag(−1, 1, …)`` (exact
    substitution).  Together these give the whole group ``O(p) × O(p*)``.
    """
    dQ, drho, (Qs, rs, Ts), eta, noise = ode_explicit(m)
    p, k = m.p, m.p_star
    # every parameter that stays a symbol (η, Δ, and λ, b when switched on)
    syms = sorted(set(Qs.free_symbols) | set(rs.free_symbols) | set(Ts.free_symbols)
                  | {eta, noise} | dQ.free_symbols | drho.free_symbols, key=lambda s: s.name)
    R, *_ = sp.ring(syms, sp.QQ)
    conv = {s: R(s) for s in syms}

    def ring_matrix(M):
        return [[R.from_expr(M[i, j]) if M[i, j] != 0 else R(0) for j in range(M.shape[1])]
                for i in range(M.shape[0])]

    Qm = [[conv[Qs[i, j]] for j in range(p)] for i in range(p)]
    Rm = [[conv[rs[i, a]] for a in range(k)] for i in range(p)]
    Tm = [[conv[Ts[a, b]] for b in range(k)] for a in range(k)]
    dQm, dRm = ring_matrix(dQ), ring_matrix(drho)
    variables = ([(conv[Qs[i, j]], (i, j), "Q") for i in range(p) for j in range(i, p)]
                 + [(conv[rs[i, a]], (i, a), "rho") for i in range(p) for a in range(k)]
                 + [(conv[Ts[a, b]], (a, b), "T") for a in range(k) for b in range(a, k)])
    jac_Q = {v: [[e.diff(v) for e in row] for row in dQm] for v, _, _ in variables}
    jac_R = {v: [[e.diff(v) for e in row] for row in dRm] for v, _, _ in variables}

    def const(M):
        return [[R(int(M[i, j])) for j in range(M.shape[1])] for i in range(M.shape[0])]

    def check(Om, Th):
        Om, Th = const(Om), const(Th)
        xi = {"Q": _madd(_mm(Om, Qm), _mm(Qm, Om), -1),
              "rho": _madd(_mm(Om, Rm), _mm(Rm, Th)),
              "T": _madd(_mm(Tm, Th), _mm(Th, Tm), -1)}
        lhs_Q = [[R(0)] * p for _ in range(p)]
        lhs_R = [[R(0)] * k for _ in range(p)]
        for v, (i, j), kind in variables:
            c = xi[kind][i][j]
            if c:
                lhs_Q = _madd(lhs_Q, [[e * c for e in row] for row in jac_Q[v]])
                lhs_R = _madd(lhs_R, [[e * c for e in row] for row in jac_R[v]])
        res_Q = _madd(lhs_Q, _madd(_mm(Om, dQm), _mm(dQm, Om), -1), -1)
        res_R = _madd(lhs_R, _madd(_mm(Om, dRm), _mm(dRm, Th)), -1)
        return not any(e for row in res_Q + res_R for e in row)

    n_gen = 0
    for i in range(p):
        for j in range(i + 1, p):
            Om = sp.zeros(p, p)
            Om[i, j], Om[j, i] = 1, -1
            if not check(Om, sp.zeros(k, k)):
                raise ProofError(f"not so(p)-equivariant for generator ({i},{j})")
            n_gen += 1
    for a in range(k):
        for b in range(a + 1, k):
            Th = sp.zeros(k, k)
            Th[a, b], Th[b, a] = 1, -1
            if not check(sp.zeros(p, p), Th):
                raise ProofError(f"not so(p*)-equivariant for generator ({a},{b})")
            n_gen += 1
    # reflections (one per factor) generate the other connected components
    Qe, Re, Te = sp.Matrix(Qs), sp.Matrix(rs), sp.Matrix(Ts)
    for U, V in ((sp.diag(-1, *([1] * (p - 1))), sp.eye(k)),
                 (sp.eye(p), sp.diag(-1, *([1] * (k - 1))))):
        Qd, Rd = _rhs_at(m, U * Qe * U.T, U * Re * V, V.T * Te * V)
        if not ((Qd - U * sp.Matrix(dQ) * U.T).applyfunc(sp.expand).is_zero_matrix
                and (Rd - U * sp.Matrix(drho) * V).applyfunc(sp.expand).is_zero_matrix):
            raise ProofError("not equivariant under a reflection")
    return {"generators_checked": n_gen, "reflections_checked": 2}


# ----------------------------------------------------------------------------
# exact dS/dt at rational points
# ----------------------------------------------------------------------------
def cayley_orthogonal(K: sp.Matrix) -> sp.Matrix:
    """Rational orthogonal matrix ``(I − K)(I + K)^{-1}`` from a skew ``K``."""
    n = K.shape[0]
    if (K + K.T) != sp.zeros(n, n):
        raise ValueError("K must be skew-symmetric")
    return (sp.eye(n) - K) * (sp.eye(n) + K).inv()


def exact_dS_dt(m: Model, Q, S, P, T):
    r"""Exact ``dS/dt`` at ``ρ = S P`` (``SᵀS = I``, ``P ≻ 0`` symmetric, rational).

    ``Ṡ = (I − SSᵀ)ρ̇P⁻¹ + SΩ`` with ``ΩP + PΩ = Sᵀρ̇ − ρ̇ᵀS`` solved exactly for the
    skew ``Ω``.  η stays symbolic.  Also returns whether ``[[Q, ρ],[ρᵀ, T]] ⪰ 0``.
    """
    Q, S, P, T = (sp.Matrix(X) for X in (Q, S, P, T))
    p, k = m.p, m.p_star
    if (S.T * S - sp.eye(k)).applyfunc(sp.simplify) != sp.zeros(k, k):
        raise ValueError("S must have orthonormal columns")
    rho = S * P
    _, rdot = _rhs_at(m, Q, rho, T)
    dS = _polar_map(S, P, rdot).applyfunc(sp.factor)
    C = sp.Matrix(sp.BlockMatrix([[Q, rho], [rho.T, T]]))
    realisable = all(sp.Matrix(C[:j, :j]).det() >= 0 for j in range(1, C.shape[0] + 1)) \
        and all(ev >= 0 for ev in C.eigenvals(multiple=True) if ev.is_real)
    return dS, rho, realisable


def _diag_rational(n, start):
    return sp.diag(*[sp.Rational(1, start + i) for i in range(n)])


def counterexamples(m: Model) -> list:
    r"""Exact realisable points outside ``I_T`` with ``dS/dt ≠ 0`` (one per dropped condition).

    * ``"Q couples span ρ to its complement"`` (needs ``p > p*``): ``T = I``,
      ``ρ = [P; 0]`` with ``P = diag(1/2, 1/3, …)``, ``Q = I + ¼(e_{p*+1}e_1ᵀ + e_1e_{p*+1}ᵀ)``.
    * ``"SᵀQS does not commute with ρᵀρ"`` (needs ``p* ≥ 2``): ``T = I``, same ``P``,
      ``Q = I + ¼(e_1e_2ᵀ + e_2e_1ᵀ)``.
    * ``"T not ∝ I, not commuting with ρᵀρ"`` (needs ``p* ≥ 2``): ``Q = I``,
      ``T = diag(1, 2, 1, …)``, ``P = diag(1/2, 1/3, …) + ⅛(e_1e_2ᵀ + e_2e_1ᵀ)``.

    Each entry: ``name``, ``Q``, ``rho``, ``T``, ``dS`` (exact, η symbolic),
    ``realisable`` (the Gram matrix is PSD) and ``nonzero``.
    """
    p, k = m.p, m.p_star
    E = sp.Matrix.vstack(sp.eye(k), sp.zeros(p - k, k))
    P0 = _diag_rational(k, 2)
    cases = []
    if p > k:
        Q = sp.eye(p)
        Q[k, 0] = Q[0, k] = sp.Rational(1, 4)
        cases.append(("Q couples span(rho) to its orthogonal complement",
                      r"$Q$ couples $\operatorname{span}\rho$ to its complement", Q, P0,
                      sp.eye(k)))
    if k >= 2:
        Q = sp.eye(p)
        Q[0, 1] = Q[1, 0] = sp.Rational(1, 4)
        cases.append(("S^T Q S does not commute with rho^T rho",
                      r"$S^\top QS$ does not commute with $\rho^\top\rho$", Q, P0, sp.eye(k)))
        P1 = P0.copy()
        P1[0, 1] = P1[1, 0] = sp.Rational(1, 8)
        T = sp.eye(k)
        T[1, 1] = 2
        cases.append(("T not proportional to I and not commuting with rho^T rho",
                      r"$T\not\propto I$ does not commute with $\rho^\top\rho$",
                      sp.eye(p), P1, T))
    out = []
    for name, tex, Q, P, T in cases:
        dS, rho, ok = exact_dS_dt(m, Q, E, P, T)
        out.append({"name": name, "tex": tex, "Q": Q, "rho": rho, "T": T, "dS": dS, "realisable": ok,
                    "nonzero": not dS.is_zero_matrix})
    return out


def positive_control(m: Model) -> dict:
    r"""An exact point of ``I_T`` in general position (not in the gauge), ``dS/dt = 0``.

    ``U`` = Cayley rotation of a rational skew matrix, ``S = U E``,
    ``P = V diag(1/2, 1/3, …) Vᵀ`` with a rational rotation ``V``,
    ``A = SᵀQS = P² + ½ I`` (commutes with ``P``), ``Q = S A Sᵀ + U diag(0, q⊥) Uᵀ``
    with anisotropic ``q⊥ = (3/5, 4/5, …)``, ``T = I``.  This checks the theorem
    at a point that the diagonal-gauge computation does not see directly.
    """
    p, k = m.p, m.p_star
    Kp = sp.Matrix(p, p, lambda i, j: sp.Rational(i - j, 2 * (i + j + 1)))
    Kk = sp.Matrix(k, k, lambda i, j: sp.Rational(j - i, 3 * (i + j + 2)))
    U = cayley_orthogonal(Kp)
    V = cayley_orthogonal(Kk)
    E = sp.Matrix.vstack(sp.eye(k), sp.zeros(p - k, k))
    S = U * E
    P = V * _diag_rational(k, 2) * V.T
    A = P * P + sp.eye(k) / 2
    qperp = sp.diag(*[sp.Rational(3 + j, 5) for j in range(p - k)]) if p > k \
        else sp.zeros(0, 0)
    Q = S * A * S.T + U * sp.diag(sp.zeros(k, k), qperp) * U.T
    dS, rho, ok = exact_dS_dt(m, Q, S, P, sp.eye(k))
    return {"Q": Q, "rho": rho, "S": S, "dS": dS, "realisable": ok,
            "zero": dS.is_zero_matrix}


# ----------------------------------------------------------------------------
# the whole proof
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ConservationProof:
    """Result of :func:`prove_conservation` (every step already verified)."""

    model: Model
    instant: dict = field(repr=False)
    invariance: dict = field(repr=False)
    equivariance: dict = field(repr=False)
    counterexamples: list = field(repr=False)
    positive: dict = field(repr=False)

    def latex(self, standalone: bool = False) -> str:
        return conservation_latex(self, standalone=standalone)


def prove_conservation(m: Model, check_equivariance: bool = True) -> ConservationProof:
    """Run steps 1–3 for ``m`` with SymPy; raises :class:`ProofError` on any failure.

    Model changes that keep the theorem (docs/model.md §8.4) are handled: weight
    decay (``−ηλρ`` is ``ρB`` with ``B`` symmetric), mini-batches (only the η²
    term of ``dQ`` changes), uniform readouts and ``σ* = c* z² + c0*`` (the
    ``O(p) × O(p*)`` symmetry stays); the proof then runs on the changed ODE,
    with ``λ`` and ``b`` symbolic.  The others (non-uniform or trained readouts,
    the sphere) are refused by name: :func:`conservation_verdict` gives their
    exact counterexamples.
    """
    check(m, "prove_conservation", "conservation")
    inst = instantaneous_condition(m)
    inv = diagonal_gauge_invariance(m)
    eqv = equivariance(m) if check_equivariance else {"skipped": True}
    ces = counterexamples(m)
    for ce in ces:
        if not ce["realisable"]:
            raise ProofError(f"counterexample {ce['name']!r} is not a Gram matrix")
        if not ce["nonzero"]:
            raise ProofError(f"counterexample {ce['name']!r} has dS/dt = 0")
    pos = positive_control(m)
    if not (pos["zero"] and pos["realisable"]):
        raise ProofError("positive control: dS/dt != 0 at a point of the invariant set")
    return ConservationProof(m, inst, inv, eqv, ces, pos)


def _names(*exprs) -> dict:
    """LaTeX names of the proof's symbols; ``T``'s eigenvalues print as ``θ_j`` (τ is the clock)."""

    symbols = set()
    for e in exprs:
        symbols |= getattr(e, "free_symbols", set())
    names = latex_names_for(symbols)
    for sym in symbols:
        head, _, index = getattr(sym, "name", "").partition("_")
        if head == "tau" and index.isdigit():
            names[sym] = rf"\theta_{{{index}}}"
    return names


def _tex(expr, names=None) -> str:

    # the proof works with 1/b as a symbol: print it as 1/B
    expr = expr.xreplace({INVERSE_BATCH: 1 / BATCH}) if hasattr(expr, "xreplace") else expr
    return to_latex(expr, _names(expr) if names is None else names)


def _matrices_tex(pairs) -> str:
    r"""``Q = (...),\ ρ = (...)`` on one displayed line, or one per line when too wide."""

    parts = [f"{name}={_tex(M)}" for name, M in pairs]
    if sum(tex_width(x) for x in parts) + 20.0 * len(parts) <= LINE_WIDTH_PT:
        return r",\quad ".join(parts)
    return r", \\ ".join(parts)


def _tex_field(m: Model, name: str) -> str:
    """A changed field as LaTeX text, e.g. ``\texttt{readout}$=1/2$``."""
    return r"\texttt{" + name.replace("_", r"\_") + "}" + r"$=$" + \
        m._field_text(name).replace("_", r"\_").replace("**", "^")


def conservation_latex(proof: ConservationProof, standalone: bool = False) -> str:
    """The theorem, its proof steps and the counterexamples as LaTeX."""
    m = proof.model
    p, k = m.p, m.p_star
    inst, inv = proof.instant, proof.invariance
    L = []

    L.append("% symquad: conservation of S = rho (rho^T rho)^(-1/2); model "
             f"{describe_model(m, exclude=('lr', 'noise'))}\n")
    L.append(
        r"\paragraph{Theorem.} For " + ", ".join(
            f"${part}$" for part in
            describe_model(m, tex=True, exclude=("lr", "noise")).split(",\\ "))
        + (" (weight decay and batch size symbolic)" if m.changed_fields() else "")
        + ", any $\\eta>0$ and $\\Delta\\ge 0$, let $\\rho=SP$ with "
        r"$S^\top S=I$, $P=(\rho^\top\rho)^{1/2}\succ0$, $\Pi=SS^\top$, $Q_\parallel=S^\top QS$. "
        r"Along the ODE $\dot Q,\dot\rho$ of \texttt{symquad.derive}, $S(t)=S(0)$ for all $t$ in the "
        r"existence interval of the solution whenever the start lies in"
        r"\[\mathcal I_T=\{\operatorname{rank}\rho=p^*,\ [Q,\Pi]=0,\ [Q_\parallel,P]=[Q_\parallel,T]=[P,T]=0\},\]"
        r"and $\mathcal I_T$ is invariant. For $T\propto I$, $\dot S=0$ at a point iff the "
        r"point lies in $\mathcal I_T$; hence $S$ is conserved along a trajectory iff its "
        r"start is in $\mathcal I_T$. The restriction of $Q$ to $(\operatorname{span}\rho)^\perp$ "
        r"need not be isotropic; $Q(0)=q_0 I$ is in $\mathcal I_T$, and "
        r"$Q(0)=cI+\rho M\rho^\top$ ($M$ symmetric) is in $\mathcal I_I$ iff "
        r"$[M,\rho^\top\rho]=0$. For $T\not\propto I$ the instantaneous condition of Step 1 "
        r"($Q_{21}=0$, $\kappa_1[Q_\parallel,P]+\kappa_2[P,T]=0$) is weaker than "
        r"$\mathcal I_T$; only the sufficiency of $\mathcal I_T$ is proved here.")
    L.append("\n\n" + r"\paragraph{Step 0 (polar derivative).} From $\rho=SP$, $S^\top S=I$: "
             r"$\Omega=S^\top\dot S$ is skew, $S^\top\dot\rho-\dot\rho^\top S=\Omega P+P\Omega$ "
             r"and $(I-\Pi)\dot\rho=(I-\Pi)\dot S P$, so "
             r"$\dot S=(I-\Pi)\dot\rho P^{-1}+S\Omega$. Since $P\succ0$ the Sylvester equation "
             r"has a unique solution, and $\dot S=0\iff(I-\Pi)\dot\rho=0$ and "
             r"$S^\top\dot\rho$ symmetric; equivalently $\dot\rho=\rho B$ with $PB$ symmetric "
             r"(not $B$ symmetric: $B=P^{-1}X$, $X=S^\top\dot\rho=\dot P$).")
    L.append("\n\n" + r"\paragraph{Step 1 (instantaneous condition).} By $O(p)$-equivariance "
             r"(Step 2) take $S=E=\binom{I}{0}$, $\rho=\binom{P}{0}$ with $P$ symmetric. "
             r"Substituting into the derived $\dot\rho$ and solving the ansatz identically:")
    if inst["kappa0"] is not None:
        L.append(r"\[(I-\Pi)\dot\rho=\dot\rho_{[p^*+1:p],\,:}=\kappa_0\,Q_{21}P,\qquad "
                 r"\kappa_0=" + _tex(inst["kappa0"]) + r",\]")
    else:
        L.append(r"\[p=p^*:\ (I-\Pi)\dot\rho=0\text{ trivially},\]")
    if inst["kappa1"] is not None:
        L.append(r"\[S^\top\dot\rho-\dot\rho^\top S=\kappa_1[Q_\parallel,P]+\kappa_2[P,T],\qquad "
                 r"\kappa_1=" + _tex(inst["kappa1"]) + r",\ \kappa_2=" + _tex(inst["kappa2"])
                 + r".\]")
    else:
        L.append(r"\[p^*=1:\ S^\top\dot\rho\ \text{is }1\times1\text{, hence symmetric}.\]")
    L.append(r"As $\kappa_0,\kappa_1\neq0$ and $P$ is invertible, for $T\propto I$: "
             r"$\dot S=0\iff Q_{21}=0$ and $[Q_\parallel,P]=0$, i.e. the point is in $\mathcal I_T$. "
             r"($[Q_\parallel,P]=0\iff[Q_\parallel,\rho^\top\rho]=0$ since $P$ is a polynomial in $\rho^\top\rho$.)")
    al, be, pi = inv["alpha"], inv["beta"], inv["pi"]
    L.append("\n\n" + r"\paragraph{Step 2 (invariance).} The derived ODE is equivariant under "
             r"$(U,V)\in O(p)\times O(p^*)$, $(Q,\rho,T)\mapsto(UQU^\top,U\rho V,V^\top TV)$ "
             f"(checked: {proof.equivariance.get('generators_checked', 'skipped')} Lie-algebra "
             "generators, identically in all entries, and one reflection per factor). "
             r"On $\mathcal I_T$, $Q_\parallel,P,T$ commute and $Q$ is block diagonal, so some $(U,V)$ maps "
             r"the point into $D=\{Q=\operatorname{diag}(\alpha,\beta),\ \rho=\binom{\operatorname"
             r"{diag}(\pi)}{0},\ T=\operatorname{diag}(\theta)\}$, $\pi_i>0$. On $D$ every "
             r"off-diagonal entry of $\dot Q$ and $\dot\rho$ vanishes identically, so $D$ is "
             r"invariant; the reduced ODE is")
    names = _names(*inv["growth"], *inv["dalpha"], *inv["dbeta"])
    rows = []
    for a in range(k):
        pi_tex = _tex(pi[a], names)
        rows.append((rf"\frac{{d{pi_tex}}}{{dt}}", f"g_{{{a + 1}}}\\,{pi_tex}"))
    for a in range(k):
        rows.append((f"g_{{{a + 1}}}", display_rhs(inv["growth"][a], names)))
    for a in range(k):
        rows.append((rf"\frac{{d{_tex(al[a], names)}}}{{dt}}",
                     display_rhs(inv["dalpha"][a], names)))
    for j in range(len(be)):
        rows.append((rf"\frac{{d{_tex(be[j], names)}}}{{dt}}",
                     display_rhs(inv["dbeta"][j], names)))
    L.append("\n" + align_rows(rows))
    L.append(r"Each $\pi_i(t)=\pi_i(0)\exp\int_0^t g_i$ keeps its sign, so $S(t)=E$ on $D$, and "
             r"$S(t)=U^\top E V^\top=S(0)$ for the original trajectory (uniqueness of ODE "
             r"solutions). $\square$")
    L.append("\n\n" + r"\paragraph{Step 3 (the conditions cannot be dropped).} Exact rational, "
             r"realisable ($[[Q,\rho],[\rho^\top,T]]\succeq0$) points outside $\mathcal I_T$:")
    if not proof.counterexamples:
        L.append(r" none exist for $p=p^*=1$ ($\mathcal I_T$ is everything: $S=\pm1$).")
    if proof.counterexamples:
        L.append("\n\\begin{itemize}")
    for ce in proof.counterexamples:
        L.append("\n\\item " + ce["tex"] + ":\n\\begin{gather*}\n"
                 + _matrices_tex((("Q", ce["Q"]), (r"\rho", ce["rho"]), ("T", ce["T"])))
                 + r", \\" + "\n" + r"\dot S=" + _tex(ce["dS"]) + r"\neq0."
                 + "\n\\end{gather*}")
    if proof.counterexamples:
        L.append("\n\\end{itemize}")
    pos = proof.positive
    L.append("\n" + r"\paragraph{Positive control.} At an exact point of $\mathcal I_T$ in "
             r"general position (Cayley-rational $S$, non-diagonal $P$, anisotropic "
             r"$Q|_{(\operatorname{span}\rho)^\perp}$), the exact $\dot S$ from Step 0 is "
             + (r"$0$." if pos["zero"] else r"\emph{nonzero} (FAILED)."))
    body = "".join(L) + "\n"
    if standalone:
        return document(body, title="Conservation of S")
    return body


# ----------------------------------------------------------------------------
# any model: is S conserved from the typical start?  (exact Taylor coefficients)
# ----------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _state_ode(m: Model):
    r"""The model's whole ODE as ``(state symbols, right-hand sides, blocks)``, exact.

    State: the upper triangle of ``Q``, ``ρ`` and, for a trained readout, ``a``
    (``T`` is a constant).  All learning parameters take the model's values as
    exact rationals (:attr:`symquad.symbolic.derive.Equations.params`).
    """
    check_model(m, "m")
    eq = derive(m)
    out = eq.explicit()
    dQ, drho = out[1], out[2]
    da = out[3] if m.readout_trained else None
    Qs, rs, Ts = eq.entry_symbols
    values = {s: v for s, v in eq.params.items()}
    p, k = m.p, m.p_star
    state = [Qs[i, j] for i in range(p) for j in range(i, p)] + list(rs)
    rhs = [dQ[i, j] for i in range(p) for j in range(i, p)] + list(drho)
    if da is not None:
        a = readout_symbols(p, k)[0]
        state += list(a)
        rhs += list(da)
    rhs = [sp.expand(sp.sympify(e).xreplace(values)) for e in rhs]
    return tuple(state), tuple(rhs), (Qs, rs, Ts)


def typical_start(m: Model) -> dict:
    r"""An exact rational realisation of the typical start, in ``I_T``.

    ``Q(0) = I`` (``q0 = 1``, also on the sphere), ``T = I``,
    ``ρ(0) = S_0 P_0`` with ``S_0 = U [I; 0]`` (``U`` a Cayley-rational rotation in
    general position), ``P_0 = V diag(1/2, 1/3, …) Vᵀ`` (``V`` rational
    orthogonal), so ``‖ρ(0)‖ < 1`` and the Gram matrix is positive definite; the
    readout ``a(0)`` is the model's.  Every such start lies in the invariant
    set ``I_T`` of the classic theorem (``Q ∝ I`` commutes with everything).
    """
    p, k = m.p, m.p_star
    Kp = sp.Matrix(p, p, lambda i, j: sp.Rational(i - j, 2 * (i + j + 1)))
    Kk = sp.Matrix(k, k, lambda i, j: sp.Rational(j - i, 3 * (i + j + 2)))
    U, V = cayley_orthogonal(Kp), cayley_orthogonal(Kk)
    S0 = U * sp.Matrix.vstack(sp.eye(k), sp.zeros(p - k, k))
    P0 = V * _diag_rational(k, 2) * V.T
    a0 = [sp.Rational(c.numerator, c.denominator) for c in m.readout]
    return {"Q": sp.eye(p), "rho": S0 * P0, "S": S0, "P": P0, "T": sp.eye(k), "a": a0}


def _polar_map(S, P, rdot):
    """``(I − SSᵀ) ρ̇ P⁻¹ + SΩ`` with ``ΩP + PΩ = Sᵀρ̇ − ρ̇ᵀS`` (Ω skew), exact."""
    p, k = S.shape
    K = S.T * rdot - rdot.T * S
    w = sp.symbols(f"w_1:{k * (k - 1) // 2 + 1}") if k > 1 else ()
    Om = sp.zeros(k, k)
    n = 0
    for i in range(k):
        for j in range(i + 1, k):
            Om[i, j], Om[j, i] = w[n], -w[n]
            n += 1
    if w:
        sol = sp.solve(list(Om * P + P * Om - K), w, dict=True)
        if len(sol) != 1:
            raise ProofError("Sylvester equation for Omega has no unique solution")
        Om = Om.xreplace(sol[0])
    return ((sp.eye(p) - S * S.T) * rdot * P.inv() + S * Om).applyfunc(sp.simplify)


def start_counterexample(m: Model, max_order: int = 2):
    r"""The first Taylor coefficient of ``S(t)`` at the typical start that is not zero.

    ``S`` is constant on an interval ``[0, ε)`` iff ``ρ(t) ∈ S_0·Sym`` there, i.e.
    (the solution being analytic) iff every Taylor coefficient ``ρ^{(n)}(0)``
    has ``(I − S_0S_0ᵀ)ρ^{(n)} = 0`` and ``S_0ᵀρ^{(n)}`` symmetric.  The coefficients
    are exact: ``x^{(1)} = F(x_0)``, ``x^{(2)} = DF(x_0)·F(x_0)`` for the whole state
    ``x = (Q, ρ[, a])`` of :func:`typical_start`.  At the first order ``n`` where
    ``ρ^{(n)}`` leaves ``S_0·Sym`` (all lower ones inside, so ``S^{(j)}(0) = 0`` for
    ``j < n``), ``S^{(n)}(0)`` is the polar map of ``ρ^{(n)}`` (nonzero).

    Returns
    -------
    dict or None
        ``{"order", "dS" (the exact S^{(n)}(0)), "rho_derivative", "start"}``, or
        None if the first `max_order` coefficients stay in ``S_0·Sym``.
    """
    state, rhs, (Qs, rs, Ts) = _state_ode(m)
    st = typical_start(m)
    p, k = m.p, m.p_star
    x0 = {}
    for i in range(p):
        for j in range(i, p):
            x0[Qs[i, j]] = st["Q"][i, j]
    x0.update({rs[i, a]: st["rho"][i, a] for i in range(p) for a in range(k)})
    x0.update({Ts[a, b]: st["T"][a, b] for a in range(k) for b in range(a, k)})
    if m.readout_trained:
        x0.update(dict(zip(state[len(state) - p:], st["a"])))
    # exact arithmetic over QQ: each right-hand side as numerator/denominator polynomials
    # (the sphere's drift is rational), evaluated at the rational start
    gens = sorted(x0, key=lambda v: v.name)
    ring, *_ = sp.ring(gens, sp.QQ)
    point = [(ring(g), sp.QQ(x0[g].p, x0[g].q)) for g in gens]
    fractions = [tuple(ring.from_expr(part) for part in sp.fraction(sp.together(f)))
                 for f in rhs]

    def at(poly):
        value = poly.evaluate(point) if poly.ring.ngens else poly
        return sp.QQ(value) if not hasattr(value, "ring") else value.LC

    def value(frac):
        num, den = frac
        return at(num) / at(den)

    def derivative(frac, var):
        num, den = frac
        g = ring(var)
        d_num, d_den = num.diff(g), den.diff(g)
        dv = at(den)
        return (at(d_num) * dv - at(num) * at(d_den)) / (dv * dv)

    x1 = [value(f) for f in fractions]
    orders = [x1]
    if max_order >= 2:
        x2 = [sum((derivative(f, v) * x1[j] for j, v in enumerate(state) if x1[j]),
                  sp.QQ(0)) for f in fractions]
        orders.append(x2)
    n_q = p * (p + 1) // 2
    S0, P0 = st["S"], st["P"]

    def as_matrix(vec):
        return sp.Matrix(p, k, [sp.Rational(int(v.numerator), int(v.denominator))
                                for v in vec[n_q:n_q + p * k]])

    def outside(R):
        off = (sp.eye(p) - S0 * S0.T) * R
        sym = S0.T * R - R.T * S0
        return any(e != 0 for e in off) or any(e != 0 for e in sym)

    for n, xn in enumerate(orders, start=1):
        R = as_matrix(xn)
        if outside(R):
            return {"order": n, "dS": _polar_map(S0, P0, R), "rho_derivative": R,
                    "start": st}
    return None


@dataclass(frozen=True)
class ConservationVerdict:
    r"""Whether ``S = ρ(ρᵀρ)^{-1/2}`` is conserved for a model (from :func:`conservation_verdict`).

    Attributes
    ----------
    model : Model
    conserved : bool or None
        True: proved (``proof``); False: an exact counterexample at the typical
        start (``counterexample``); None: neither (``reason`` says why).
    proof : ConservationProof or None
    counterexample : dict or None
        From :func:`start_counterexample`.
    reason : str
    """

    model: Model
    conserved: bool | None
    proof: ConservationProof | None = field(default=None, repr=False)
    counterexample: dict | None = field(default=None, repr=False)
    reason: str = ""

    def summary(self) -> str:
        """One line: ``conserved (proof)`` / ``not conserved (counterexample, order n)``."""
        if self.conserved:
            return "conserved on I_T (proof)"
        if self.conserved is False:
            n = self.counterexample["order"]
            return f"not conserved: d{'' if n == 1 else n}S/dt{'' if n == 1 else n} != 0 at the typical start (exact)"
        return f"undecided: {self.reason}"

    def latex(self, standalone: bool = False) -> str:
        if self.conserved:
            return self.proof.latex(standalone=standalone)
        m = self.model
        L = [f"% symquad: conservation of S = rho (rho^T rho)^(-1/2); model {m!r}\n"]
        if self.conserved is None:
            L.append(r"\paragraph{Undecided.} " + self.reason.replace("_", r"\_") + "\n")
        else:
            ce = self.counterexample
            st, n = ce["start"], ce["order"]
            changes = ", ".join(_tex_field(m, name) for name in m.changed_fields())
            deriv = r"\dot S(0)" if n == 1 else rf"S^{{({n})}}(0)"
            L.append(
                r"\paragraph{$S$ is not conserved.} For $\sigma(z)="
                + sp.latex(sp.sympify(m.activation_str)) + "$"
                + (f" with the model changes {changes}" if changes else "")
                + f", $p={m.p}$, $p^*={m.p_star}$, $\\eta={sp.latex(sp.nsimplify(m.eta))}$, "
                r"start at the typical point $Q(0)=I$, $T=I$, "
                r"$\rho(0)=S_0P_0=" + _tex(st["rho"]) + r"$"
                + (r", $a(0)=" + _tex(sp.Matrix(st["a"]).T) + "$" if m.readout_trained else "")
                + r", which lies in the invariant set $\mathcal I_T$ of the classic theorem. "
                + ("" if n == 1 else
                   r"The first derivative $\dot\rho(0)$ lies in $S_0\,\mathrm{Sym}$, so "
                   r"$\dot S(0)=0$, but ")
                + r"the exact Taylor coefficient of the derived ODE gives"
                r"\[" + deriv + "=" + _tex(ce["dS"]) + r"\neq0,\]"
                r"so $S(t)\neq S(0)$ for small $t>0$: the conservation of $S$, and with it the "
                r"closest-solution result, does not hold for this model." + "\n")
        body = "".join(L)
        if standalone:
            return document(body, title="Conservation of S")
        return body


def conservation_verdict(m: Model, max_order: int = 2,
                         check_equivariance: bool = True) -> ConservationVerdict:
    r"""Is ``S`` conserved for `m`?  A proof, or an exact counterexample, per model.

    First the exact Taylor coefficients of ``S(t)`` at the typical start
    (:func:`start_counterexample`, any model: every field of the specification,
    any polynomial activations); a nonzero one is a counterexample (``S`` moves
    from a start that the classic theorem covers).  Otherwise, for the changes
    the theorem is derived for (:func:`prove_conservation`), the full proof on
    the changed ODE.

    Raises
    ------
    ValueError
        For ``p < p*`` (``S`` is undefined: ``rank ρ <= p < p*``).
    """
    check_model(m, "m")
    if m.p < m.p_star:
        raise ValueError(
            f"S = rho (rho^T rho)^(-1/2) needs p >= p_star (rank rho = p_star); got p={m.p}, "
            f"p_star={m.p_star}")
    # the typical start and S are defined for the isotropic state (Q, rho): an input
    # spectrum (per-block state) is refused by name, with the analysis' reason
    require(m, "conservation_verdict",
            supports=tuple(n for n in m.changed_fields() if n != "spectrum"),
            why="spectrum: " + RULES["conservation"]["spectrum"])
    ce = start_counterexample(m, max_order=max_order)
    if ce is not None:
        return ConservationVerdict(m, False, counterexample=ce)
    try:
        proof = prove_conservation(m, check_equivariance=check_equivariance)
    except ValueError as exc:
        return ConservationVerdict(m, None, reason=f"no counterexample up to order "
                                   f"{max_order} at the typical start, and {exc}")
    # a ProofError (a step failed for a model the theorem covers) propagates: it is a
    # fault, not a verdict
    return ConservationVerdict(m, True, proof=proof)
