"""``symquad landscape``: Hessian spectra at the critical points, the plateau, the escape law.

Prints, for one model (T = I):

* the eigenvalue counts (negative / zero / positive) of the weight-space
  Hessian of the risk at ``W = 0``, the plateau and the minimum, as formulas in
  ``(p, p*, N)`` and for the given ``N``, with the exact spectra and the split of
  the zero modes into tangent and extra (overparameterisation) directions;
* the plateau fixed point of the full ODE (``q``, risk, growth rate of ρ, the
  gradient-flow values);
* the predicted median escape time for SGD and for the ODE from a random start.

The model flags are those of every command (:mod:`symquad.cli._model_args`);
these results are derived for the classic model, so a changed specification
field they do not handle is refused by name (exit 2,
:mod:`symquad.studies.applicability`).
"""

from __future__ import annotations

import sys

from ..studies.applicability import require_analysis
from ._model_args import add_model_arguments, model_from_args


def register(sub):
    parser = sub.add_parser(
        "landscape", help="Hessian spectra at critical points, plateau fixed point, escape time",
        description="Weight-space Hessian of the population risk at W=0, the plateau and "
                    "the minimum (exact spectra and counts), the plateau fixed point of the "
                    "ODE with its growth rate, and the predicted escape time.")
    add_model_arguments(parser)
    parser.add_argument("--N", type=int, default=1000,
                        help="input dimension for counts and escape time (default 1000)")
    parser.add_argument("--samples", type=int, default=128,
                        help="sampled directions of rho(0) for the escape law (default 128)")
    parser.add_argument("--no-escape", action="store_true", help="skip the escape prediction")
    parser.set_defaults(func=run)


def _fmt_spec(spec: dict) -> str:
    return ", ".join(f"{v}" + (f" (x{n})" if n > 1 else "")
                     for v, n in sorted(spec.items(), key=lambda kv: float(kv[0])))


def run(args) -> int:
    import sympy as sp

    # lazy: scipy
    from ..numeric import landscape as L
    # lazy: sympy
    from ..symbolic import hessian as H
    # lazy: sympy
    from ..symbolic.fixed_points import plateau_solution
    try:
        m = model_from_args(args)
        for analysis in ("hessian", "plateau", "escape"):
            require_analysis(m, analysis)
        if max(m.p, m.p_star) > H.MAX_HESSIAN_WIDTH:
            raise ValueError(f"--p and --p-star must be <= {H.MAX_HESSIAN_WIDTH} for the exact "
                             f"Hessians (p=6, p*=2 takes ~15 s; the cost roughly doubles with "
                             f"each unit of p), got p={m.p}, p_star={m.p_star}")
        if m.p + m.p_star > 8:
            print(f"symquad landscape: exact Hessians at p={m.p}, p*={m.p_star} take a minute "
                  f"or more", file=sys.stderr)
        if args.N < args.p + args.p_star:
            raise ValueError(f"--N must be >= p + p_star = {args.p + args.p_star}, got {args.N}")
        if not 1 <= args.samples <= L.MAX_ESCAPE_SAMPLES:
            raise ValueError(f"--samples must be in [1, {L.MAX_ESCAPE_SAMPLES}], "
                             f"got {args.samples}")
        if args.N > 10 ** 15:
            raise ValueError(f"--N must be in [p + p_star, 1e15], got {args.N}")
    except (TypeError, ValueError) as exc:
        print(f"symquad landscape: error: {exc}", file=sys.stderr)
        return 2
    N, p, k = args.N, m.p, m.p_star
    print(f"# {m!r}, eta = {m.eta}, T = I, N = {N}")
    print("\n## Hessian of the population risk in the p*N weights "
          "(eigenvalues of d^2 eps/dW^2; N*eigenvalue shown)")
    for point in H.POINTS:
        regime = None if point != "minimum" else ("over" if p >= k else "under")
        spectrum = H.hessian_spectrum(m, point, N)
        blocks = H.hessian_blocks(m, point)
        print(f"\n### {point}  (span dimension r = {spectrum.r})")
        print(spectrum)
        print(f"  in-span block  (N*H, {p * blocks.r}x{p * blocks.r}): "
              f"{_fmt_spec(blocks.parallel_eigenvalues)}")
        print(f"  orthogonal block (N*H, {p}x{p}, x(N - r) = x{N - blocks.r}): "
              f"{_fmt_spec(blocks.perp_eigenvalues)}")
        for value, mult, meaning in H.spectrum_formulas(point, regime):
            print(f"    N*lambda = {sp.simplify(value)}  x [{sp.simplify(mult)}]  ({meaning})")
    print("\n## Plateau fixed point of the ODE (rho = 0, Q = q I; eta^2 term and noise included)")
    try:
        fp = L.plateau(m)
        exact = plateau_solution(m)
    except ValueError as exc:
        print(f"no plateau: {exc}")
        return 0
    print(f"q = {exact.q}  = {fp.q:.10g}   (gradient flow: q = {exact.q_gradient_flow})")
    print(f"risk = {fp.risk:.10g}   (gradient flow: {fp.risk_gradient_flow:.10g})")
    print(f"growth rate of rho kappa = {fp.rate:.10g}   (gradient flow: "
          f"{exact.rate_gradient_flow} = {fp.rate_gradient_flow:.10g})")
    print(f"Q-block Jacobian eigenvalues: isotropic {float(exact.lambda_iso):.6g}, "
          f"traceless {float(exact.lambda_traceless):.6g} (x{p * (p + 1) // 2 - 1})")
    if args.no_escape:
        return 0
    if fp.rate <= 0:
        print("\nthe plateau is stable (kappa <= 0): no escape")
        return 0
    print(f"\n## Escape time (median, start w ~ N(0, I), N = {N}, "
          f"{args.samples} sampled rho(0) directions)")
    pred = L.escape_time(m, N, n_samples=args.samples)
    ode = L.escape_time(m, N, n_samples=args.samples, sgd_noise=False)
    lo, med, hi = pred.quartiles
    print(f"SGD: t_esc = {med:.4f}   (quartiles {lo:.4f}, {hi:.4f}; "
          f"noise seed J = {pred.seed_noise:.4f})")
    lo, med, hi = ode.quartiles
    print(f"ODE from the random start: t_esc = {med:.4f}   (quartiles {lo:.4f}, {hi:.4f})")
    print(f"law: t_esc = log(N)/(2 kappa) + c/kappa with kappa = {pred.rate:.6g}, "
          f"c = {pred.log_prefactor:.4f} (SGD), {ode.log_prefactor:.4f} (ODE)")
    return 0
