r"""The zero-risk manifold of the quadratic network, derived from the risk.

All statements start from the risk of ``symquad.derive(model)`` (never a hand
copy).  With ``A = diag(c I_p/p, −c I_{p*}/p*)`` and ``C = [[Q, ρ], [ρᵀ, T]]``:

1. ``ε = ½ tr(AC)² + tr((AC)²)`` identically (:func:`risk_trace_form`).
2. For a Gram matrix ``C = G Gᵀ`` (``G = [W; W*]/√N``) cyclicity of the trace gives
   ``ε = ½ (tr M)² + ‖M‖_F²`` with ``M = GᵀAG = c(WᵀW/p − W*ᵀW*/p*)/N``; so
   ``ε = 0 ⇔ WᵀW/p = W*ᵀW*/p*``, i.e. ``W = √(p/p*) O W*`` with ``OᵀO = I_{p*}``.
3. In overlap space (``T ≻ 0`` fixed) the zero-risk set is
   ``Z_T = {Φ_T = 0}``, ``Φ_T(Q, ρ) = (Q − ρT⁻¹ρᵀ, ρᵀρ − (p/p*)T²)``
   (:func:`zero_risk_points_check` verifies ``ε = 0`` exactly on its points).
4. ``dΦ_T : Sym(p) × R^{p×p*} → Sym(p) × Sym(p*)`` is onto at every point of
   ``Z_T``: its kernel (the tangent space) has dimension
   ``p(p+1)/2 + p p* − p(p+1)/2 − p*(p*+1)/2 = p p* − p*(p*+1)/2``
   (:func:`dimension_check`, exact ranks).  ``Z_T`` is the ``O(p)`` orbit of one
   point with stabiliser ``O(p − p*)``: the orbit map ``Ω ↦ (ΩQ − QΩ, Ωρ)`` has the
   same rank.  The overlap map sends the weight-space orbit ``{UW}`` bijectively
   onto ``Z_T`` (``W = ρT⁻¹W*``), so the weight-space zero-risk set has the same
   dimension (it does not grow with ``N``).
5. ``p < p*``: ``det(ρᵀρ) ≡ 0`` (rank ≤ p) while ``det((p/p*)T²) > 0``: ``Z_T = ∅``
   (:func:`underparameterised_check`).
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from ..applicability import check, quadratic_coefficients, zero_risk_reason, zero_risk_scale
from ..spec import Model
from .network import readout_values
from .derive import derive

__all__ = [
    "risk_trace_form", "zero_risk_points_check", "constraint_jacobian", "orbit_jacobian",
    "dimension_check", "underparameterised_check", "underparameterised_minimum",
    "manifold_latex",
]


def _model(p, p_star, activation=(0, 0, 1)) -> Model:
    return Model(p=p, p_star=p_star, lr=0.1, activation=activation)


def _rat(x) -> sp.Rational:
    return sp.Rational(x.numerator, x.denominator)


@lru_cache(maxsize=8)
def _risk(m: Model):
    # cached: risk_trace_form and zero_risk_points_check both need it, and the
    # explicit expansion dominates `symquad invariants --only manifold`
    if not m.is_quadratic:
        raise ValueError(f"the zero-risk manifold is derived for sigma(z) = c z**2 (+ c0); "
                         f"got {m.activation_str!r}"
                         + ("" if m.is_default("teacher_activation") else
                            f", teacher_activation {m.teacher_activation_str!r}"))
    eq = derive(m)
    risk = eq.explicit()[0]
    if m.readout_trained:   # the readout is a coordinate; the manifold checks use a(0)
        risk = sp.expand(risk.xreplace(readout_values(m, trained_too=True)))
    return risk, eq.entry_symbols


def _output_matrix(m: Model):
    r"""``A = diag(c a, −c* b)`` and ``κ = c0 Σa − c0* Σb``: ``ŷ − y_clean = zᵀAz + κ``."""
    (c, c0), (cs, c0s) = (quadratic_coefficients(m.activation),
                          quadratic_coefficients(m.teacher_activation))
    A = sp.diag(*([_rat(c * a) for a in m.readout] + [-_rat(cs * b) for b in m.teacher_readout]))
    kappa = _rat(c0 * sum(m.readout) - c0s * sum(m.teacher_readout))
    return A, kappa


def risk_trace_form(m: Model) -> dict:
    r"""Verify ``ε ≡ ½ (tr(AC) + κ)² + tr((AC)²)`` for the derived risk of ``m``.

    ``A = diag(c a_1, …, c a_p, −c* b_1, …, −c* b_p*)`` and
    ``κ = c0 Σa − c0* Σb`` (classic: ``A = diag(c I/p, −c I/p*)``, ``κ = 0``).
    Any quadratic model (a trained readout at ``a(0)``).

    Returns ``{"A": A, "C": C, "risk": ε, "identity": True}``; raises
    ``AssertionError`` if the identity fails.
    """
    risk, (Qs, rs, Ts) = _risk(m)
    p, k = m.p, m.p_star
    A, kappa = _output_matrix(m)
    C = sp.Matrix(sp.BlockMatrix([[sp.Matrix(Qs), sp.Matrix(rs)],
                                  [sp.Matrix(rs).T, sp.Matrix(Ts)]]))
    # compare as sparse polynomials over QQ (much faster than expanding Exprs)
    gens = sorted(C.free_symbols, key=lambda s: s.name)
    R, *_ = sp.ring(gens, sp.QQ)
    Cr = [[R.from_expr(C[i, j]) for j in range(p + k)] for i in range(p + k)]
    d = [R.from_expr(A[i, i]) for i in range(p + k)]
    AC = [[d[i] * Cr[i][j] for j in range(p + k)] for i in range(p + k)]
    tr1 = sum((AC[i][i] for i in range(p + k)), R(0)) + R.from_expr(kappa)
    tr2 = sum((AC[i][j] * AC[j][i] for i in range(p + k) for j in range(p + k)), R(0))
    if R.from_expr(risk) != tr1 ** 2 / 2 + tr2:
        raise AssertionError("derived risk differs from 1/2 (tr(AC) + kappa)^2 + tr((AC)^2)")
    return {"A": A, "C": C, "kappa": kappa, "risk": risk, "identity": True}


def _cayley(K):
    n = K.shape[0]
    return (sp.eye(n) - K) * (sp.eye(n) + K).inv()


def _stiefel_point(p, k, shift=0):
    """Rational ``p×p*`` matrix with orthonormal columns (Cayley rotation of ``[I; 0]``)."""
    K = sp.Matrix(p, p, lambda i, j: sp.Rational(i - j, (i + j + 2 + shift)))
    U = _cayley(K)
    return U[:, :k]


def manifold_point(p, k, T, O, model: Model | None = None):
    """Exact overlaps ``(Q, ρ) = ((p/p*) O T Oᵀ, √(p/p*) O T)`` of ``W = √(p/p*) O W*``.

    With `model`: ``W = R W*``, ``R = |cD_a|^{-1/2} O |c*D_b|^{1/2}``, so
    ``(Q, ρ) = (R T Rᵀ, R T)`` (docs/model.md §8.3).
    """
    if model is None:
        s = sp.sqrt(sp.Rational(p, k))
        return (sp.Rational(p, k) * O * T * O.T, s * O * T)
    R = _zero_risk_map(model) * O * _zero_risk_map(model, teacher=True)
    return (R * T * R.T, R * T)


def _zero_risk_map(m: Model, teacher: bool = False) -> sp.Matrix:
    """``|cD_a|^{-1/2}`` (student) or ``|c*D_b|^{1/2}`` (teacher), exact."""
    if teacher:
        cs, _ = quadratic_coefficients(m.teacher_activation)
        return sp.diag(*[sp.sqrt(abs(_rat(cs * b))) for b in m.teacher_readout])
    c, _ = quadratic_coefficients(m.activation)
    return sp.diag(*[1 / sp.sqrt(abs(_rat(c * a))) for a in m.readout])


def _manifold_model(m: Model, routine: str) -> Model:
    check(m, routine, "manifold")
    if not m.is_quadratic:
        _risk(m)            # raises, naming the activations
    reason = zero_risk_reason(m)
    if reason:
        raise ValueError(f"{routine}: {reason} (model {m!r})")
    return m


def _default_T(k):
    # a non-diagonal rational positive-definite teacher overlap
    T = sp.eye(k) + sp.Matrix(k, k, lambda a, b: sp.Rational(1, 4 * (a + b + 2)))
    return T


def zero_risk_points_check(m: Model, n_points: int = 2) -> dict:
    r"""Exact risk on points of ``Z_T`` (``ε = 0``) and just off it (``ε > 0``).

    Points: ``O`` = Cayley-rational Stiefel matrices, ``T`` = identity and a
    non-diagonal rational ``T``.  Off-manifold control: ``ρ → (1 + 1/10) ρ`` with
    ``Q`` rescaled consistently (``Q = ρT⁻¹ρᵀ``, still realisable).  For a
    changed model the points are :func:`manifold_point` of that model (a
    trained readout at ``a(0)``).
    """
    _manifold_model(m, "zero_risk_points_check")
    risk, (Qs, rs, Ts) = _risk(m)
    p, k = m.p, m.p_star
    if p < k:
        raise ValueError("p < p_star: the zero-risk set is empty (see underparameterised_check)")
    results = []
    for T in (sp.eye(k), _default_T(k)):
        for shift in range(n_points):
            O = _stiefel_point(p, k, shift)
            Q, rho = manifold_point(p, k, T, O, model=None if not m.changed_fields() else m)
            for scale, expect_zero in ((1, True), (sp.Rational(11, 10), False)):
                rr = scale * rho
                QQ = rr * T.inv() * rr.T
                subs = {Qs[i, j]: QQ[i, j] for i in range(p) for j in range(i, p)}
                subs.update({rs[i, a]: rr[i, a] for i in range(p) for a in range(k)})
                subs.update({Ts[a, b]: T[a, b] for a in range(k) for b in range(a, k)})
                val = sp.nsimplify(sp.radsimp(sp.expand(risk.xreplace(subs))))
                ok = (val == 0) if expect_zero else (val > 0)
                if not ok:
                    raise AssertionError(f"risk {val} at {'on' if expect_zero else 'off'}-"
                                         f"manifold point (T={T.tolist()})")
                results.append(val)
    return {"values": results}


def constraint_jacobian(p, k, T, rho, D=None):
    r"""Matrix of ``dΦ_T`` at ``ρ`` (coordinates: upper triangles of ``δQ``, entries of ``δρ``).

    ``D`` (p×p diagonal, default ``I``) weights the second block,
    ``Φ_2 = ρᵀDρ − …`` (``D = |cD_a|`` for a changed readout).
    """
    Qsym = sp.Matrix(p, p, lambda i, j: sp.Symbol(f"dq_{min(i, j)}_{max(i, j)}"))
    Rsym = sp.Matrix(p, k, lambda i, a: sp.Symbol(f"dr_{i}_{a}"))
    D = sp.eye(p) if D is None else D
    Tinv = T.inv()
    out1 = Qsym - Rsym * Tinv * rho.T - rho * Tinv * Rsym.T
    out2 = Rsym.T * D * rho + rho.T * D * Rsym
    outs = [out1[i, j] for i in range(p) for j in range(i, p)] + \
        [out2[a, b] for a in range(k) for b in range(a, k)]
    ins = [Qsym[i, j] for i in range(p) for j in range(i, p)] + list(Rsym)
    return sp.Matrix(outs).jacobian(ins)


def orbit_jacobian(p, k, Q, rho):
    r"""Matrix of ``Ω ↦ (ΩQ − QΩ, Ωρ)`` on a basis of ``so(p)``."""
    cols = []
    for i in range(p):
        for j in range(i + 1, p):
            Om = sp.zeros(p, p)
            Om[i, j], Om[j, i] = 1, -1
            X, Y = Om * Q - Q * Om, Om * rho
            cols.append([X[a, b] for a in range(p) for b in range(a, p)] + list(Y))
    return sp.Matrix(cols).T if cols else sp.zeros(p * (p + 1) // 2 + p * k, 0)


def _exact_rank(M) -> int:
    """Rank of a rational matrix by fraction-exact elimination over QQ.

    Same exact answer as ``Matrix.rank()`` but on SymPy's dense domain matrices,
    which avoids generic-expression simplification (minutes at p = 8).
    """
    from sympy.polys.matrices import DomainMatrix
    return DomainMatrix.from_Matrix(M).convert_to(sp.QQ).rank()


def dimension_check(p, p_star, model: Model | None = None) -> dict:
    r"""Exact ranks at points of ``Z_T`` for ``T = I`` and a non-diagonal rational ``T``.

    By the scaling ``δρ → √(p/p*) δρ`` the rank of ``dΦ_T`` at ``ρ = √(p/p*) O T`` equals
    its rank at ``ρ = O T`` (rational), which is what is computed.  Returns
    ``{"formula", "kernel_dims", "orbit_ranks", "domain", "codomain"}``.

    With `model`: the same scaling holds for uniform readouts (``ρ = s O T``,
    ``Φ_2 = cα ρᵀρ − c*β T²``), so the ranks are the classic ones at the same
    rational points and the formula is the model's (:func:`symquad.manifold_dimension`;
    a trained readout adds ``p`` coordinates, the readouts, whose ``dΦ`` columns
    ``ρ_iᵀρ_i`` are included).  Non-uniform readouts are refused here (their
    points are irrational; ``symquad.numeric.invariants.manifold_rank_deficiency``
    measures them numerically).
    """
    p, k = int(p), int(p_star)
    trained = False
    if model is not None:
        _manifold_model(model, "dimension_check")
        if len(set(model.readout)) > 1 or len(set(model.teacher_readout)) > 1:
            raise ValueError("dimension_check does not support the model field(s) readout/"
                             "teacher_readout when non-uniform (irrational points; use "
                             "manifold_rank_deficiency)")
        p, k, trained = model.p, model.p_star, model.readout_trained
    if p < k:
        raise ValueError("p < p_star: the zero-risk set is empty")
    formula = p * k - k * (k + 1) // 2 + (p if trained else 0)
    kernel, orbit = [], []
    for T in (sp.eye(k), _default_T(k)):
        O = _stiefel_point(p, k)
        J = constraint_jacobian(p, k, T, O * T)
        if trained:     # δa_i moves the second block by ρ_iᵀρ_i (uniform α: a scale)
            rho = O * T
            cols = [[(rho[i, :].T * rho[i, :])[a, b] for a in range(k) for b in range(a, k)]
                    for i in range(p)]
            J = J.row_join(sp.zeros(p * (p + 1) // 2, p).col_join(sp.Matrix(cols).T))
        kernel.append(J.shape[1] - _exact_rank(J))
        # the orbit map is homogeneous in the scale too; use the exact point
        Q, rho = sp.Rational(p, k) * O * T * O.T, O * T
        orbit.append(_exact_rank(orbit_jacobian(p, k, Q, rho)))
    return {"formula": formula, "kernel_dims": kernel, "orbit_ranks": orbit,
            "domain": p * (p + 1) // 2 + p * k + (p if trained else 0),
            "codomain": p * (p + 1) // 2 + k * (k + 1) // 2}


def underparameterised_check(p, p_star) -> dict:
    r"""For ``p < p*``: ``det(ρᵀρ)`` vanishes identically (symbolic ``ρ``), so
    ``ρᵀρ = (p/p*)T²`` (``det > 0``) has no solution and ``Z_T = ∅``."""
    p, k = int(p), int(p_star)
    if p >= k:
        raise ValueError("underparameterised_check needs p < p_star")
    rho = sp.Matrix(p, k, lambda i, a: sp.Symbol(f"rho_{i + 1}_{a + 1}", real=True))
    det = sp.expand((rho.T * rho).det())
    return {"det_rhoTrho": det, "empty": det == 0}


def underparameterised_minimum(m: Model) -> dict:
    r"""Best risk for ``p < p*`` (``T = I``) within the aligned ansatz, from the derived risk.

    Ansatz: ``W = √(p s) [I_p, 0] W*`` (the student spans ``p`` of the teacher
    directions with equal weights), i.e. ``Q = p s I_p``, ``ρ = √(p s) [I_p, 0]``,
    ``T = I``.  The derived risk restricted to it is a quadratic in ``s``; its
    minimiser ``s*`` and value ``ε*`` are returned.  For ``σ = c z²`` this gives
    ``ε* = c² (p* − p)(p* + 2) / (p*² (p + 2))``.  That the ansatz attains the global
    minimum is checked numerically (``tests/test_manifold.py``), not proved here.
    For a changed model (uniform readouts, ``σ* = c* z²``; weight decay and
    batch size do not enter the risk) the ansatz is evaluated on its derived
    risk and ``closed_form`` is None (the closed form is the classic one).
    """
    check(m, "underparameterised_minimum", "minimum")
    p, k = m.p, m.p_star
    if p >= k:
        raise ValueError(f"underparameterised_minimum needs p < p_star, got p={p}, p_star={k}")
    risk, (Qs, rs, Ts) = _risk(m)
    s = sp.Symbol("s", positive=True)
    rho = sp.sqrt(p * s) * sp.eye(p, k)
    subs = {Qs[i, j]: (p * s if i == j else 0) for i in range(p) for j in range(i, p)}
    subs.update({rs[i, a]: rho[i, a] for i in range(p) for a in range(k)})
    subs.update({Ts[a, b]: (1 if a == b else 0) for a in range(k) for b in range(a, k)})
    f = sp.expand(risk.xreplace(subs))
    crit = sp.solve(sp.diff(f, s), s)
    if len(crit) != 1 or not sp.diff(f, s, 2).is_positive:
        raise AssertionError(f"risk along the ansatz is not a convex quadratic in s: {f}")
    s_star = sp.nsimplify(crit[0])
    value = sp.factor(f.subs(s, s_star))
    if m.changed_fields():
        return {"risk_of_s": f, "s_star": s_star, "min_risk": value,
                "closed_form": None, "closed_form_agrees": False}
    c = sp.Rational(m.activation[2].numerator, m.activation[2].denominator)
    closed = c ** 2 * sp.Rational((k - p) * (k + 2), k * k * (p + 2))
    return {"risk_of_s": f, "s_star": s_star, "min_risk": value,
            "closed_form": closed, "closed_form_agrees": sp.simplify(value - closed) == 0}


def manifold_latex(p, p_star, model: Model | None = None) -> str:
    """Statement and checks of the manifold results for ``(p, p*)`` as LaTeX.

    With a changed `model` (uniform readouts, ``σ* = c* z²``, weight decay,
    batch size, a trained readout; see :func:`dimension_check`) the statement
    and the exact checks are those of the model; other changes are refused by
    name.
    """
    if model is not None and model.changed_fields():
        return _changed_manifold_latex(model)
    p, k = int(p), int(p_star)
    m = _model(p, k) if model is None else model
    L = [f"% symquad: zero-risk manifold, p={p}, p*={k}\n",
         r"\paragraph{Zero-risk condition.} With $A=\mathrm{diag}(I_p/p,-I_{p^*}/p^*)$, "
         r"$C=\begin{pmatrix}Q&\rho\\\rho^\top&T\end{pmatrix}$, the derived risk satisfies "
         r"$\varepsilon=\tfrac12\operatorname{tr}(AC)^2+\operatorname{tr}((AC)^2)$ "
         r"(checked identically). For $C=GG^\top$, $G=[W;W^*]/\sqrt N$: "
         r"$\varepsilon=\tfrac12(\operatorname{tr}M)^2+\|M\|_F^2$, "
         r"$M=G^\top AG=(W^\top W/p-W^{*\top}W^*/p^*)/N$, so $\varepsilon=0\iff "
         r"W^\top W/p=W^{*\top}W^*/p^*\iff W=\sqrt{p/p^*}\,OW^*$, $O^\top O=I_{p^*}$."]
    risk_trace_form(m)
    if p < k:
        chk = underparameterised_check(p, k)
        mn = underparameterised_minimum(m)
        L.append("\n\n" + r"\paragraph{$p<p^*$.} $\det(\rho^\top\rho)="
                 + sp.latex(chk["det_rhoTrho"]) + r"$ identically (rank $\le p$), but "
                 r"$\det((p/p^*)T^2)>0$: no zero-risk point exists. For $T=I$ the best "
                 r"aligned student $Q=psI_p$, $\rho=\sqrt{ps}\,[I_p,0]$ has risk $"
                 + sp.latex(mn["risk_of_s"]) + r"$, minimal at $s^*=" + sp.latex(mn["s_star"])
                 + r"$ with $\varepsilon^*=" + sp.latex(mn["min_risk"])
                 + (r"=\frac{(p^*-p)(p^*+2)}{p^{*2}(p+2)}" if mn["closed_form_agrees"] else "")
                 + r"$ (global minimality checked numerically).")
        return "".join(L) + "\n"
    zero_risk_points_check(m, n_points=1)
    d = dimension_check(p, k)
    L.append("\n\n" + r"\paragraph{Manifold.} In overlap space, at fixed $T\succ0$, "
             r"$Z_T=\{\Phi_T=0\}$ with $\Phi_T(Q,\rho)=(Q-\rho T^{-1}\rho^\top,\ "
             r"\rho^\top\rho-\tfrac{p}{p^*}T^2)$ "
             r"(exact check: $\varepsilon=0$ on $(\tfrac p{p^*}OTO^\top,\sqrt{p/p^*}OT)$, "
             r"$\varepsilon>0$ off it). $d\Phi_T:\mathrm{Sym}(p)\times\mathbb R^{p\times p^*}"
             r"\to\mathrm{Sym}(p)\times\mathrm{Sym}(p^*)$ "
             f"(dimensions ${d['domain']}\\to{d['codomain']}$) has kernel dimension "
             f"${d['kernel_dims'][0]}$ ($T=I$) and ${d['kernel_dims'][1]}$ (non-diagonal $T$), "
             f"i.e. it is onto; the $O(p)$ orbit map has rank ${d['orbit_ranks'][0]}$, "
             f"${d['orbit_ranks'][1]}$. Hence $\\dim Z_T = pp^*-p^*(p^*+1)/2 = {d['formula']}$, "
             r"the dimension of the Stiefel manifold $O(p)/O(p-p^*)$; the weight-space "
             r"zero-risk set $\{\sqrt{p/p^*}OW^*\}$ maps bijectively onto $Z_T$.")
    return "".join(L) + "\n"


def _changed_manifold_latex(m: Model) -> str:
    """:func:`manifold_latex` for a changed model (uniform readouts)."""
    p, k = m.p, m.p_star
    if p < k:
        raise ValueError(f"manifold_latex: p={p} < p_star={k}: the zero-risk set is empty")
    d = dimension_check(p, k, model=m)       # refuses what is not derived, names the field
    trace = risk_trace_form(m)
    zero_risk_points_check(m, n_points=1)
    s2 = zero_risk_scale(m)
    L = [f"% symquad: zero-risk manifold, model {m!r}\n",
         r"\paragraph{Zero-risk condition.} With $A=" + sp.latex(trace["A"])
         + r"$ ($\operatorname{diag}(c\,a,-c^*b)$), $\kappa=" + sp.latex(trace["kappa"])
         + r"$ and $C=\begin{pmatrix}Q&\rho\\\rho^\top&T\end{pmatrix}$, the derived risk "
         r"satisfies $\varepsilon=\tfrac12(\operatorname{tr}(AC)+\kappa)^2+\operatorname{tr}"
         r"((AC)^2)$ (checked identically). For $C=GG^\top$: $\varepsilon=\tfrac12(\operatorname"
         r"{tr}M)^2+\|M\|_F^2$, $M=(c\alpha W^\top W-c^*\beta W^{*\top}W^*)/N$, so "
         r"$\varepsilon=0\iff W=s\,OW^*$, $O^\top O=I_{p^*}$, $s^2=c^*\beta/(c\alpha)="
         + sp.latex(_rat(s2)) + r"$."]
    if m.readout_trained:
        L.append(r" The readout is trained: $a$ is a coordinate too, and for every $a$ with "
                 r"$c\,a_k$ of the sign of $c^*b$ the zero-risk weights are "
                 r"$W=|cD_a|^{-1/2}O|c^*D_b|^{1/2}W^*$, which adds $p$ dimensions.")
    if m.weight_decay or m.batch_size > 1:
        L.append(r" Weight decay and the batch size do not enter the risk"
                 + (r"; with weight decay the zero-risk points are not fixed points of the "
                    r"ODE." if m.weight_decay else "."))
    L.append("\n\n" + r"\paragraph{Manifold.} $Z_T=\{\Phi_T=0\}$, $\Phi_T(Q,\rho)=(Q-\rho "
             r"T^{-1}\rho^\top,\ \rho^\top\rho-s^2T^2)$ (exact check: $\varepsilon=0$ on "
             r"$(s^2OTO^\top,sOT)$, $\varepsilon>0$ off it). "
             f"$d\\Phi_T$ (dimensions ${d['domain']}\\to{d['codomain']}$) has kernel dimension "
             f"${d['kernel_dims'][0]}$ ($T=I$) and ${d['kernel_dims'][1]}$ (non-diagonal $T$); "
             f"the $O(p)$ orbit map has rank ${d['orbit_ranks'][0]}$, ${d['orbit_ranks'][1]}$. "
             f"Hence $\\dim Z_T = {d['formula']}$"
             + (r" $=pp^*-p^*(p^*+1)/2+p$." if m.readout_trained else r" $=pp^*-p^*(p^*+1)/2$."))
    return "".join(L) + "\n"
