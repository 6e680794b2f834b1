"""Stage 5: the landscape — Hessians at the critical points and the plateau fixed point.

Derives from the risk and ODEs of ``symquad.derive`` (T = I):

* the weight-space Hessian reduced exactly to the span of student and teacher rows
  (block ``N H_∥``, ``p r × p r``) plus the block on each of the ``N − r``
  orthogonal directions (``N H_⊥``, ``p × p``), at ``W = 0``, the plateau critical
  point of the risk and the minimum; exact spectra, counts, zero modes;
* the plateau fixed point of the full ODE in closed form in ``p, p*, η, Δ`` and its
  Jacobian (growth rate of ρ), with the gradient-flow limit.

Cross-checks asserted: exact blocks == closed-form spectra (hand-derived quadratic
form); ``N H_⊥ = (2a/p) I + (4/p²) Q``; numeric Hessian of the N-dimensional risk
(kernels, finite differences) == exact spectrum; −η N λ_min == O(η) plateau rate;
entry-form ODE at Q = qI == width-independent matrix-form reduction.

    python derivations/05_landscape.py [--p 3 --p-star 2 --N 8]
"""

import argparse

import numpy as np
import sympy as sp

import symquad as sq
from symquad.numeric import landscape as L
from symquad.symbolic import fixed_points as F
from symquad.symbolic import hessian as H
from symquad.symbolic.symbols import ETA, NOISE, P, P_STAR


def _spec_tex(spec):
    return ", ".join(sp.latex(v) + (f"^{{({n})}}" if n > 1 else "")
                     for v, n in sorted(spec.items(), key=lambda kv: float(kv[0])))


def hessian_part(m, N):
    p, k = m.p, m.p_star
    print(f"% ---- weight-space Hessian, p={p}, p*={k}, N={N} (T = I) ----")
    for point in H.POINTS:
        b = H.hessian_blocks(m, point)
        regime = None if point != "minimum" else ("over" if p >= k else "under")
        # closed forms (hand-derived) == exact blocks from the derived risk
        assert b.spectrum(N) == H.formula_spectrum(m, point, N), point
        # orthogonal block == (2a/p) I + (4/p²) Q at the point
        Q = b.X * b.X.T
        a = Q.trace() / p - 1
        assert sp.simplify(b.perp - (2 * a / p * sp.eye(p) + sp.Rational(4, p ** 2) * Q)) \
            == sp.zeros(p, p), point
        # numeric Hessian of the actual N-dimensional risk
        W, Ws = L.critical_weights(m, point, N, seed=1)
        ev = np.linalg.eigvalsh(L.weight_hessian(m, W, Ws))
        assert np.allclose(ev, sq.hessian_spectrum(m, point, N), atol=1e-9)
        assert L.sign_counts(ev) == b.counts(N)
        counts = H.count_formulas(point, regime)
        print(f"% {point}: r = {b.r}; (neg, zero, pos) = {b.counts(N)}; zero modes {b.zero_modes(N)}")
        print(r"\begin{align*}")
        print(rf"N H_\parallel &= {sp.latex(b.parallel)} \\")
        print(rf"N H_\perp &= {sp.latex(b.perp)} \quad (\times\,{N - b.r}) \\")
        print(rf"\operatorname{{spec}}(N H_\parallel) &= \{{{_spec_tex(b.parallel_eigenvalues)}\}},"
              rf"\quad \operatorname{{spec}}(N H_\perp) = \{{{_spec_tex(b.perp_eigenvalues)}\}} \\")
        for value, mult, meaning in H.spectrum_formulas(point, regime):
            print(rf"N\lambda &= {sp.latex(sp.simplify(value))} \quad "
                  rf"\times\,[{sp.latex(sp.simplify(mult))}] && \text{{{meaning}}} \\")
        print(rf"\#_- &= {sp.latex(counts['negative'])},\ \#_0 = {sp.latex(counts['zero'])},"
              rf"\ \#_+ = {sp.latex(counts['positive'])}")
        print(r"\end{align*}")
    # Hessian's escape direction == the ODE's gradient-flow growth rate
    lam = min(H.hessian_blocks(m, "plateau").parallel_eigenvalues)
    fp = L.plateau(m)
    assert abs(-m.eta * float(lam) - fp.rate_gradient_flow) < 1e-10
    print(f"% -eta N lambda_min(plateau) = {-m.eta * float(lam):.10g} == gradient-flow rate "
          f"of rho from the ODE kernel {fp.rate_gradient_flow:.10g}: OK")


def plateau_part(m):
    print("% ---- plateau fixed point of the ODE (rho = 0, Q = q I, T = I) ----")
    red = F.isotropic_reduction()
    gen = F.plateau_solution()
    check = F.check_symmetric_ansatz(m)
    assert check["offdiag_zero"] and check["diag_equal"] and check["drho_zero"]
    eq = sq.derive(m)
    S = red["S"].subs({P: m.p, P_STAR: m.p_star}).subs({ETA: eq.eta, NOISE: eq.noise})
    assert sp.expand(check["S"] - S) == 0
    assert sp.simplify(gen.q_gradient_flow - P / (P + 2)) == 0
    assert sp.simplify(gen.rate_gradient_flow - 4 * ETA / (P * P_STAR)) == 0
    exact = F.plateau_solution(m)
    fp = L.plateau(m)
    assert abs(float(exact.q) - fp.q) < 1e-12 and abs(float(exact.rate) - fp.rate) < 1e-9
    print(r"\begin{align*}")
    print(rf"\dot Q\big|_{{Q=qI,\rho=0}} &= S(q)\, I,\quad S(q) = {sp.latex(red['S'])} \\")
    print(rf"\dot\rho &= \kappa(q)\,\rho + O(\rho^3),\quad \kappa(q) = {sp.latex(red['kappa'])} \\")
    print(rf"\varepsilon(qI, 0, I) &= {sp.latex(red['risk'])} \\")
    print(rf"q_\mathrm{{pl}} &= {sp.latex(gen.q)} \\")
    print(rf"q_\mathrm{{gf}} &= {sp.latex(gen.q_gradient_flow)},\quad "
          rf"\kappa_\mathrm{{gf}} = {sp.latex(gen.rate_gradient_flow)}"
          rf"\ \xrightarrow{{\eta = \mathrm{{lr}}\,p}}\ \frac{{4\,\mathrm{{lr}}}}{{p^*}} \\")
    print(rf"\text{{model}}:\ q &= {sp.latex(exact.q)} \approx {fp.q:.6f},\ "
          rf"\kappa = {fp.rate:.6f},\ \lambda_\mathrm{{iso}} = {float(exact.lambda_iso):.6f},\ "
          rf"\lambda_\mathrm{{tl}} = {float(exact.lambda_traceless):.6f}")
    print(r"\end{align*}")
    print("% symmetric ansatz consistent (entry form), matrix-form S(q) == entry-form S(q), "
          "numeric plateau == closed form: OK")
    if m.p >= m.p_star:
        _, ev, _ = F.solution_jacobian(m)
        thr = F.solution_stability_threshold(m)
        assert ev.get(0, 0) == F.solution_zero_modes(m.p, m.p_star)
        print(f"% zero-risk point: ODE Jacobian eigenvalues {dict(ev)}; "
              f"{ev.get(0, 0)} zero modes; linearly stable for eta < {thr}")


def main(p=3, p_star=2, N=8, lr=0.1):
    m = sq.Model(p=p, p_star=p_star, lr=lr)
    hessian_part(m, N)
    plateau_part(m)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=3)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--N", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    main(args.p, args.p_star, args.N, args.lr)
