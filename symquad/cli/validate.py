"""``symquad validate``: compare the ODE theory with Monte Carlo SGD (or your own data).

With no arguments it runs :data:`symquad.spec.DEFAULT_MODEL` from a random
start (plateau and escape), prints a short table ending with a PASS/FAIL
verdict and writes the report folder (``./symquad_report``: ``report.json``,
``summary.txt``, ``trajectories.npz``, ``risk.png``, ``overlaps.png``,
``escape.png``, ``fss.png``, ``invariant_drift.png``, ``invariant_study.npz``).

The model is given by one flag per field of :class:`symquad.Model`
(``--p --p-star --lr --noise --activation --lr-scaling --teacher-activation
--readout --teacher-readout --lr-readout --weight-decay --batch-size
--constraint``, :mod:`symquad.cli._model_args`); SGD and the ODE are those of
that variant, and the analyses derived for the classic model (plateau/escape,
drift of ``S``) are skipped with a reason naming the field.

``--data FILE.npz`` compares trajectories from elsewhere instead of
simulating (:func:`symquad.compare`): either a file written by
:meth:`symquad.SimulationRun.save` (its model is the default; model flags
that are given replace its fields, e.g. to test the data against another
learning rate) or a plain ``.npz`` with keys ``t`` (n,), ``Q`` (replicas, n,
p, p) or (n, p, p), ``rho`` (replicas, n, p, p*) or (n, p, p*), optional
``T``, and ``readout`` (replicas, n, p) or (n, p) — required when
``--lr-readout`` > 0, refused otherwise — whose model comes from the model flags.

With ``--spectrum "f1:s1,f2:s2,..."`` (inputs ``x ~ N(0, Σ)``, docs/model.md §1a) every
overlap array carries the block axis before its matrix axes: ``Q`` (replicas, n, B, p,
p), ``rho`` (replicas, n, B, p, p*), ``T`` (B, p*, p*), ``--Q0`` (B, p, p) and so on.

``--T``, ``--Q0``, ``--rho0`` read the teacher overlaps and a start from
``.npy``/``.npz`` files (:mod:`symquad.array_files`: no unpickling, shapes
and sizes checked against the model from the headers before any data is
read, everything before the simulation starts).

``--quick`` is a short version (small N, few replicas) for smoke
tests; explicit ``--N`` / ``--replicas`` win over it.

The destination ``--out`` is checked before any computation.  Exit status:
0 PASS, 1 FAIL, 2 bad arguments or destination, 3 SGD diverged,
4 INCONCLUSIVE (too little data to test the criteria).
"""

from __future__ import annotations

import argparse
import os
import sys

from .._safe_io import read_npz
from ..array_files import read_array, read_saved_run
from ..numeric.errors import DivergenceError
from ..spec import DEFAULT_MODEL, model_fields
from ..spectrum import block_axis, block_dimension
from ..studies.report_io import check_destination
from ._model_args import add_model_arguments
# the module, not its functions: validate/compare are looked up when the command runs,
# so a replacement in symquad.studies.validation (the tests' seam) takes effect
from ..studies import validation as _validation

# --quick: small enough for a test, still every stage (SGD, ODE, escape, FSS, drift)
_QUICK = dict(N=400, replicas=32, fss_N=[50, 200, 800, 3200], fss_replicas=16, fss_t_max=4.0,
              n_times=121, invariant_N=(100, 400), invariant_replicas=4)
# flags that describe a simulation, meaningless with --data
_SIMULATION_FLAGS = ("t_max", "replicas", "seed", "start", "method", "quick")
_DATA_KEYS = ("t", "Q", "rho", "T", "readout")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {value}")
    return value


