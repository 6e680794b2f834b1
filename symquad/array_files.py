"""Reading arrays that users hand to the command line (.npy, .npz, saved runs), checked first.

Every array a command reads from a file the user names (``--T``, ``--Q0``,
``--rho0``, a ``SimulationRun.save`` file given to ``--data``) goes through
:func:`read_array` or :func:`read_saved_run`, which

* open only regular files (a FIFO or a device is refused, never read);
* never unpickle: an array of Python objects is refused from its header;
* read each array's ``.npy`` header first (bounded size) and check the
  declared dtype (real numbers only, complex refused as everywhere in
  symquad) and shape against what the model allows, *before* reading any
  data, so a wrong or huge array costs nothing;
* check that the bytes stored match the header (a ``.npy`` file's size; an
  ``.npz`` member's uncompressed size in the zip directory), so a lying
  header is refused, and read at most those bytes (a zip member that
  inflates beyond its declared size is cut off and fails its CRC check);
* refuse anything else in the file.

Errors are ``ValueError``/``TypeError`` naming the option and what was
expected, raised before any computation.
"""

from __future__ import annotations

import json
import math
import os
import stat
import zipfile

import numpy as np

__all__ = ["read_array", "read_saved_run", "MAX_META_BYTES", "MAX_ARRAY_BYTES"]

#: Largest ``meta.json`` of a saved run that is read.
MAX_META_BYTES = 1 << 20
#: Largest total of array data read from one file (declared sizes, checked first).
MAX_ARRAY_BYTES = 4 << 30
_MAX_HEADER = 10_000       # numpy's own default bound for .npy headers


def _open_regular(path, what):
    """Binary file object of a regular file (FIFOs and devices refused without opening)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {str(path)!r} is not a regular file")
    return open(path, "rb")


def _header(fh, what):
    """``(shape, dtype, fortran_order)`` from a ``.npy`` header (the data is not read)."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                fh, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                fh, max_header_size=_MAX_HEADER)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as exc:
        raise ValueError(f"{what} is not a readable .npy array ({exc})") from None
    if dtype.hasobject:
        raise ValueError(f"{what} holds Python objects (pickled data); only numeric arrays "
                         f"are read")
    if dtype.kind == "c":
        raise TypeError(f"{what} must hold real numbers, got complex entries (complex arrays "
                        f"are refused, not truncated to their real part)")
    if dtype.kind not in "iuf":
        raise TypeError(f"{what} must hold real numbers, got dtype {dtype}")
    return tuple(int(n) for n in shape), dtype, fortran


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


def _read_data(fh, shape, dtype, fortran, what, finite=True):
    count = math.prod(shape)
    data = fh.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"{what} is truncated (fewer bytes than its header declares)")
    arr = np.frombuffer(data, dtype=dtype, count=count)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    out = arr.astype(float)
    if finite and not np.all(np.isfinite(out)):
        raise ValueError(f"{what} must be finite (it contains NaN or inf)")
    return out


