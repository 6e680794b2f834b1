"""``symquad equations``: print the derived risk and ODEs as LaTeX."""

from __future__ import annotations

import sys


def register(sub):
    parser = sub.add_parser(
        "equations", help="print the risk and the ODEs as LaTeX",
        description="Derive the population risk and the order-parameter ODEs of a model "
                    "and print them as LaTeX.")
    parser.add_argument("--p", type=int, default=3, help="student width (default 3)")
    parser.add_argument("--p-star", type=int, default=2, help="teacher width (default 2)")
    parser.add_argument("--activation", default="z**2",
                        help="polynomial activation in z (default z**2)")
    parser.add_argument("--form", choices=("matrix", "tensor", "entries"), default=None,
                        help="matrix (width independent, σ = c z²), tensor (width "
                             "independent, any polynomial σ) or entries (entry by entry, "
                             "small p only); default: matrix when σ is quadratic, else tensor")
    parser.add_argument("--standalone", action="store_true",
                        help="print a complete LaTeX document")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..spec import Model
    from ..symbolic.derive import derive
    try:
        model = Model(p=args.p, p_star=args.p_star, lr=1.0, activation=args.activation)
        eq = derive(model, form=args.form)
    except (TypeError, ValueError) as exc:
        print(f"symquad equations: error: {exc}", file=sys.stderr)
        return 2
    print(eq.latex(standalone=args.standalone), end="")
    return 0