def register(subparsers) -> None:
    """Add the ``validate`` sub-command."""

    ps = subparsers.add_parser(
        "validate",
        help="compare the ODE theory with SGD simulations or your data (verdict + figures)",
        description="Run SGD (exact reduced simulator by default), integrate the ODE from the "
                    "realised initial overlaps of every replica, report the deviation before "
                    "and after the escape, the spread of escape times and the finite-size "
                    "scaling of the deviation (fitted exponent, theory -1/2), and decide "
                    "PASS/FAIL. Every model field is honoured; analyses derived for the "
                    "classic model are skipped with a reason naming the field. With --data, "
                    "compare your own trajectories instead. Exit "
                    "status: 0 PASS, 1 FAIL, 2 bad arguments, 3 SGD diverged, 4 INCONCLUSIVE.")
    # Model flags have no argparse default (SUPPRESS): run() tells the flags that were given
    # from the defaults (DEFAULT_MODEL, or the model saved in a --data run file).
    add_model_arguments(ps, suppress_defaults=True)
    ps.add_argument("--N", type=_positive_int, default=None,
                    help="input dimension (default 2000; 400 with --quick); with --data, the "
                         "data's input dimension, which turns on the whole-run criteria")
    ps.add_argument("--t-max", type=_positive_float, default=None,
                    help="final time steps/N (default: 2.5·log(N)/(2κ) from the plateau "
                         "growth rate κ for a random start, 10/η otherwise)")
    ps.add_argument("--replicas", type=_positive_int, default=None,
                    help="SGD replicas, >= 2 (default 64; 32 with --quick)")
    ps.add_argument("--seed", type=int, default=None, help="random seed >= 0 (default 0)")
    ps.add_argument("--start", choices=("random", "informed"), default=None,
                    help="random: w ~ N(0, I) (plateau, escape); informed: ρ(0) of order 1 "
                         "(default: random for σ = c z² when the escape analysis applies, "
                         "informed otherwise)")
    ps.add_argument("--method", choices=("reduced", "full"), default=None,
                    help="SGD simulator (reduced: exact in law, cost independent of N; "
                         "default reduced)")
    ps.add_argument("--no-fss", action="store_true", help="skip the finite-size scaling")
    ps.add_argument("--no-invariant", action="store_true",
                    help="skip the finite-N drift study of the invariant S = ρ(ρᵀρ)^(-1/2)")
    ps.add_argument("--no-whole-run", action="store_true",
                    help="skip the whole-run criteria (SGD vs the order-parameter SDE from "
                         "the same starts, replica spread vs the linear-noise prediction)")
    ps.add_argument("--workers", type=_positive_int, default=1,
                    help="processes: > 1 runs the finite-size scaling and the drift study "
                         "in worker processes beside the main comparison (pays on idle cores; "
                         "default 1)")
    ps.add_argument("--data", default=None, metavar="FILE.npz",
                    help="compare trajectories from FILE.npz instead of simulating: a file "
                         "written by SimulationRun.save (its model is the default, model "
                         "flags given replace its fields) or a plain .npz with keys t, Q, rho, "
                         "optional T and readout (required when --lr-readout > 0); not with "
                         "the simulation flags")
    for name, what in (("T", "teacher overlaps T, shape (p*, p*) (default identity; with "
                             "--spectrum (B, p*, p*), default f_b I per block)"),
                       ("Q0", "initial student overlaps Q0, shape (p, p) or (replicas, p, p) "
                              "(with --spectrum a block axis B before p, p)"),
                       ("rho0", "initial overlaps rho0, shape (p, p*) or (replicas, p, p*) "
                                "(with --spectrum a block axis B before p, p*)")):
        ps.add_argument(f"--{name}", default=None, metavar="FILE",
                        help=f"{what}, from a .npy file or an .npz with one array (or one "
                             f"named {name}); read without unpickling, its shape checked "
                             f"against the model before the data is read"
                             + ("; --Q0 and --rho0 go together, not with --start"
                                if name != "T" else ""))
    ps.add_argument("--out", default="symquad_report",
                    help="report folder (replaced whole; checked before computing; default "
                         "symquad_report)")
    ps.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (default: bars on a terminal, plain lines with "
                         "the time left in a log)")
    ps.add_argument("--format", choices=("png", "pdf", "svg"), default="png",
                    help="file format of the report's figures (pdf, svg: vector, for a "
                         "paper; default png)")
    ps.add_argument("--quick", action="store_true",
                    help="short version (N=400, 32 replicas, small FSS and drift "
                         "study) for smoke tests; explicit --N/--replicas win")
    ps.set_defaults(func=run)


