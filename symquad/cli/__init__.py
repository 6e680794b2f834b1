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

# sub-command modules, in the order they are listed by --help
COMMAND_MODULES = (
    "validate",
    "equations",
    "regenerate",
    "invariants",
    "landscape",
    "sweep",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="symquad",
        description="Derive, generate and validate the ODE theory of one-pass SGD "
                    "in two-layer quadratic networks.")
    from .. import __version__
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


def _error(command: str, kind: str, exc: BaseException) -> None:
    print(f"symquad {command}: {kind}: {exc}", file=sys.stderr)


def main(argv=None) -> int:
    """Run one command; its exit status (0 ok, 1 check failed, 2 bad input, 3 diverged).

    Every error goes to stderr without a traceback, so ``symquad equations >
    eq.tex`` never captures an error message: a ``ValueError``/``TypeError``
    from a command (bad input, named by the check that raised it) exits 2, a
    diverging run 3, an unwritable path 2, an interrupt 130, SIGTERM 143 (after
    the clean-up: worker processes stopped, temporary files removed).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from .._signals import Terminated, terminate_cleanly
    from ..numeric.errors import DivergenceError
    try:
        with terminate_cleanly():
            return int(args.func(args) or 0)
    except Terminated as exc:
        # raised by SIGTERM: the finally blocks on the way here stopped the worker
        # processes and removed the temporary files
        print(f"symquad {args.command}: {exc}; worker processes stopped, temporary files "
              f"removed", file=sys.stderr)
        return exc.code
    except (ValueError, TypeError) as exc:
        _error(args.command, "error", exc)
        return 2
    except DivergenceError as exc:
        _error(args.command, "diverged", exc)
        return 3
    except OSError as exc:
        _error(args.command, "error", exc)
        return 2
    except KeyboardInterrupt:
        print(f"symquad {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
