"""``symquad equations``: print the derived risk and ODEs as LaTeX."""

from __future__ import annotations

import sys

from ._model_args import add_model_arguments, model_from_args


def register(sub):
    parser = sub.add_parser(
        "equations", help="print the risk and the ODEs as LaTeX",
        description="Derive the population risk and the order-parameter ODEs of a model "
                    "and print them as LaTeX.")
    add_model_arguments(parser, exclude=("lr", "noise", "lr_scaling"), fixed={"p": 3, "p_star": 2})
    parser.add_argument("--form", choices=("matrix", "tensor", "entries"), default=None,
                        help="matrix (width independent, σ = c z²), tensor (width "
                             "independent, any polynomial σ) or entries (entry by entry, "
                             "small p only); default: matrix when σ is quadratic, else tensor")
    parser.add_argument("--standalone", action="store_true",
                        help="print a complete LaTeX document")
    parser.set_defaults(func=run)


def run(args) -> int:
    # lazy: sympy
    from ..symbolic.derive import derive
    try:
        model = model_from_args(args, lr=1.0)
        eq = derive(model, form=args.form)
    except (TypeError, ValueError) as exc:
        print(f"symquad equations: error: {exc}", file=sys.stderr)
        return 2
    print(eq.latex(standalone=args.standalone), end="")
    return 0