def _member(zf, info, allowed, what, finite=True):
    """Array of one ``.npz`` member, checked from its header and the zip directory."""
    with zf.open(info) as fh:
        shape, dtype, fortran = _header(fh, what)
        _check_shape(shape, allowed, what, dtype)
        expected = fh.tell() + math.prod(shape) * dtype.itemsize
        if info.file_size != expected:
            raise ValueError(f"{what}: the archive declares {info.file_size} bytes but the "
                             f"array header {expected} (a damaged or forged file)")
        return _read_data(fh, shape, dtype, fortran, what, finite)


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
    key = option.lstrip("-").replace("-", "_")
    with _open_regular(path, option) as fh:
        magic = fh.read(6)
        fh.seek(0)
        if magic == b"\x93NUMPY":
            what = f"{option} {str(path)!r}"
            shape, dtype, fortran = _header(fh, what)
            _check_shape(shape, allowed, what, dtype)
            size = os.fstat(fh.fileno()).st_size
            if size != fh.tell() + math.prod(shape) * dtype.itemsize:
                raise ValueError(f"{what}: the file has {size} bytes, not what its header "
                                 f"declares (a damaged or forged file)")
            return _read_data(fh, shape, dtype, fortran, what)
        if not zipfile.is_zipfile(fh):
            raise ValueError(f"{option} {str(path)!r} is neither a .npy nor an .npz file")
        fh.seek(0)
        with zipfile.ZipFile(fh) as zf:
            members = [i for i in zf.infolist() if not i.is_dir()]
            names = [i.filename for i in members]
            if len(members) == 1:
                info = members[0]
            elif f"{key}.npy" in names:
                info = members[names.index(f"{key}.npy")]
            else:
                raise ValueError(f"{option} {str(path)!r} holds {len(members)} arrays "
                                 f"({', '.join(n.removesuffix('.npy') for n in names)}); give "
                                 f"a file with one array or an array named {key!r}")
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{option} {str(path)!r}: member {info.filename!r} is not "
                                 f"an .npy array")
            return _member(zf, info, allowed, f"{option} {str(path)!r}[{info.filename[:-4]}]")


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
    from .numeric.persist import FORMAT_VERSION, model_from_dict

    where = f"{option} {str(path)!r}"
    with _open_regular(path, option) as fh, zipfile.ZipFile(fh) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        meta_info = infos.get("meta.json")
        if meta_info is None:
            raise ValueError(f"{where} is not a saved symquad run (no meta.json)")
        if meta_info.file_size > MAX_META_BYTES:
            raise ValueError(f"{where}: meta.json declares {meta_info.file_size} bytes, more "
                             f"than {MAX_META_BYTES}")
        with zf.open(meta_info) as m:
            text = m.read(MAX_META_BYTES + 1)
        try:
            meta = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: meta.json is not valid JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("kind") != "SimulationRun":
            kind = meta.get("kind") if isinstance(meta, dict) else None
            raise ValueError(f"{where} holds a {kind!r}, not a 'SimulationRun'")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{where} has format version {meta.get('format_version')!r}; "
                             f"this symquad reads version {FORMAT_VERSION}")
        model = model_from_dict(meta.get("model"))
        # every header first (no data read): shapes against the model, sizes, consistency
        headers = {}
        # a trained readout's trajectory is saved too (SimulationRun.readout)
        names = ("t", "Q", "rho", "T") + (("readout",) if "readout.npy" in infos else ())
        for name in names:
            info = infos.get(f"{name}.npy")
            if info is None:
                raise ValueError(f"{where} lacks the array {name}")
            with zf.open(info) as member:
                shape, dtype, _ = _header(member, f"{where}[{name}]")
                offset = member.tell()
            declared = offset + math.prod(shape) * dtype.itemsize
            if info.file_size != declared:
                raise ValueError(f"{where}[{name}]: the archive declares {info.file_size} bytes "
                                 f"but the array header {declared} (a damaged or forged file)")
            headers[name] = (info, shape, dtype)
        t_shape = headers["t"][1]
        if len(t_shape) != 1:
            raise ValueError(f"{where}[t] must be 1-d, got shape {t_shape}")
        allowed = {"t": [t_shape], **shapes_for(model, t_shape[0])}
        for name, (_, shape, _) in headers.items():
            _check_shape(shape, allowed[name], f"{where}[{name}]")
        if headers["Q"][1][:-2] != headers["rho"][1][:-2]:
            raise ValueError(f"{where}: Q {headers['Q'][1]} and rho {headers['rho'][1]} must "
                             f"have the same replicas and times")
        total = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in headers.values())
        if total > MAX_ARRAY_BYTES:
            raise ValueError(f"{where} declares {total / 2**30:.1f} GiB of arrays, more than "
                             f"{MAX_ARRAY_BYTES / 2**30:.0f} GiB (symquad.array_files."
                             f"MAX_ARRAY_BYTES)")
        arrays = {}
        for name, (info, _, _) in headers.items():
            # NaN entries are kept: they mark diverged replicas, which compare reports
            arrays[name] = _member(zf, info, allowed[name], f"{where}[{name}]", finite=False)
    return model, arrays
