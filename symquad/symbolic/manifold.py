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

from ..spec import Model

__all__ = [
    "risk_trace_form", "zero_risk_points_check", "constraint_jacobian", "orbit_jacobian",
    "dimension_check", "underparameterised_check", "underparameterised_minimum",
    "manifold_latex",
]


def _model(p, p_star, activation=(0, 0, 1)) -> Model:
    return Model(p=p, p_star=p_star, lr=0.1, activation=activation)


@lru_cache(maxsize=8)
def _risk(m: Model):
    # cached: risk_trace_form and zero_risk_points_check both need it, and the
    # explicit expansion dominates `symquad invariants --only manifold`
    from .derive import derive
    if not m.is_quadratic:
        raise ValueError(f"the zero-risk manifold is derived for sigma(z) = c z**2 (+ c0); "
                         f"got {m.activation_str!r}")
    eq = derive(m)
    risk, _, _ = eq.explicit()
    return risk, eq.entry_symbols


def risk_trace_form(m: Model) -> dict:
    r"""Verify ``ε ≡ ½ tr(AC)² + tr((AC)²)`` for the derived risk of ``m``.

    Returns ``{"A": A, "C": C, "risk": ε, "identity": True}``; raises
    ``AssertionError`` if the identity fails.
    """
    risk, (Qs, rs, Ts) = _risk(m)
    p, k = m.p, m.p_star
    c = sp.Rational(m.activation[2].numerator, m.activation[2].denominator)
    A = sp.diag(*([c / p] * p + [-c / k] * k))
    C = sp.Matrix(sp.BlockMatrix([[sp.Matrix(Qs), sp.Matrix(rs)],
                                  [sp.Matrix(rs).T, sp.Matrix(Ts)]]))
    # compare as sparse polynomials over QQ (much faster than expanding Exprs)
    gens = sorted(C.free_symbols, key=lambda s: s.name)
    R, *_ = sp.ring(gens, sp.QQ)
    Cr = [[R.from_expr(C[i, j]) for j in range(p + k)] for i in range(p + k)]
    d = [R.from_expr(A[i, i]) for i in range(p + k)]
    AC = [[d[i] * Cr[i][j] for j in range(p + k)] for i in range(p + k)]
    tr1 = sum((AC[i][i] for i in range(p + k)), R(0))
    tr2 = sum((AC[i][j] * AC[j][i] for i in range(p + k) for j in range(p + k)), R(0))
    if R.from_expr(risk) != tr1 ** 2 / 2 + tr2:
        raise AssertionError("derived risk differs from 1/2 tr(AC)^2 + tr((AC)^2)")
    return {"A": A, "C": C, "risk": risk, "identity": True}


def _cayley(K):
    n = K.shape[0]
    return (sp.eye(n) - K) * (sp.eye(n) + K).inv()


def _stiefel_point(p, k, shift=0):
    """Rational ``p×p*`` matrix with orthonormal columns (Cayley rotation of ``[I; 0]``)."""
    K = sp.Matrix(p, p, lambda i, j: sp.Rational(i - j, (i + j + 2 + shift)))
    U = _cayley(K)
    return U[:, :k]


def manifold_point(p, k, T, O):
    """Exact overlaps ``(Q, ρ) = ((p/p*) O T Oᵀ, √(p/p*) O T)`` of ``W = √(p/p*) O W*``."""
    s = sp.sqrt(sp.Rational(p, k))
    return (sp.Rational(p, k) * O * T * O.T, s * O * T)


def _default_T(k):
    # a non-diagonal rational positive-definite teacher overlap
    T = sp.eye(k) + sp.Matrix(k, k, lambda a, b: sp.Rational(1, 4 * (a + b + 2)))
    return T


