"""``symquad survival``: which of the paper's results survive which change of the model.

Runs, for the classic model and one change of each field of the model
specification, the checks of :mod:`symquad.survival` (plateau, escape law,
zero-risk manifold, conservation of ``S`` and the closest solution, Hessian
spectra at the critical points) and prints the table with the reasons of the
refusals as notes.  Measured for the default base (p = 3, p* = 2): 48 s and
68 s wall-clock on a shared 2-core machine at load 5.5 and 7.
"""

from __future__ import annotations

import sys

from ..spec import CLASSIC_FIELDS, model_fields
from ..survival import survival_table
from ._model_args import add_model_arguments, model_from_args


def register(sub):
    parser = sub.add_parser(
        "survival", help="table: which of the paper's results survive which model change",
        description="For the classic model and one change of each model field, run the "
                    "plateau, escape-law, zero-risk-manifold, conservation-of-S and Hessian "
                    "checks and print which results survive (Markdown table).")
    add_model_arguments(parser, fixed={"p": 3, "p_star": 2},
                        exclude=tuple(f.name for f in model_fields()
                                      if f.name not in CLASSIC_FIELDS))
    parser.add_argument("--N-hessian", type=int, default=None,
                        help="input dimension of the Hessian counts (default p + p* + 1)")
    parser.add_argument("--N-escape", type=int, default=10_000,
                        help="input dimension of the escape law (default 10000)")
    parser.add_argument("--samples", type=int, default=16,
                        help="sampled directions of rho(0) for the escape law (default 16)")
    parser.add_argument("--no-notes", action="store_true",
                        help="print the table without the notes on refusals")
    parser.set_defaults(func=run)


def run(args) -> int:
    # lazy: sympy
    from ..symbolic.hessian import MAX_HESSIAN_WIDTH
    try:
        base = model_from_args(args)
        if max(base.p, base.p_star) > MAX_HESSIAN_WIDTH or base.p < base.p_star:
            raise ValueError(f"--p and --p-star must satisfy p_star <= p <= "
                             f"{MAX_HESSIAN_WIDTH} (exact Hessians and proofs), got "
                             f"p={base.p}, p_star={base.p_star}")
        if args.N_hessian is not None and args.N_hessian < base.p + base.p_star:
            raise ValueError(f"--N-hessian must be >= p + p_star = {base.p + base.p_star}, "
                             f"got {args.N_hessian}")
        if not 1 <= args.samples <= 10_000:
            raise ValueError(f"--samples must be in [1, 10000], got {args.samples}")
        if args.N_escape < base.p + base.p_star:
            raise ValueError(f"--N-escape must be >= p + p_star, got {args.N_escape}")
        if base.p + base.p_star > 6:
            print("symquad survival: exact proofs and Hessians beyond p + p* = 6 take "
                  "minutes", file=sys.stderr)
    except (TypeError, ValueError) as exc:
        print(f"symquad survival: error: {exc}", file=sys.stderr)
        return 2
    table = survival_table(base, N_hessian=args.N_hessian, N_escape=args.N_escape,
                           n_samples=args.samples)
    if args.no_notes:
        print(table.markdown(notes=False), end="")
    else:
        print(table, end="")
    return 0
