"""``symquad invariants``: the zero-risk manifold and the conservation of S, as LaTeX.

Derives (with SymPy, from ``symquad.derive``) and prints, for the model given
by the flags (every field of the specification, docs/model.md §2):

* the zero-risk condition, the manifold ``Z_T`` and its dimension
  ``p p* − p*(p*+1)/2`` with exact rank checks (or, for ``p < p*``, why it is
  empty; for a change the manifold is not derived for, why);
* whether ``S = ρ(ρᵀρ)^{-1/2}`` is conserved: for the classic model and the
  changes that keep it, the theorem with its proof steps (instantaneous
  condition, equivariance, diagonal-gauge invariance, reduced ODE) and exact
  counterexamples where its conditions are dropped; for the other changes an
  exact counterexample at the typical start (the first nonzero Taylor
  coefficient of ``S(t)``).
"""

from __future__ import annotations

import sys

from ._model_args import add_model_arguments, model_from_args

#: Largest width the exact (SymPy) checks of this command accept.
MAX_EXACT_P = 10


def register(sub):
    parser = sub.add_parser(
        "invariants", help="print the zero-risk manifold and the conservation of S as LaTeX",
        description="Derive the zero-risk manifold and prove (with SymPy) when the polar "
                    "factor S = rho (rho^T rho)^(-1/2) is conserved by the ODEs of the "
                    "model; for a change of the model that breaks it, print an exact "
                    "counterexample. Statements, proof steps and counterexamples as LaTeX.")
    # the learning rate and the noise are symbolic in these results: not flags
    add_model_arguments(parser, exclude=("lr", "noise", "lr_scaling"),
                        fixed={"p": 3, "p_star": 2})
    parser.add_argument("--only", choices=("manifold", "conservation"), default=None,
                        help="print only one of the two parts")
    parser.add_argument("--standalone", action="store_true",
                        help="print a complete LaTeX document")
    parser.set_defaults(func=run)


def _manifold_part(model) -> str:
    # lazy: sympy
    from ..symbolic.manifold import manifold_latex
    try:
        return manifold_latex(model.p, model.p_star, model=model)
    except ValueError as exc:
        if not model.changed_fields():
            raise
        return f"% symquad: the zero-risk manifold is not derived for {model!r}: {exc}\n"


def run(args) -> int:
    # lazy: sympy
    from ..symbolic.invariants import ProofError, conservation_verdict
    # lazy: sympy
    from ..symbolic.latex import document
    try:
        if args.p < 1 or args.p_star < 1:
            raise ValueError(f"--p and --p-star must be >= 1, got p={args.p}, "
                             f"p_star={args.p_star}")
        if args.p > MAX_EXACT_P or args.p_star > MAX_EXACT_P:
            raise ValueError(
                f"--p and --p-star must be <= {MAX_EXACT_P} for the exact SymPy checks "
                f"(their cost grows fast with p: p=8, p*=2 takes about 30 s); "
                f"symquad.manifold_dimension(p, p_star) gives the dimension at any size")
        model = model_from_args(args, lr=1.0)
        if not model.is_polynomial:
            raise ValueError(f"--activation must be c*z**2 (+ c0): the exact checks rest on a "
                             f"quadratic student (the invariant S and the manifold are "
                             f"derived for it), and {model.activation_str!r} is not a "
                             f"polynomial")
        if not (len(model.activation) == 3 and model.activation[1] == 0):
            raise ValueError(f"--activation must be c*z**2 (+ c0), got {model.activation_str!r}")
        if args.p + args.p_star > 8:
            print(f"symquad invariants: exact checks at p={args.p}, p*={args.p_star} take "
                  f"tens of seconds or more (p=8, p*=2 --only manifold: 26 s measured on "
                  f"2 shared cores)", file=sys.stderr)
        parts = []
        if args.only in (None, "manifold"):
            parts.append(_manifold_part(model))
        if args.only in (None, "conservation"):
            if args.p < args.p_star:
                parts.append("% p < p*: rho has rank <= p < p*, S is not defined.\n")
            else:
                parts.append(conservation_verdict(model).latex())
    except (TypeError, ValueError) as exc:
        print(f"symquad invariants: error: {exc}", file=sys.stderr)
        return 2
    except ProofError as exc:  # a proof step failed: report, never print a false theorem
        print(f"symquad invariants: proof step FAILED: {exc}", file=sys.stderr)
        return 1
    body = "\n".join(parts)
    print(document(body, title="Zero-risk manifold and the conserved S") if args.standalone
          else body, end="")
    return 0
