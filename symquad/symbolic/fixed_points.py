r"""Fixed points of the order-parameter ODE: the plateau and the zero-risk manifold.

Everything starts from :func:`symquad.derive` (the η² term and the label noise
Δ included) and uses ``T = I``.

Plateau
-------
At ``ρ = 0``, ``T = I`` the ansatz ``Q = q I`` is consistent: every matrix word
that survives in ``dQ`` is a power of ``Q`` (words with ρ vanish) and traces are
scalars, so ``dQ = S(q) I`` and ``dρ = 0``.  :func:`isotropic_reduction`
evaluates the width-independent matrix form with symbolic ``p, p*`` this way
(``Q^k → q^k``, ``Tr Q^k → p q^k``, ``Tr T^k → p*``); the explicit entry form
for given widths is the second route (:func:`check_symmetric_ansatz`).

* ``S(q)/q`` is quadratic in ``q``; the plateau is the root that tends to the
  critical point of the risk, ``q → p/(p+2)``, as ``η → 0``;
* the Jacobian at ``ρ = 0`` is block triangular (``dρ`` is linear in ρ, ``dQ``
  depends on ρ through ``ρρᵀ``): ρ block ``κ I_{p p*}`` with
  ``κ = −(2η/p)[a + 2q/p − 2/p*]``, ``a = q − 1``; Q block ``λ_iso`` on ``δQ ∝ I``
  and ``λ_tl`` on symmetric traceless ``δQ``;
* gradient-flow limit: ``q = p/(p+2)``, ``κ = 4η/(p p*)``.  With ``η = lr·p``
  (``lr_scaling="width"``) ``κ → 4 lr/p*``: the rate depends on ``p*`` only.

Zero-risk manifold
------------------
At ``Q = ρρᵀ``, ``ρᵀρ = (p/p*) I`` (``p >= p*``) the risk vanishes and, for
``Δ = 0``, so does the η² term: the manifold is a set of fixed points.
:func:`solution_jacobian` gives the exact Jacobian spectrum there.  With
``Δ > 0`` the η² term contributes ``(4η²Δ/p²) Q ≠ 0``: the solutions are no
longer fixed points, and the ODE settles at a nearby point with risk ``O(ηΔ)``
(measured by :func:`symquad.numeric.landscape.noisy_floor`).

Model changes (docs/model.md §8.6)
----------------------------------
The reduction is built from the model's own matrix form: weight decay adds
``−2ηλq`` to ``S`` and ``−ηλ`` to ``κ``, a mini-batch divides the η² part of
``S`` by ``b``, uniform readouts ``α, β`` and ``σ* = c* z² + c0*`` change the
coefficients (``λ`` and ``b`` stay symbols until the model's values are
substituted).  On the sphere ``q = 1`` and the projection of the drift gives
rate ``κ(1) − ½S(1)`` and ``S_tl(1) − S(1)`` on off-diagonal ``δQ``.  Other
changes are refused by name (:data:`symquad.applicability.RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import sympy as sp
from sympy.matrices.expressions import MatAdd, MatMul, MatPow, Trace, Transpose

from ..applicability import check, zero_risk_scale
from ..spec import Model
from .symbols import BATCH, ETA, NOISE, P, P_STAR, WEIGHT_DECAY, matrix_symbols
from ..stages import require_known_structure
from .symbols import ETA as eta
from .network import network, readout_values
from .symbols import XI
from .wick import GaussianFields
from .derive import derive

__all__ = [
    "Q_SYM", "isotropic_reduction", "PlateauSolution", "plateau_solution",
    "check_symmetric_ansatz", "solution_jacobian", "solution_stability_threshold",
    "solution_zero_modes", "rho_diffusion_symbolic",
]

#: The scalar ``q`` of ``Q = q I``.
Q_SYM = sp.Symbol("q", positive=True)
_QT = sp.Symbol("q_tr", positive=True)   # q inside traces (held fixed for traceless δQ)


def _scalar(expr, rho_marker):
    """Multiplier ``s`` with ``expr = s·I`` under ``Q = qI, T = I`` (see module docstring).

    ``rho_marker``: value given to ρ (0 for ρ = 0; 1 to read off the coefficient
    of a term linear in ρ).  ``Tr(ρρᵀ)`` is always 0 (second order in ρ).
    """
    Q, rho, T = matrix_symbols()

    def tr(arg):
        if arg.has(rho):
            return sp.S.Zero
        size = P if arg.shape[0] == P else P_STAR
        return size * _walk(arg, _QT)

    def _walk(e, qval):
        if e == Q:
            return qval
        if e == T:
            return sp.S.One
        if e == rho:
            return sp.S(rho_marker)
        if isinstance(e, Transpose):
            return _walk(e.arg, qval)
        if isinstance(e, MatAdd):
            return sp.Add(*[_walk(a, qval) for a in e.args])
        if isinstance(e, MatMul):
            return sp.Mul(*[_walk(a, qval) if getattr(a, "is_Matrix", False)
                            else a.replace(lambda x: isinstance(x, Trace),
                                           lambda x: tr(x.arg)) for a in e.args])
        if isinstance(e, MatPow):
            return _walk(e.base, qval) ** e.exp
        if getattr(e, "is_Identity", False):
            return sp.S.One
        if getattr(e, "is_ZeroMatrix", False):
            return sp.S.Zero
        if not getattr(e, "is_Matrix", False):
            return e.replace(lambda x: isinstance(x, Trace), lambda x: tr(x.arg))
        raise TypeError(f"unexpected matrix expression {e!r}")

    return sp.expand(_walk(expr, Q_SYM))


#: The fields :func:`_reduction` builds its model from (besides the readouts and learning
#: parameters it takes as arguments); any other field that keys the structure is refused.
_REDUCTION_KNOWS = ("p", "p_star", "activation", "teacher_activation", "constraint",
                    "lr_readout")


@lru_cache(maxsize=None)
def _reduction(activation, teacher_activation, readout, teacher_readout, decay, batch):
    """Closed forms at ``Q = qI, ρ = 0, T = I`` of a structure (see :func:`isotropic_reduction`).

    `readout`, `teacher_readout`: a uniform weight (Fraction) or None for the
    default ``1/p``, ``1/p*`` (kept symbolic in the widths); `decay`, `batch`:
    whether weight decay and the mini-batch are switched on (their symbols stay).
    """

    def width(value):      # a probe width whose default 1/width is not the given weight
        return 2 if value is None or value != Fraction(1, 2) else 3
    m = Model(p=width(readout), p_star=width(teacher_readout), lr=1, activation=activation,
              teacher_activation=teacher_activation, readout=readout,
              teacher_readout=teacher_readout, weight_decay=1 if decay else 0,
              batch_size=2 if batch else 1)
    eq = derive(m, form="matrix")          # widths stay symbolic
    S_split = _scalar(eq.dQ, 0)
    S = S_split.subs(_QT, Q_SYM)
    S_tl = sp.diff(S_split, Q_SYM).subs(_QT, Q_SYM)
    # dρ is linear in ρ: read off its coefficient with ρ -> 1 (Tr ρρᵀ -> 0)
    kappa = _scalar(eq.drho, 1).subs(_QT, Q_SYM)
    risk = _scalar(eq.risk, 0).subs(_QT, Q_SYM)
    return {"S": sp.factor(S), "S_tl": sp.factor(S_tl), "kappa": sp.factor(kappa),
            "risk": sp.simplify(risk)}


def _structure(m: Model):
    """The arguments of :func:`_reduction` for a model (after :func:`check`)."""
    def weight(name):
        return None if m.is_default(name) else getattr(m, name)[0]
    return (tuple(m.activation), tuple(m.teacher_activation), weight("readout"),
            weight("teacher_readout"), m.weight_decay > 0, m.batch_size > 1)


def isotropic_reduction(activation=(0, 0, 1), model: Model | None = None):
    r"""Closed forms in ``p, p*, q, η, Δ`` at ``Q = qI``, ``T = I`` (matrix form).

    Parameters
    ----------
    activation : tuple, optional
        ``σ = σ*`` with the classic readouts (the paper's model).
    model : Model, optional
        Instead of `activation`: the reduction of this model's structure
        (``σ``, ``σ*``, uniform readouts, weight decay and batch size switched
        on or off; widths, ``η``, ``Δ``, ``λ`` and ``b`` stay symbols).  The
        changes of :data:`symquad.applicability.RULES` ``["plateau_solution"]``
        are handled, the sphere as the unconstrained drift (the projection is
        applied by :func:`plateau_solution`).

    Returns
    -------
    dict with
        ``S``: ``dQ = S I`` at ρ = 0 (traces and words both at ``q``);
        ``S_tl``: ``∂S/∂q`` with traces held fixed = Jacobian eigenvalue on
        symmetric traceless ``δQ``;
        ``kappa``: ``dρ = κ ρ`` to first order in ρ;
        ``risk``: ``ε(qI, 0, I)``.
    """
    if model is None:
        act = tuple(activation)
        return _reduction(act, act, None, None, False, False)
    check(model, "isotropic_reduction", "plateau_solution")
    if not model.is_quadratic:
        raise ValueError(f"isotropic_reduction needs quadratic activations; got "
                         f"{model.activation_str!r}, {model.teacher_activation_str!r}")
    require_known_structure(model, "the cached isotropic reduction", _REDUCTION_KNOWS)
    return _reduction(*_structure(model))


@dataclass(frozen=True)
class PlateauSolution:
    r"""Plateau fixed point of the ODE in closed form (T = I).

    ``q``, ``rate``, ``risk``, ``lambda_iso``, ``lambda_traceless`` are SymPy
    expressions in ``p, p*, η, Δ`` (generic) or exact numbers (``model`` given).
    ``q_gradient_flow`` is the critical point of the objective ``ε + (λ/2) tr Q``
    (the risk without weight decay; the ``η → 0`` limit of ``q``) and
    ``rate_gradient_flow`` the O(η) growth rate of ρ there.  On the sphere
    ``q = 1``, ``lambda_iso`` is NaN (``Q_kk`` is fixed) and ``lambda_traceless``
    is the eigenvalue of the off-diagonal changes of ``Q``.
    """

    q: sp.Expr
    rate: sp.Expr
    risk: sp.Expr
    lambda_iso: sp.Expr
    lambda_traceless: sp.Expr
    q_gradient_flow: sp.Expr
    rate_gradient_flow: sp.Expr
    other_root: sp.Expr = field(repr=False)

    def subs(self, values: dict) -> "PlateauSolution":
        """All fields with ``values`` substituted (e.g. ``{p: 3, p_star: 2, eta: 1/10}``)."""
        return PlateauSolution(*[sp.simplify(getattr(self, f).subs(values)) for f in
                                 ("q", "rate", "risk", "lambda_iso", "lambda_traceless",
                                  "q_gradient_flow", "rate_gradient_flow", "other_root")])


@lru_cache(maxsize=None)
def _plateau_generic(activation=(0, 0, 1)) -> PlateauSolution:
    red = isotropic_reduction(tuple(activation))
    q = Q_SYM
    g = sp.factor(red["S"] / q)
    roots = sp.solve(sp.numer(sp.together(g)), q)
    if len(roots) != 2:
        raise RuntimeError(f"expected a quadratic for the plateau norm, got roots {roots}")
    risk_q = red["risk"]
    q_gf = sp.solve(sp.diff(risk_q, q), q)
    if len(q_gf) != 1:
        raise RuntimeError(f"expected one stationary point of ε(qI,0,I), got {q_gf}")
    q_gf = sp.simplify(q_gf[0])

    # identify the plateau root: the one that tends to q_gf as η → 0 (the other one
    # is O(p/η)); checked at sample widths because SymPy's limit of the radical is
    # not reliable with symbolic p, p*
    def at_sample(expr, eta, p, k):
        return complex(expr.subs({ETA: eta, NOISE: 0, P: p, P_STAR: k}).evalf())

    near = [r for r in roots
            if all(abs(at_sample(r, 1e-6, p, k) - at_sample(q_gf, 0, p, k)) < 1e-4
                   for p, k in ((1, 1), (3, 2), (2, 5), (8, 3)))]
    if len(near) != 1:
        raise RuntimeError("could not identify the plateau root (η → 0 limit p/(p+2))")
    q_pl = near[0]
    other = [r for r in roots if r is not q_pl][0]
    S = red["S"]
    return PlateauSolution(
        q=q_pl,
        rate=red["kappa"].subs(q, q_pl),
        risk=risk_q.subs(q, q_pl),
        lambda_iso=sp.diff(S, q).subs(q, q_pl),
        lambda_traceless=red["S_tl"].subs(q, q_pl),
        q_gradient_flow=q_gf,
        rate_gradient_flow=sp.factor(red["kappa"].subs(q, q_gf)),
        other_root=other,
    )


def _model_values(m: Model) -> dict:
    return {P: m.p, P_STAR: m.p_star, ETA: sp.nsimplify(m.eta), NOISE: sp.nsimplify(m.noise),
            WEIGHT_DECAY: sp.nsimplify(m.weight_decay), BATCH: sp.Integer(m.batch_size)}


def _gradient_flow_part(expr):
    """The O(η) part ``η ∂expr/∂η|_{η=0}`` of an expression polynomial in η."""
    return sp.expand(ETA * sp.diff(expr, ETA).subs(ETA, 0))


def _sphere_plateau(red: dict, vals: dict) -> PlateauSolution:
    r"""The plateau on the sphere from the unconstrained reduction ``red``.

    The sphere's drift is ``dQ_ij = F_ij − ½Q_ij(F_ii/Q_ii + F_jj/Q_jj)``,
    ``dρ_im = F^ρ_im − ½ρ_im F_ii/Q_ii`` (:mod:`symquad.symbolic.update`), with
    ``F`` the unconstrained drift.  At ``Q = I, ρ = 0`` every ``dQ`` vanishes, and
    to first order ``dρ = [κ(1) − ½S(1)] ρ``; an off-diagonal ``δQ_ij`` moves
    ``F_ij`` by ``S_tl(1) δQ_ij`` and leaves ``F_ii`` unchanged to first order (it
    is odd under ``λ_j → −λ_j``), so its eigenvalue is ``S_tl(1) − S(1)``.
    """
    q = Q_SYM
    S1, kappa1 = red["S"].subs(q, 1), red["kappa"].subs(q, 1)
    rate = kappa1 - S1 / 2
    values = {k: v for k, v in vals.items() if k is not ETA}
    rate_gf = _gradient_flow_part(sp.expand(rate.subs(values))).subs(ETA, vals[ETA])
    return PlateauSolution(
        q=sp.Integer(1),
        rate=sp.radsimp(sp.expand(rate.subs(vals))),
        risk=sp.radsimp(sp.expand(red["risk"].subs(q, 1).subs(vals))),
        lambda_iso=sp.nan,
        lambda_traceless=sp.radsimp(sp.expand((red["S_tl"].subs(q, 1) - S1).subs(vals))),
        q_gradient_flow=sp.Integer(1),
        rate_gradient_flow=sp.radsimp(sp.expand(rate_gf)),
        other_root=sp.nan,
    )


def plateau_solution(m: Model | None = None) -> PlateauSolution:
    r"""The plateau ``ρ = 0, Q = q I`` of the full ODE (η² term and noise included).

    Parameters
    ----------
    m : Model, optional
        Without it the result is generic in ``p, p*, η, Δ`` (the root of the
        quadratic ``S(q)/q`` that tends to ``p/(p+2)`` as ``η → 0``); with it, exact
        numbers (``η = m.eta`` as a rational, so both learning-rate conventions are
        covered), obtained by solving the quadratic with the model's numbers:
        its smaller positive root (the larger one is the divergence threshold).
        Model changes: weight decay, mini-batches, uniform readouts,
        ``σ* = c* z² + c0*`` and the sphere (``q = 1``, rate ``κ(1) − ½S(1)``) are
        re-derived; the others are refused by name
        (:data:`symquad.applicability.RULES` ``["plateau_solution"]``).
    """
    if m is None:
        return _plateau_generic((0, 0, 1))
    check(m, "plateau_solution")
    if not m.is_quadratic:
        raise ValueError(f"the plateau is derived for σ(z) = c z² (+ c0); got "
                         f"{m.activation_str!r}" + ("" if m.is_default("teacher_activation")
                                                     else f", σ* = {m.teacher_activation_str!r}"))
    require_known_structure(m, "the cached isotropic reduction", _REDUCTION_KNOWS)
    red = _reduction(*_structure(m))
    vals = _model_values(m)
    if m.constraint == "sphere":
        return _sphere_plateau(red, vals)
    q = Q_SYM
    S = sp.expand(red["S"].subs(vals))
    objective = red["risk"].subs(vals) + sp.nsimplify(m.weight_decay) * m.p * q / 2
    q_gf = sp.solve(sp.diff(objective, q), q)[0]
    roots = sorted((r for r in sp.solve(sp.expand(sp.cancel(S / q)), q) if r.is_real and r > 0),
                   key=float)
    if len(roots) < 2:
        raise ValueError(f"no plateau fixed point for eta = {m.eta}, weight_decay = "
                         f"{m.weight_decay}: " + ("reduce lr" if not roots else
                                                  "the weights decay to W = 0"))
    q_pl, other = roots[0], roots[1]
    kappa = red["kappa"].subs(vals)
    return PlateauSolution(
        q=sp.radsimp(q_pl),
        rate=sp.radsimp(sp.expand(kappa.subs(q, q_pl))),
        risk=sp.radsimp(sp.expand(red["risk"].subs(vals).subs(q, q_pl))),
        lambda_iso=sp.radsimp(sp.expand(sp.diff(S, q).subs(q, q_pl))),
        lambda_traceless=sp.radsimp(sp.expand(red["S_tl"].subs(vals).subs(q, q_pl))),
        q_gradient_flow=q_gf,
        rate_gradient_flow=kappa.subs(q, q_gf),
        other_root=other,
    )


def check_symmetric_ansatz(m: Model) -> dict:
    r"""Second route: substitute ``Q = qI, ρ = 0, T = I`` in the explicit entry-form ODE.

    Returns ``{"offdiag_zero", "diag_equal", "drho_zero", "S"}``: the ansatz is
    consistent iff the three flags are True; ``S`` is the common diagonal (to
    compare with :func:`isotropic_reduction`).  Handles the model changes of
    :data:`symquad.applicability.RULES` ``["plateau"]`` (a non-uniform student
    readout, where the ansatz fails, is refused).
    """
    check(m, "check_symmetric_ansatz", "plateau")
    eq = derive(m)
    _, dQ, drho = eq.explicit()[:3]
    Qs, rhos, Ts = eq.entry_symbols
    sub = {}
    for i in range(m.p):
        for j in range(m.p):
            sub[Qs[i, j]] = Q_SYM if i == j else 0
        for l in range(m.p_star):
            sub[rhos[i, l]] = 0
    for l in range(m.p_star):
        for n in range(m.p_star):
            sub[Ts[l, n]] = 1 if l == n else 0
    dQv = dQ.xreplace(sub).applyfunc(sp.expand)
    drv = drho.xreplace(sub).applyfunc(sp.expand)
    diag = [dQv[i, i] for i in range(m.p)]
    return {
        "offdiag_zero": all(dQv[i, j] == 0 for i in range(m.p) for j in range(m.p) if i != j),
        "diag_equal": all(sp.expand(d - diag[0]) == 0 for d in diag),
        "drho_zero": all(v == 0 for v in drv),
        "S": diag[0],
    }


def _zero_risk_rho(m: Model) -> sp.Matrix:
    """``ρ = s [I_{p*}; 0]`` with ``s² = c*β/(cα)`` (``p/p*`` classic), exact."""
    s2 = zero_risk_scale(m)
    return sp.sqrt(sp.Rational(s2.numerator, s2.denominator)) * sp.eye(m.p, m.p_star)


def solution_jacobian(m: Model, eta=None, noise=0):
    r"""Exact Jacobian of the ODE at an axis-aligned zero-risk point (``p >= p*``, T = I).

    Point: ``ρ = s [I_{p*}; 0]``, ``Q = ρρᵀ`` with ``s² = c*β/(cα)`` (``p/p*`` for
    the classic model).  Coordinates ``(Q_ij (i <= j), ρ_im)``.  ``eta``
    defaults to the model's step size (kept symbolic if ``eta="symbol"``); the
    other parameters (batch size) take the model's values.  Model changes:
    :data:`symquad.applicability.RULES` ``["zero_risk_fixed_points"]``.

    Returns
    -------
    (J, eigenvalues dict, rhs at the point)
        ``rhs`` is ``(dQ, dρ)`` there: zero for ``Δ = 0``, ``(4c²α²η²Δ/b) Q`` otherwise.
    """
    check(m, "solution_jacobian", "zero_risk_fixed_points")
    if m.p < m.p_star:
        raise ValueError(f"zero-risk points need p >= p_star, got p={m.p}, p_star={m.p_star}")
    eq = derive(m)
    _, dQ, drho = eq.explicit()[:3]
    Qs, rhos, Ts = eq.entry_symbols
    p, k = m.p, m.p_star
    rho0 = _zero_risk_rho(m)
    Q0 = rho0 * rho0.T
    qv = [Qs[i, j] for i in range(p) for j in range(i, p)]
    rv = [rhos[i, l] for i in range(p) for l in range(k)]
    fq = [dQ[i, j] for i in range(p) for j in range(i, p)]
    fr = [drho[i, l] for i in range(p) for l in range(k)]
    at = {Qs[i, j]: Q0[i, j] for i in range(p) for j in range(p)}
    at.update({rhos[i, l]: rho0[i, l] for i in range(p) for l in range(k)})
    at.update({Ts[l, n]: (1 if l == n else 0) for l in range(k) for n in range(k)})
    eta_val = eq.eta if eta == "symbol" else sp.nsimplify(m.eta if eta is None else eta)
    at.update({s: v for s, v in eq.params.items() if s not in (eq.eta, eq.noise, P, P_STAR)})
    at.update({eq.eta: eta_val, eq.noise: sp.nsimplify(noise)})
    F = sp.Matrix(fq + fr)
    J = F.jacobian(qv + rv).xreplace(at).applyfunc(sp.expand)
    rhs = F.xreplace(at).applyfunc(sp.expand)
    return J, J.eigenvals(), rhs


def solution_zero_modes(p: int, p_star: int, model: Model | None = None) -> int:
    r"""Zero eigenvalues of the ODE Jacobian at a zero-risk point, in ``(Q, ρ)`` space.

    ``p p* − p*(p*+1)/2`` along the zero-risk manifold (docs/model.md §8.3) plus
    ``(p−p*)(p−p*+1)/2`` from symmetric changes of ``Q`` on the ``p − p*``
    student directions that the solution does not use (the risk grows only at
    second order there; the ODE analogue of the extra Hessian zero modes).
    With `model`, its changes are checked (:data:`symquad.applicability.RULES`
    ``["zero_risk_fixed_points"]``: uniform readouts, ``σ* = c* z²`` and the batch
    size keep the count, which the tests check against :func:`solution_jacobian`).
    """
    if model is not None:
        check(model, "solution_zero_modes", "zero_risk_fixed_points")
        if (model.p, model.p_star) != (p, p_star):
            raise ValueError(f"p, p_star = ({p}, {p_star}) differ from the model's "
                             f"({model.p}, {model.p_star})")
    return p * p_star - p_star * (p_star + 1) // 2 + (p - p_star) * (p - p_star + 1) // 2


def solution_stability_threshold(m: Model):
    r"""Largest ``η`` for which the zero-risk point is linearly stable under the ODE (Δ = 0).

    The nonzero Jacobian eigenvalues at the axis-aligned solution are
    polynomials in ``η`` (``−c₁η + c₂η²``); the threshold is the smallest
    positive ``η`` where one of them reaches 0.  Returns ``oo`` if none does.
    """
    _, ev, _ = solution_jacobian(m, eta="symbol")
    roots = []
    for value in ev:
        if value == 0:
            continue
        roots += [r for r in sp.solve(sp.Eq(value, 0), eta) if r.is_positive]
    return min(roots) if roots else sp.oo


def rho_diffusion_symbolic(m: Model, q=Q_SYM):
    r"""``D = η² E[(ŷ−y)² σ'(λ_1)² ν_1²]/p²`` at ``ρ = 0``, ``Q = qI``, ``T = I`` (Wick engine).

    The variance per unit time of an entry of ρ under SGD is ``D/N``
    (see :func:`symquad.numeric.landscape.rho_diffusion`, which must agree).  The
    expectation is taken of the model's own network (readouts, ``σ*``); a
    mini-batch averages ``b`` independent increments, so ``D`` is divided by
    ``b``, and weight decay (deterministic) adds nothing.  Model changes:
    :data:`symquad.applicability.RULES` ``["rho_diffusion"]``.
    """
    check(m, "rho_diffusion_symbolic", "rho_diffusion")
    net = network(m)
    lam, nu = net.lam, net.nu
    cov = sp.diag(*([q] * m.p + [sp.S.One] * m.p_star))
    gauss = GaussianFields(tuple(lam) + tuple(nu) + (XI,),
                           sp.diag(cov, sp.S.One))   # ξ ~ N(0,1) independent
    # ∂ℓ/∂λ_1 = (ŷ − y) σ'(λ_1)/p, and one step moves ρ_11 by −(η/N) (∂ℓ/∂λ_1) ν_1
    g1 = net.grad[0].xreplace(readout_values(m, trained_too=True))
    moment = gauss.expectation(sp.expand(g1 ** 2 * nu[0] ** 2))
    return sp.simplify(sp.nsimplify(m.eta) ** 2 * moment.subs(NOISE, sp.nsimplify(m.noise))
                       / m.batch_size)