def _fail(message) -> int:
    print(f"symquad validate: error: {message}", file=sys.stderr)
    return 2


def _check_data_headers(path, headers, blocks=0):
    """Refuse a ``--data`` file from its declared dtypes and shapes, before reading it.

    ``blocks``: 1 for a model with an input spectrum, whose ``Q``, ``rho`` and ``T``
    carry a block axis (docs/model.md §1a), else 0.
    """
    ndims = {"t": (1,), "Q": (3 + blocks, 4 + blocks), "rho": (3 + blocks, 4 + blocks),
             "T": (2 + blocks,), "readout": (2, 3)}
    for key, (dtype, shape) in headers.items():
        if dtype.kind not in "biufc":
            raise ValueError(f"--data {path!r}: array {key!r} has dtype {dtype}; numbers "
                             f"are needed")
        if len(shape) not in ndims[key]:
            raise ValueError(f"--data {path!r}: array {key!r} has shape {shape}; expected "
                             f"{' or '.join(f'{d}-d' for d in ndims[key])}")
    missing = [k for k in ("t", "Q", "rho") if k not in headers]
    if missing:
        raise ValueError(f"--data {path!r} lacks the array(s) {missing} (keys: t, Q, "
                         f"rho, optional T, readout)")


def load_data(path, blocks=0) -> dict:
    """Arrays of a ``--data`` file: keys t, Q, rho and optionally T and readout, nothing else.

    Checked before anything is allocated (:func:`symquad._safe_io.read_npz`):
    a regular file (a FIFO or device is refused without blocking), a zip
    archive whose members are only those keys, each member's declared size
    within the memory limit (so a zip bomb is refused in constant memory),
    each ``.npy`` header describing exactly its member's bytes (a lying header
    is refused) with a numeric dtype and the expected number of dimensions.
    Read with ``allow_pickle=False`` (an npz holding Python objects is
    refused, never unpickled).  ``blocks=1``: the overlaps of a model with an input
    spectrum, ``Q`` (replicas, n, B, p, p) or (n, B, p, p) and so on.
    """

    if not os.path.lexists(path):
        raise ValueError(f"--data {path!r}: no such file")
    try:
        arrays, _ = read_npz(path, f"--data {path!r}", keys=_DATA_KEYS,
                             check=lambda headers, _: _check_data_headers(path, headers,
                                                                          blocks))
    except FileNotFoundError:
        raise ValueError(f"--data {path!r}: no such file") from None
    except OSError as exc:
        raise ValueError(f"--data {path!r} cannot be read ({exc})") from None
    return arrays


def _model(args, base):
    """``base`` with the model flags that were given (they have no argparse default)."""
    return base.replace(**{f.name: getattr(args, f.name) for f in model_fields()
                           if hasattr(args, f.name)})


def _is_saved_run(path) -> bool:
    """True for a file written by ``SimulationRun.save`` (a zip with a ``meta.json``)."""
    import zipfile
    try:
        if not os.path.isfile(path) or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as zf:
            return "meta.json" in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _read_data_file(args):
    """``(model, arrays)`` for ``--data``: a saved run (its model) or a plain .npz (the flags')."""

    if _is_saved_run(args.data):
        if args.T is not None:
            raise ValueError("--T: a saved run holds its own teacher overlaps T")

        def shapes(saved, n):
            m = _model(args, saved)
            p, k, lead = m.p, m.p_star, block_axis(m)
            return {"Q": [(None, n) + lead + (p, p)], "rho": [(None, n) + lead + (p, k)],
                    "T": [lead + (k, k)], "readout": [(None, n, p)]}
        saved, data = read_saved_run(args.data, "--data", shapes)
        return _model(args, saved), data
    model = _model(args, DEFAULT_MODEL)
    data = load_data(args.data, len(block_axis(model)))
    if args.T is not None:
        if "T" in data:
            raise ValueError(f"--T given, but --data {args.data!r} holds T too; give one")
        data["T"] = _overlap_files(args, model, None)["T"]
    return model, data


