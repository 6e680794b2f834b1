"""Reading arrays that users hand to the command line (.npy, .npz, saved runs), checked first.

Every array a command reads from a file the user names (``--T``, ``--Q0``,
``--rho0``, a ``SimulationRun.save`` file given to ``--data``) goes through
:func:`read_array` or :func:`read_saved_run`.  They add the command line's
policy -- real numbers only, the shapes the model allows -- to the readers of
:mod:`symquad._safe_io`, which every file symquad reads back goes through:

* only regular files are opened (a FIFO or a device is refused, never read);
* nothing is unpickled: an array of Python objects is refused from its header;
* each array's ``.npy`` header is read first and its dtype (real numbers only;
  complex is refused as everywhere in symquad) and shape checked against what
  the model allows, *before* any data is read, so a wrong or huge array costs
  nothing;
* the bytes stored must match the header (a ``.npy`` file's size; an ``.npz``
  member's uncompressed size in the zip directory), so a lying header is
  refused, and at most those bytes are read.

Errors are ``ValueError``/``TypeError`` naming the option and what was
expected, raised before any computation.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ._safe_io import open_regular, read_npy, read_npz
from .numeric.persist import FORMAT_VERSION, model_from_dict

__all__ = ["read_array", "read_saved_run", "MAX_META_BYTES", "MAX_ARRAY_BYTES"]

#: Largest ``meta.json`` of a saved run that is read.
MAX_META_BYTES = 1 << 20
#: Largest total of array data read from one file (declared sizes, checked first).
MAX_ARRAY_BYTES = 4 << 30
#: Arrays of a saved run that ``--data`` uses (``readout`` only for a trained readout).
_RUN_ARRAYS = ("t", "Q", "rho", "T", "readout")


def _check_real(dtype, what):
    """Refuse complex and non-numeric dtypes (objects are refused by the reader already)."""
    if dtype.kind == "c":
        raise TypeError(f"{what} must hold real numbers, got complex entries (complex arrays "
                        f"are refused, not truncated to their real part)")
    if dtype.kind not in "iuf":
        raise TypeError(f"{what} must hold real numbers, got dtype {dtype}")


def _fits(shape, pattern) -> bool:
    return len(shape) == len(pattern) and all(w is None or w == n for n, w in zip(shape, pattern))


def _check_shape(shape, allowed, what, dtype=None):
    """``shape`` must fit one of ``allowed`` (tuples; ``None`` stands for any size)."""
    if not any(_fits(shape, pattern) for pattern in allowed):
        want = " or ".join(str(tuple("any" if w is None else w for w in pattern))
                           .replace("'", "") for pattern in allowed)
        raise ValueError(f"{what} must have shape {want} for this model, got {shape}")
    if dtype is not None and math.prod(shape) * dtype.itemsize > MAX_ARRAY_BYTES:
        raise ValueError(f"{what} declares {math.prod(shape) * dtype.itemsize / 2**30:.1f} GiB, "
                         f"more than {MAX_ARRAY_BYTES / 2**30:.0f} GiB "
                         f"(symquad.array_files.MAX_ARRAY_BYTES)")


def _as_float(arr, what, finite=True):
    out = np.asarray(arr).astype(float)
    if finite and not np.all(np.isfinite(out)):
        raise ValueError(f"{what} must be finite (it contains NaN or inf)")
    return out


def _file_kind(path, option):
    """``"npy"``, ``"npz"`` or an error, from the file's first bytes."""
    with open_regular(path, option) as fh:
        magic = fh.read(6)
    if magic == b"\x93NUMPY":
        return "npy"
    if magic[:4] == b"PK\x03\x04" or magic[:4] == b"PK\x05\x06":
        return "npz"
    raise ValueError(f"{option} {str(path)!r} is neither a .npy nor an .npz file")


