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
Numbers are bounded like the parameters of :class:`symquad.Model`: an
integer must fit in int64 and a float must be finite (``1e999`` is refused),
so a grid value never overflows later in the task or the store.

``--timeout SECONDS`` bounds each point (it becomes an error row after that);
with ``--scheduler`` the connection must be answered within
``--scheduler-timeout`` seconds (default 30) and a worker must be there within
``--worker-timeout`` seconds (default 300; ``0`` waits forever).

Exit status: 0 when every point is ``ok``, 1 when some are errors (the first
five messages go to stderr), 2 for bad arguments or an unreachable scheduler,
143 when stopped by SIGTERM (finished points are stored, workers stopped).
"""

from __future__ import annotations

import math
import re
import sys

from ..entry import quiet_close
from ..spec import model_fields
from ..studies.store import INT64_RANGE
from ..studies.sweep import connect_scheduler, sweep
from ..studies.tasks import list_tasks
from ._model_args import field_value, fields_help

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


#: Longest numeric literal read (int() of a longer digit string is slow and refused anyway).
_MAX_DIGITS = 400


def parse_value(text: str, name: str = "value"):
    """A grid value from its text: bool, None, int, float or str (no evaluation).

    Raises ValueError for a number out of range: an integer beyond int64 or a
    float that overflows to infinity.
    """

    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    numeric = _INT.match(s) or _FLOAT.match(s)
    if numeric and len(s) > _MAX_DIGITS:
        raise ValueError(f"--grid {name}: the number {s[:20]}... has {len(s)} characters, "
                         f"more than {_MAX_DIGITS}")
    if _INT.match(s):
        value = int(s)
        if not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
            raise ValueError(f"--grid {name}={s}: integers must lie in [-2**63, 2**63 - 1] "
                             f"(allowed range), got {value:.4g}")
        return value
    if _FLOAT.match(s):
        value = float(s)
        if not math.isfinite(value):
            raise ValueError(f"--grid {name}={s}: numbers must be finite (allowed range: "
                             f"|x| < 1.8e308), got {s}")
        return value
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
            try:
                grid[name] = [field_value(name, v) for v in vals]
            except ValueError as exc:
                raise ValueError(f"--grid {exc}") from None
        else:
            grid[name] = [parse_value(v, name) for v in vals]
    return grid


def _model_field_names():
    return {f.name for f in model_fields()}


def _seconds(text):
    import argparse
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") \
            from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text}")
    return value


def _seconds_or_zero(text):
    import argparse
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") \
            from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text}")
    return value


def register(sub):
    import argparse


    ps = sub.add_parser(
        "sweep", help="run a study over a parameter grid (serial, local Dask, or a cluster)",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="model fields (a grid axis of every built-in task; readout components "
               "separated by ':', e.g. --grid readout=1/2:1/4,1; spectrum blocks by ';', "
               "e.g. --grid spectrum=1/4:2;3/4:1/2,1:1):\n" + fields_help())
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
    ps.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                    help="stop a point after this many seconds (it becomes an error row; "
                         "each point then runs in a child process that can be killed)")
    ps.add_argument("--scheduler-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                    help="with --scheduler: give up if it does not answer within this time")
    ps.add_argument("--worker-timeout", type=_seconds_or_zero, default=300.0,
                    metavar="SECONDS",
                    help="Dask: give up on points after this long without any worker "
                         "(0: wait forever)")
    ps.add_argument("--retry-errors", action="store_true",
                    help="recompute stored points whose status is 'error'")
    ps.add_argument("--no-progress", action="store_true",
                    help="no progress (default: a bar on a terminal, plain lines every 10%% or "
                         "10 s in a log)")
    ps.add_argument("--list", action="store_true", help="list the tasks and their parameters")
    ps.set_defaults(func=run)


def _list() -> int:
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
    client = None
    try:
        grid = parse_grid(args.grid)
        if args.scheduler:
            client = connect_scheduler(args.scheduler, timeout=args.scheduler_timeout)
        df = sweep(args.task, grid, args.store, client=client, workers=args.workers,
                   progress=not args.no_progress,
                   retry_errors=args.retry_errors, timeout=args.timeout,
                   worker_timeout=args.worker_timeout or None)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"{err} {exc}", file=sys.stderr)
        return 2
    except OSError as exc:          # e.g. no scheduler at that address
        print(f"{err} {exc}", file=sys.stderr)
        return 2
    finally:
        quiet_close(client)
    info = df.attrs["sweep"]
    print(info.line())
    bad = df[df["status"] != "ok"] if "status" in df else df.iloc[:0]
    for _, row in bad.head(5).iterrows():
        message = " ".join(str(row["error"]).split())       # one line per point
        print(f"  error at key {row['key'][:12]}: {message}", file=sys.stderr)
    return 0 if bad.empty else 1