def _overlap_files(args, model, replicas) -> dict:
    """``T``, ``Q0``, ``rho0`` read from the files given (shapes checked before reading)."""

    p, k = model.p, model.p_star
    lead = block_axis(model)      # (B,) with an input spectrum: one matrix per block
    shapes = {"T": [lead + (k, k)], "Q0": [lead + (p, p)], "rho0": [lead + (p, k)]}
    if replicas is not None:
        shapes["Q0"].append((replicas,) + lead + (p, p))
        shapes["rho0"].append((replicas,) + lead + (p, k))
    return {name: read_array(getattr(args, name), f"--{name}", shapes[name])
            for name in ("T", "Q0", "rho0") if getattr(args, name) is not None}


def _simulation_kwargs(args, model=DEFAULT_MODEL) -> dict:
    """validate() keyword arguments; explicit flags win over --quick."""
    kwargs = dict(N=2000, replicas=64)
    if args.quick:
        kwargs.update(_QUICK)
        if block_axis(model):
            # every block of an input spectrum needs f_b N whole coordinates (>= p + p* + b)
            kwargs.update(N=block_dimension(model, kwargs["N"]),
                          fss_N=[block_dimension(model, n) for n in kwargs["fss_N"]])
    for name in ("N", "replicas", "t_max", "seed", "start", "method"):
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    kwargs.setdefault("method", "reduced")
    kwargs.setdefault("seed", 0)
    kwargs.update(fss=not args.no_fss, invariant=not args.no_invariant, workers=args.workers,
                  progress=not args.no_progress, whole_run=not args.no_whole_run)
    return kwargs


def run(args) -> int:
    """Execute ``symquad validate``; returns the exit status."""
    try:
        # everything that can be refused is refused before the computation
        check_destination(args.out, name="--out")

        if args.data is not None:
            given = [f"--{n.replace('_', '-')}" for n in _SIMULATION_FLAGS
                     if getattr(args, n) not in (None, False)]
            if given or args.no_fss or args.no_invariant:
                given += ["--no-fss"] * args.no_fss + ["--no-invariant"] * args.no_invariant
                return _fail(f"--data compares given trajectories; {', '.join(given)} "
                             f"describe a simulation and cannot be combined with it")
            if args.Q0 is not None or args.rho0 is not None:
                return _fail("--Q0/--rho0 give the start of a simulation; with --data the ODE "
                             "starts at each replica's first recorded state")
            model, data = _read_data_file(args)
            # --N: the data's input dimension, which the whole-run criteria need
            report = _validation.compare(model, data["t"], data["Q"], data["rho"], data.get("T"),
                             data.get("readout"), progress=not args.no_progress, N=args.N,
                             whole_run=args.N is not None and not args.no_whole_run)
        else:
            if args.seed is not None and args.seed < 0:
                return _fail(f"--seed must be >= 0, got {args.seed}")
            if (args.Q0 is None) != (args.rho0 is None):
                return _fail("--Q0 and --rho0 must be given together")
            model = _model(args, DEFAULT_MODEL)
            kwargs = _simulation_kwargs(args, model)
            kwargs.update(_overlap_files(args, model, kwargs["replicas"]))
            report = _validation.validate(model, **kwargs)
    except (ValueError, TypeError) as exc:
        return _fail(exc)
    except DivergenceError as exc:
        print(f"symquad validate: SGD diverged: {exc}", file=sys.stderr)
        return 3
    print(report.summary())
    try:
        paths = report.save(args.out, format=args.format)
    except (ValueError, OSError) as exc:
        # the destination changed during the computation (checked before it)
        return _fail(f"could not write the report to {args.out!r}: {exc}")
    print(f"\nreport written to {args.out}/: " + ", ".join(
        sorted(os.path.basename(p) for p in paths.values())))
    return {"PASS": 0, "FAIL": 1}.get(report.verdict, 4)