def read_array(path, option: str, allowed_shapes) -> np.ndarray:
    """One real array from ``path`` (``.npy``, or ``.npz`` holding one array or ``option``'s name).

    Parameters
    ----------
    path : str or path-like
    option : str
        The command-line option, e.g. ``"--T"``, for messages; an ``.npz``
        member named like it without dashes (``T``) is taken when the file
        holds several arrays.
    allowed_shapes : sequence of tuples
        Shapes the model allows; checked on the header before any data is read.
    """
    allowed = [tuple(s) for s in allowed_shapes]
    where = f"{option} {str(path)!r}"

    def check_one(dtype, shape, what):
        _check_real(dtype, what)
        _check_shape(shape, allowed, what, dtype)

    if _file_kind(path, option) == "npy":
        arr = read_npy(path, where, max_bytes=MAX_ARRAY_BYTES,
                       check=lambda dtype, shape: check_one(dtype, shape, where))
        return _as_float(arr, where)
    key = option.lstrip("-").replace("-", "_")
    chosen = []

    def check_npz(headers, _):
        names = sorted(headers)
        if len(names) == 1:
            chosen.append(names[0])
        elif key in headers:
            chosen.append(key)
        else:
            raise ValueError(f"{where} holds {len(names)} arrays ({', '.join(names)}); give "
                             f"a file with one array or an array named {key!r}")
        dtype, shape = headers[chosen[0]]
        check_one(dtype, shape, f"{where}[{chosen[0]}]")

    arrays, _ = read_npz(path, where, max_bytes=MAX_ARRAY_BYTES, check=check_npz)
    return _as_float(arrays[chosen[0]], f"{where}[{chosen[0]}]")


def _saved_model(extras, where):
    """The model a saved run's ``meta.json`` names (kind and format version checked)."""

    if "meta.json" not in extras:
        raise ValueError(f"{where} is not a saved symquad run (no meta.json)")
    try:
        meta = json.loads(extras["meta.json"].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: meta.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("kind") != "SimulationRun":
        kind = meta.get("kind") if isinstance(meta, dict) else None
        raise ValueError(f"{where} holds a {kind!r}, not a 'SimulationRun'")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where} has format version {meta.get('format_version')!r}; "
                         f"this symquad reads version {FORMAT_VERSION}")
    return model_from_dict(meta.get("model"))


def read_saved_run(path, option: str, shapes_for):
    """Arrays ``t, Q, rho, T`` and the model of a ``SimulationRun.save`` file, checked first.

    Parameters
    ----------
    path : str or path-like
    option : str
        For messages (``"--data"``).
    shapes_for : callable
        ``shapes_for(model, n_times) -> {name: allowed shapes}`` for ``Q``,
        ``rho`` and ``T`` (tuples, ``None`` for any size): the sizes the model
        allows, checked on each member's header before any data is read.

    Returns
    -------
    (Model, dict) : the saved model and ``{"t", "Q", "rho", "T"}`` (and ``"readout"``
    when the run trained its readout; `shapes_for` must then allow it too).

    Raises
    ------
    ValueError
        Not a saved run, a damaged or forged file, shapes that do not fit.
    """
    where = f"{option} {str(path)!r}"
    found = {}

    def check(headers, extras):
        model = _saved_model(extras, where)
        for name in ("t", "Q", "rho", "T"):
            if name not in headers:
                raise ValueError(f"{where} lacks the array {name}")
        headers = {name: headers[name] for name in _RUN_ARRAYS if name in headers}
        for name, (dtype, _) in headers.items():
            _check_real(dtype, f"{where}[{name}]")
        t_shape = headers["t"][1]
        if len(t_shape) != 1:
            raise ValueError(f"{where}[t] must be 1-d, got shape {t_shape}")
        allowed = {"t": [t_shape], **shapes_for(model, t_shape[0])}
        for name, (_, shape) in headers.items():
            _check_shape(shape, allowed[name], f"{where}[{name}]")
        if headers["Q"][1][:-2] != headers["rho"][1][:-2]:
            raise ValueError(f"{where}: Q {headers['Q'][1]} and rho {headers['rho'][1]} must "
                             f"have the same replicas and times")
        found["model"] = model

    # a run also saves its status arrays (risk, divergence times): read, not returned
    arrays, _ = read_npz(path, where, extras=("meta.json",),
                         max_bytes=MAX_ARRAY_BYTES, max_extra_bytes=MAX_META_BYTES, check=check)
    # NaN entries are kept: they mark diverged replicas, which compare reports
    return found["model"], {name: _as_float(arr, f"{where}[{name}]", finite=False)
                            for name, arr in arrays.items() if name in _RUN_ARRAYS}
