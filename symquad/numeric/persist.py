"""Saving and loading result objects: one ``.npz`` file with a JSON member.

A saved result is a zip archive in NumPy's ``.npz`` layout: every array is an
``.npy`` member (``np.load(path)[name]`` reads it; any zip tool lists it) and
the metadata -- the object's kind, the format version, the model and the
scalar fields -- is a UTF-8 JSON member ``meta.json``.  Both are open formats:
nothing is pickled, and loading never executes anything from the file.

Files are written atomically: to a temporary file in the target folder, flushed
to disk, then renamed over the target, so a crash or an interrupted run leaves
either the old file or the new one, never a truncated one.
"""

from __future__ import annotations

import io
import json
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from .._atomic import atomic_file
from ..spec import NAMED_ACTIVATIONS, Model, _to_fraction, check_model, model_fields
from ..spectrum import spectrum_text
from ..stages import declare
from .._safe_io import read_npz

__all__ = ["FORMAT_VERSION", "model_to_dict", "model_from_dict", "save_npz", "load_npz",
           "json_default"]

#: Version of the on-disk layout; bumped when a saved field changes meaning.
FORMAT_VERSION = 1
_META = "meta.json"


def model_to_dict(model: Model) -> dict:
    """JSON-ready description of a :class:`~symquad.Model`, one key per field.

    Built from the model's field metadata (:func:`symquad.spec.model_fields`):
    floats stay floats (JSON keeps the shortest round-tripping decimal),
    activations and readouts are lists of exact rationals as strings, lowest
    order first (``["0", "0", "1"]`` for ``σ(z) = z²``); a named activation is
    stored as its name (``"erf"``, meaning erf(z/√2), or ``"relu"``).
    """
    declare(model, "saved files")
    out = {}
    for f in model_fields():
        value = getattr(model, f.name)
        if f.metadata["kind"] == "activation" and isinstance(value, str):
            pass                                   # a name of NAMED_ACTIVATIONS
        elif f.metadata["kind"] in ("activation", "readout"):
            value = [str(Fraction(c)) for c in value]
        elif f.metadata["kind"] == "spectrum":
            value = spectrum_text(value)            # "f1:s1,f2:s2", exact rationals
        out[f.name] = value
    return out


def model_from_dict(data) -> Model:
    """Inverse of :func:`model_to_dict` (validated like any new :class:`~symquad.Model`).

    Files written before a field existed lack its key; it takes its default.
    Unknown keys are refused.  Rationals are parsed by :class:`fractions.Fraction`
    (never evaluated as code).
    """
    if not isinstance(data, dict):
        raise ValueError(f"a saved model must be a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in model_fields()}
    required = {"p", "p_star", "lr", "noise", "activation", "lr_scaling"}
    if not required <= set(data) or not set(data) <= set(known):
        raise ValueError(f"a saved model must have the keys {sorted(required)} and at most "
                         f"{sorted(known)}, got {sorted(data)}")
    values = {}
    for name, value in data.items():
        kind = known[name].metadata["kind"]
        if kind == "activation" and isinstance(value, str):
            if value not in NAMED_ACTIVATIONS:
                raise ValueError(f"a saved model's {name} must be a list of rational strings "
                                 f"or one of the names {NAMED_ACTIVATIONS}, got {value!r}")
        elif kind in ("activation", "readout"):
            if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
                raise ValueError(f"a saved model's {name} must be a list of rational strings")
            value = tuple(_to_fraction(c, name) for c in value)     # "1/0", 1e-99999999
        elif kind == "spectrum" and not isinstance(value, str):
            raise ValueError(f"a saved model's {name} must be the text 'f1:s1,f2:s2,...'")
        values[name] = value
    return Model(**values)


def json_default(value):
    """``default=`` for :func:`json.dumps`: numpy scalars and arrays as plain JSON values."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in JSON")


def save_npz(path, kind: str, meta: dict, arrays: dict) -> Path:
    """Write ``arrays`` and ``meta`` (plus ``kind`` and the format version) atomically.

    Parameters
    ----------
    path : str or Path
        Target file; its folder is created if needed.  Conventionally ``*.npz``.
    kind : str
        Name of the saved class, checked on loading.
    meta : dict
        JSON-serialisable metadata (non-finite floats are written as
        ``NaN``/``Infinity``, which Python's json module reads back).
    arrays : dict
        ``name -> ndarray`` (numeric or fixed-width string dtypes; no objects).

    Returns
    -------
    Path of the written file.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"path must be a file name, {str(path)!r} is a folder")
    header = {"kind": kind, "format_version": FORMAT_VERSION, **meta}
    text = json.dumps(header, indent=1, sort_keys=True, default=json_default)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as fh:
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(_META, text)
            for name in sorted(arrays):
                arr = np.asarray(arrays[name])
                if arr.dtype == object:
                    raise TypeError(f"array {name!r} has dtype object; cannot save it "
                                    "without pickling")
                buf = io.BytesIO()
                np.lib.format.write_array(buf, arr, allow_pickle=False)
                zf.writestr(f"{name}.npy", buf.getvalue())
    return path


def load_npz(path, kind: str, meta_keys=(), array_keys=()) -> tuple[dict, dict]:
    """Read a file written by :func:`save_npz`; return ``(meta, arrays)``.

    ``meta_keys`` and ``array_keys`` are the entries the caller reads: a file
    lacking one (damaged, or made by hand to look like a result) is refused
    here with a ValueError naming them, never a KeyError later.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a symquad result of ``kind`` or has an unknown
        format version.
    """

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no saved result at {str(path)!r}")
    # sizes and headers are checked before anything is read (no FIFO, no zip bomb)
    try:
        arrays, extras = read_npz(path, "the file", extras=(_META,))
    except ValueError as exc:
        raise ValueError(f"{str(path)!r} is not a saved symquad result: {exc}") from None
    if _META not in extras:
        raise ValueError(f"{str(path)!r} is not a saved symquad result (no {_META})")
    try:
        meta = json.loads(extras[_META].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{str(path)!r}: {_META} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{str(path)!r}: {_META} is not a JSON object")
    if meta.get("kind") != kind:
        raise ValueError(f"{str(path)!r} holds a {meta.get('kind')!r}, not a {kind!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{str(path)!r} has format version {meta.get('format_version')!r}; "
                         f"this symquad reads version {FORMAT_VERSION}")
    missing = [k for k in meta_keys if k not in meta] + [f"{k}.npy" for k in array_keys
                                                         if k not in arrays]
    if missing:
        raise ValueError(f"{str(path)!r} is not a complete saved {kind}: it lacks {missing}")
    return meta, arrays
