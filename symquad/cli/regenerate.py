"""``symquad regenerate [--check]``: rewrite or drift-check the generated files."""

from __future__ import annotations

import sys


def register(sub):
    parser = sub.add_parser(
        "regenerate", help="rewrite the generated kernels and LaTeX (or --check for drift)",
        description="Re-derive and rewrite every committed file under symquad/_generated. "
                    "With --check, write nothing and exit 1 with a diff if anything differs.")
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 and print a diff on drift")
    parser.set_defaults(func=run)


def run(args) -> int:
    # lazy: sympy
    from ..codegen.regenerate import GENERATED_DIR, regenerate
    diffs = regenerate(check=args.check)
    if args.check:
        if diffs:
            sys.stdout.write("".join(diffs))
            print(f"symquad regenerate --check: {len(diffs)} generated file(s) differ from "
                  f"what the derivation produces; run `symquad regenerate`.")
            return 1
        print(f"symquad regenerate --check: all generated files in {GENERATED_DIR} are up to date.")
        return 0
    print(f"symquad regenerate: {len(diffs)} file(s) rewritten in {GENERATED_DIR}.")
    return 0
