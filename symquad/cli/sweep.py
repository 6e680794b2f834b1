r"""``symquad sweep TASK --grid NAME=V1,V2,... --store DIR [--workers N | --scheduler ADDR]``.

Runs a task over the Cartesian product of the grids (:func:`symquad.sweep`),
with progress on stderr (a bar on a terminal, plain lines in a log) and a
one-line summary; ``symquad sweep --list`` prints the
registered tasks and their parameters.  Grid values are parsed as literals,
never evaluated: ``true``/``false`` -> bool, ``none`` -> None, an integer
literal -> int, a decimal/scientific literal (or ``inf``-free float) -> float,
anything else -> str.  ``--grid N=100,1000 --grid p=2,4`` gives 4 points.

Every field of the model (``p``, ``p_star``, ``lr``, ``noise``, ``activation``,
``lr_scaling``, ``teacher_activation``, ``readout``, ``teacher_readout``,
``lr_readout``, ``weight_decay``, ``batch_size``, ``constraint``) is a grid axis
of every built-in task; its values are read and range-checked as the model
reads them (:func:`symquad.cli._model_args.field_value`), so a bad value exits 2
naming the field before anything runs.  A readout's components are separated
by ``:`` because ``,`` separates grid values: ``--grid readout=1/2:1/4,1`` is
two points, ``a = (1/2, 1/4)`` and ``a = 1`` for every unit.  A point whose
model a task cannot handle (a field the analysis was not derived for, a
readout of the wrong length) is an error row naming the field.

Exit status: 0 when every point is ``ok``, 1 when some are errors (the first
five messages go to stderr), 2 for bad arguments.
"""

from __future__ import annotations

import re
import sys

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def parse_value(text: str):
    """A grid value from its text: bool, None, int, float or str (no evaluation)."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    return s


def parse_grid(items) -> dict:
    """``["NAME=V1,V2", ...]`` -> ``{NAME: [v1, v2]}``; ValueError on a malformed item."""
    grid = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"--grid expects NAME=V1,V2,... with NAME an identifier, got "
                             f"{item!r}")
        if name in grid:
            raise ValueError(f"--grid {name} given twice")
        vals = [v for v in values.split(",")]
        if not values.strip() or any(not v.strip() for v in vals):
            raise ValueError(f"--grid {name}: empty value in {values!r}")
        if name in _model_field_names():
            from ._model_args import field_value
            try:
                grid[name] = [field_value(name, v) for v in vals]
            except ValueError as exc:
                raise ValueError(f"--grid {exc}") from None
        else:
            grid[name] = [parse_value(v) for v in vals]
    return grid


def _model_field_names():
    from ..spec import model_fields
    return {f.name for f in model_fields()}


def register(sub):
    import argparse

    from ._model_args import fields_help

    ps = sub.add_parser(
        "sweep", help="run a study over a parameter grid (serial, local Dask, or a cluster)",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="model fields (a grid axis of every built-in task; readout components "
               "separated by ':', e.g. --grid readout=1/2:1/4,1):\n" + fields_help())
    ps.add_argument("task", nargs="?", help="registered task name or package.module:function")
    ps.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="parameter values (repeatable; Cartesian product)")
    ps.add_argument("--store", help="store folder (created; reruns skip finished points)")
    where = ps.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None,
                       help="1: serial in-process; N: local Dask cluster of N processes "
                            "(default: one per core)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="attach to a running dask scheduler, e.g. tcp://host:8786")
    ps.add_argument("--retry-errors", action="store_true",
                    help="recompute stored points whose status is 'error'")
    ps.add_argument("--no-progress", action="store_true",
                    help="no progress (default: a bar on a terminal, plain lines every 10%% or "
                         "10 s in a log)")
    ps.add_argument("--list", action="store_true", help="list the tasks and their parameters")
    ps.set_defaults(func=run)


def _list() -> int:
    from ..studies.tasks import list_tasks
    for t in list_tasks():
        print(f"{t.signature()}  [v{t.version}]")
        if t.summary:
            print(f"    {t.summary}")
    return 0


def run(args) -> int:
    """Execute ``symquad sweep``; returns the exit status."""
    if args.list:
        return _list()
    err = "symquad sweep: error:"
    if not args.task or not args.store:
        print(f"{err} TASK and --store are required (or --list)", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"{err} --workers must be an integer >= 1, got {args.workers}", file=sys.stderr)
        return 2
    from ..studies.sweep import sweep
    client = None
    try:
        grid = parse_grid(args.grid)
        if args.scheduler:
            from distributed import Client
            client = Client(args.scheduler, timeout="20s")
        df = sweep(args.task, grid, args.store, client=client, workers=args.workers,
                   progress=not args.no_progress,
                   retry_errors=args.retry_errors)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"{err} {exc}", file=sys.stderr)
        return 2
    except OSError as exc:          # e.g. no scheduler at that address
        print(f"{err} {exc}", file=sys.stderr)
        return 2
    finally:
        from ..entry import quiet_close
        quiet_close(client)
    info = df.attrs["sweep"]
    print(info.line())
    bad = df[df["status"] != "ok"] if "status" in df else df.iloc[:0]
    for _, row in bad.head(5).iterrows():
        message = " ".join(str(row["error"]).split())       # one line per point
        print(f"  error at key {row['key'][:12]}: {message}", file=sys.stderr)
    return 0 if bad.empty else 1