def zero_risk_points_check(m: Model, n_points: int = 2) -> dict:
    r"""Exact risk on points of ``Z_T`` (``ε = 0``) and just off it (``ε > 0``).

    Points: ``O`` = Cayley-rational Stiefel matrices, ``T`` = identity and a
    non-diagonal rational ``T``.  Off-manifold control: ``ρ → (1 + 1/10) ρ`` with
    ``Q`` rescaled consistently (``Q = ρT⁻¹ρᵀ``, still realisable).
    """
    risk, (Qs, rs, Ts) = _risk(m)
    p, k = m.p, m.p_star
    if p < k:
        raise ValueError("p < p_star: the zero-risk set is empty (see underparameterised_check)")
    results = []
    for T in (sp.eye(k), _default_T(k)):
        for shift in range(n_points):
            O = _stiefel_point(p, k, shift)
            Q, rho = manifold_point(p, k, T, O)
            for scale, expect_zero in ((1, True), (sp.Rational(11, 10), False)):
                rr = scale * rho
                QQ = rr * T.inv() * rr.T
                subs = {Qs[i, j]: QQ[i, j] for i in range(p) for j in range(i, p)}
                subs.update({rs[i, a]: rr[i, a] for i in range(p) for a in range(k)})
                subs.update({Ts[a, b]: T[a, b] for a in range(k) for b in range(a, k)})
                val = sp.nsimplify(sp.simplify(risk.xreplace(subs)))
                ok = (val == 0) if expect_zero else (val > 0)
                if not ok:
                    raise AssertionError(f"risk {val} at {'on' if expect_zero else 'off'}-"
                                         f"manifold point (T={T.tolist()})")
                results.append(val)
    return {"values": results}


def constraint_jacobian(p, k, T, rho):
    r"""Matrix of ``dΦ_T`` at ``ρ`` (coordinates: upper triangles of ``δQ``, entries of ``δρ``)."""
    Qsym = sp.Matrix(p, p, lambda i, j: sp.Symbol(f"dq_{min(i, j)}_{max(i, j)}"))
    Rsym = sp.Matrix(p, k, lambda i, a: sp.Symbol(f"dr_{i}_{a}"))
    Tinv = T.inv()
    out1 = Qsym - Rsym * Tinv * rho.T - rho * Tinv * Rsym.T
    out2 = Rsym.T * rho + rho.T * Rsym
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


def dimension_check(p, p_star) -> dict:
    r"""Exact ranks at points of ``Z_T`` for ``T = I`` and a non-diagonal rational ``T``.

    By the scaling ``δρ → √(p/p*) δρ`` the rank of ``dΦ_T`` at ``ρ = √(p/p*) O T`` equals
    its rank at ``ρ = O T`` (rational), which is what is computed.  Returns
    ``{"formula", "kernel_dims", "orbit_ranks", "domain", "codomain"}``.
    """
    p, k = int(p), int(p_star)
    if p < k:
        raise ValueError("p < p_star: the zero-risk set is empty")
    formula = p * k - k * (k + 1) // 2
    kernel, orbit = [], []
    for T in (sp.eye(k), _default_T(k)):
        O = _stiefel_point(p, k)
        J = constraint_jacobian(p, k, T, O * T)
        kernel.append(J.shape[1] - _exact_rank(J))
        # the orbit map is homogeneous in the scale too; use the exact point
        Q, rho = sp.Rational(p, k) * O * T * O.T, O * T
        orbit.append(_exact_rank(orbit_jacobian(p, k, Q, rho)))
    return {"formula": formula, "kernel_dims": kernel, "orbit_ranks": orbit,
            "domain": p * (p + 1) // 2 + p * k,
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
    """
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
    c = sp.Rational(m.activation[2].numerator, m.activation[2].denominator)
    closed = c ** 2 * sp.Rational((k - p) * (k + 2), k * k * (p + 2))
    return {"risk_of_s": f, "s_star": s_star, "min_risk": value,
            "closed_form": closed, "closed_form_agrees": sp.simplify(value - closed) == 0}


def manifold_latex(p, p_star) -> str:
    """Statement and checks of the manifold results for ``(p, p*)`` as LaTeX."""
    p, k = int(p), int(p_star)
    m = _model(p, k)
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
