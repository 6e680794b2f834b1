"""Command-line interface: ``symquad <command>`` (also ``python -m symquad``).

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit status).
Modules are imported lazily so that ``symquad --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..entry import ArgumentParser, run_main

# sub-command modules, in the order they are listed by --help
COMMAND_MODULES = (
    "validate",
    "equations",
    "regenerate",
    "invariants",
    "landscape",
    "survival",
    "sweep",
)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="symquad",
        description="Derive, generate and validate the ODE theory of one-pass SGD "
                    "in two-layer quadratic networks.")
    parser.add_argument("--version", action="version", version=f"symquad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"symquad.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"symquad.cli.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv=None) -> int:
    """Run one command; its exit status (0 ok, 1 check failed, 2 bad input, 3 diverged,
    4 inconclusive, 5 internal error, 130 interrupted).

    Every error goes to stderr as one line without a traceback
    (:func:`symquad.entry.run_main`, the mechanism every entry point shares),
    so ``symquad equations > eq.tex`` never captures an error message: a
    ``ValueError``/``TypeError`` from a command (bad input, named by the check
    that raised it) or an unwritable path exits 2, a diverging run 3, anything
    unexpected 5 (``SYMQUAD_TRACEBACK=1`` shows the traceback), an interrupt 130,
    SIGTERM 143 (after the clean-up: worker processes stopped, temporary files
    removed).
    """
    return run_main(_dispatch, argv, prog="symquad")


def _dispatch(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return run_main(args.func, args, prog=f"symquad {args.command}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
