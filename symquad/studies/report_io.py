"""Report folders: destination checks, provenance, atomic replacement, JSON + NPZ encoding.

A report folder is written whole or not at all, and only a folder symquad
provably wrote is ever replaced:

1. **Provenance.**  :func:`write_folder_atomically` ends every folder it
   writes with a manifest, ``symquad-manifest.json``: a format marker and, for
   every file it wrote, the size and SHA-256.  :func:`report_folder_problem`
   accepts a folder as symquad's only when the manifest is there and the
   folder holds *exactly* the files it lists, each a regular file (no link)
   with its recorded size and digest.  A folder that merely looks like a
   report (a ``report.json`` with the right keys), one with anything added
   (raw data beside a report), or one with an edited file is not, so it is
   never replaced.
2. :func:`check_destination` refuses, *before* any computation, a destination
   that is empty, a file, an existing non-empty folder that is not provably a
   symquad report, or one whose nearest existing parent folder is not
   writable;
3. :func:`write_folder_atomically` writes every file into a temporary folder
   beside the destination and renames it into place.  An existing report
   folder is swapped with the new one in one ``renameat2(RENAME_EXCHANGE)``
   call where the system has it (Linux); elsewhere it is first renamed aside
   (``.NAME.old-*``), the new folder renamed into place, and the old one
   deleted.  The old folder is checked again after the swap: if something
   was added to it while the report was computed, it is kept (renamed
   ``NAME.replaced-*``, with a warning), not deleted.  An interrupt at any
   point leaves the old folder or the new one, never a mixture, never a
   half-written file.
4. **Temporaries.**  The temporary folders are named after their owner
   (``.NAME.tmp-<host>-<pid>-<random>``, see :mod:`symquad._atomic`); they are
   removed on any exception -- SIGTERM included where :mod:`symquad._signals`
   turns it into one -- and the next save beside them removes those of a
   process that was killed outright.

Arrays travel in ``.npz`` files (read back with ``allow_pickle=False``) and
everything else in JSON; :func:`split_arrays` / :func:`join_arrays` turn a
nested dict holding arrays into a JSON tree with ``{"__npz__": key}``
placeholders and back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import time
import warnings

import numpy as np

from .._atomic import make_temp_dir, remove_stale
from .._safe_io import open_regular, read_regular

__all__ = ["REPORT_FORMAT", "MANIFEST_NAME", "check_destination", "write_folder_atomically",
           "split_arrays", "join_arrays", "is_report_folder", "report_folder_problem",
           "encode_nonfinite", "decode_nonfinite"]

#: Marker written into ``report.json`` (the kind of report).
REPORT_FORMAT = "symquad.ValidationReport"
#: The provenance manifest that ends every folder :func:`write_folder_atomically` writes.
MANIFEST_NAME = "symquad-manifest.json"
_MANIFEST_FORMAT = "symquad.report-folder"
_MANIFEST_VERSION = 1
_PROBE_PREFIX = ".symquad-probe-"


def _as_path(folder, name="folder") -> str:
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or os.PathLike), got {folder!r}")
    path = os.fspath(folder)
    if not path.strip():
        raise ValueError(f"{name} must be a non-empty folder path, got {path!r}")
    return os.path.abspath(path)


# ---------------------------------------------------------------------------
# provenance: the manifest
# ---------------------------------------------------------------------------
def _sha256(path) -> tuple:
    """``(size, hex digest)`` of a regular file, read in blocks (never a FIFO or device)."""
    digest = hashlib.sha256()
    size = 0
    with open_regular(path, "report file", max_bytes=2**62) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _folder_files(root) -> tuple:
    """``(files, odd)``: relative paths of the regular files under `root`, and of anything else.

    Folders are walked; links, FIFOs, devices and sockets are "odd" (never
    followed, never opened).
    """
    files, odd = [], []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel)) as it:
            for entry in it:
                name = f"{rel}/{entry.name}" if rel else entry.name
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    stack.append(name)
                elif stat.S_ISREG(mode):
                    files.append(name)
                else:
                    odd.append(name)
    return sorted(files), sorted(odd)


def _write_manifest(root) -> None:
    """List every file under `root` (size, SHA-256) in ``root/MANIFEST_NAME``."""
    files, odd = _folder_files(root)
    if odd:
        raise ValueError(f"a report folder may hold only regular files, got {odd}")
    entries = {}
    for rel in files:
        size, digest = _sha256(os.path.join(root, rel))
        entries[rel] = {"bytes": size, "sha256": digest}
    text = json.dumps({"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION,
                       "files": entries}, indent=1, sort_keys=True)
    with open(os.path.join(root, MANIFEST_NAME), "x", encoding="utf-8") as fh:
        fh.write(text + "\n")


def report_folder_problem(path):
    """None if `path` is provably a folder symquad wrote, else the reason it is not.

    Provably: it holds :data:`MANIFEST_NAME` and exactly the files listed
    there, all regular files with their recorded sizes and SHA-256 digests.
    """
    if os.path.islink(path) or not os.path.isdir(path):
        return "not a folder"
    try:
        head = json.loads(read_regular(os.path.join(path, MANIFEST_NAME), "manifest",
                                       max_bytes=16 * 2**20).decode("utf-8"))
    except FileNotFoundError:
        return f"no {MANIFEST_NAME}: symquad did not write it"
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST_NAME} is unreadable ({exc})"
    listed = head.get("files") if isinstance(head, dict) else None
    if not (isinstance(head, dict) and head.get("format") == _MANIFEST_FORMAT
            and isinstance(listed, dict)
            and all(isinstance(v, dict) for v in listed.values())):
        return f"its {MANIFEST_NAME} is not a symquad manifest"
    try:
        files, odd = _folder_files(path)
    except OSError as exc:
        return f"cannot list it ({exc.strerror or exc})"
    if odd:
        return f"it holds links or special files symquad never writes: {odd[:5]}"
    extra = sorted(set(files) - set(listed) - {MANIFEST_NAME})
    if extra:
        return f"it holds files symquad did not write: {extra[:5]}"
    missing = sorted(set(listed) - set(files))
    if missing:
        return f"files symquad wrote are missing: {missing[:5]}"
    for rel, entry in sorted(listed.items()):
        try:
            size, digest = _sha256(os.path.join(path, rel))
        except (OSError, ValueError) as exc:
            return f"cannot read {rel!r} ({exc})"
        if size != entry.get("bytes") or digest != entry.get("sha256"):
            return f"{rel!r} changed since symquad wrote it"
    return None


def is_report_folder(path) -> bool:
    """True if `path` is provably a folder symquad wrote (see :func:`report_folder_problem`)."""
    return report_folder_problem(path) is None


# ---------------------------------------------------------------------------
# destination and atomic replacement
# ---------------------------------------------------------------------------
def _nearest_existing(path: str) -> str:
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return parent


def check_destination(folder, name="out") -> str:
    """Check that a report can be written to `folder`; return its absolute path.

    Raises
    ------
    TypeError
        `folder` is not a path.
    ValueError
        It is empty, a symbolic link, an existing file, an existing non-empty
        folder that is not provably a symquad report folder (the message says
        why, see :func:`report_folder_problem`), or its nearest existing
        parent is not a folder one can create entries in (tried, not guessed
        from permission bits: a temporary folder is created there and removed).
    """
    path = _as_path(folder, name)
    if os.path.islink(path):
        raise ValueError(f"{name}={os.fspath(folder)!r} is a symbolic link; the report replaces "
                         f"its folder whole, so give the real folder path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{name}={os.fspath(folder)!r} exists and is not a folder; "
                         f"give a folder path for the report")
    try:
        occupied = os.path.isdir(path) and bool(os.listdir(path))
    except OSError as exc:
        raise ValueError(f"{name}={os.fspath(folder)!r}: cannot read the folder "
                         f"({exc.strerror or exc})") from None
    problem = report_folder_problem(path) if occupied else None
    if problem:
        raise ValueError(f"{name}={os.fspath(folder)!r} is a non-empty folder that is not a "
                         f"symquad report ({problem}); the report replaces its folder whole, "
                         f"so choose a new or empty folder")
    parent = _nearest_existing(path)
    if not os.path.isdir(parent):
        raise ValueError(f"{name}={os.fspath(folder)!r}: {parent!r} is not a folder")
    remove_stale(parent, _PROBE_PREFIX)
    try:
        probe = make_temp_dir(parent, _PROBE_PREFIX)
    except OSError as exc:
        raise ValueError(f"{name}={os.fspath(folder)!r}: cannot create files in {parent!r} "
                         f"({exc.strerror or exc})") from None
    os.rmdir(probe)
    return path


def _renameat2_exchange():
    """``renameat2(…, RENAME_EXCHANGE)`` as a callable, or None where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    fn.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2

    def exchange(a: str, b: str) -> bool:
        if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False          # file system without the flag: caller falls back
        raise OSError(err, os.strerror(err), b)
    return exchange


def _dispose_of_old(old: str, dest: str) -> None:
    """Delete the replaced folder `old` -- only if it is still provably a symquad report.

    What was added to the destination while the new report was computed
    (after :func:`check_destination`) is not ours to delete: the folder is
    kept beside the destination as ``NAME.replaced-<time>-<pid>``, with a
    warning.
    """
    problem = report_folder_problem(old)
    if problem is None:
        shutil.rmtree(old, ignore_errors=True)
        return
    keep = f"{dest}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    os.rename(old, keep)
    warnings.warn(f"{dest!r} changed while the report was computed ({problem}); its "
                  f"previous content was kept at {keep!r}, not deleted", RuntimeWarning,
                  stacklevel=4)


def _replace_folder(new: str, dest: str) -> None:
    """Move the complete folder `new` to `dest`, replacing an existing `dest` whole."""
    if not os.path.lexists(dest):
        os.rename(new, dest)
        return
    exchange = _renameat2_exchange()
    if exchange is not None and exchange(new, dest):
        _dispose_of_old(new, dest)        # `new` now holds the previous report
        return
    parent, base = os.path.split(dest)
    old = make_temp_dir(parent, f".{base}.old-")
    os.rmdir(old)
    os.rename(dest, old)
    os.rename(new, dest)
    _dispose_of_old(old, dest)


def write_folder_atomically(folder, write, name="out") -> str:
    """Run ``write(tmp)`` on a fresh temporary folder, then move it to `folder` atomically.

    `write` creates the files of the report inside the folder it is given
    (regular files, in subfolders if it likes); the manifest
    (:data:`MANIFEST_NAME`) is added after it.  Whatever it raises (including
    ``KeyboardInterrupt``, and SIGTERM where :mod:`symquad._signals` turns it
    into an exception), the temporary folder is removed and `folder` is left
    as it was.  Temporary folders that a process killed outright left beside
    `folder` are removed first.  Returns the absolute path.
    """
    dest = check_destination(folder, name)
    parent, base = os.path.split(dest)
    os.makedirs(parent, exist_ok=True)
    remove_stale(parent, f".{base}.tmp-")
    if os.path.isdir(dest):
        # the old report of a fallback swap killed after its new folder was in place
        remove_stale(parent, f".{base}.old-")
    tmp = make_temp_dir(parent, f".{base}.tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)   # mkdtemp makes it private; a report is not
        write(tmp)
        _write_manifest(tmp)
        for root, _, files in os.walk(tmp):
            for fname in files:
                # files made with mkstemp (atomic figure writes) are private too
                os.chmod(os.path.join(root, fname), 0o666 & ~umask)
        _replace_folder(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


# ---------------------------------------------------------------------------
# nested dicts with arrays <-> JSON tree + npz arrays
# ---------------------------------------------------------------------------
def _json_scalar(value):
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def encode_nonfinite(tree):
    """JSON-ready copy of a tree of numbers: every non-finite float becomes ``{"__float__": "inf"}``.

    JSON has no NaN or infinity (``json.dumps(..., allow_nan=False)`` refuses
    them, and other readers reject Python's ``Infinity``), yet a report's
    numbers can hold them (a deviation that overflowed, an undefined ratio).
    Dicts, lists, tuples, numpy arrays (as lists) and numpy scalars are
    walked; :func:`decode_nonfinite` (or :func:`join_arrays`) reads the
    placeholders back as floats, so nothing is lost in a round trip.
    """
    if isinstance(tree, dict):
        return {k: encode_nonfinite(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [encode_nonfinite(v) for v in tree]
    if isinstance(tree, np.ndarray):
        return encode_nonfinite(tree.tolist())
    return _json_scalar(tree)


def decode_nonfinite(tree):
    """Inverse of :func:`encode_nonfinite`: ``{"__float__": "inf"}`` back to ``inf``."""
    if isinstance(tree, dict):
        if set(tree) == {"__float__"}:
            text = tree["__float__"]
            if not (isinstance(text, str) and text.lower().lstrip("+-") in ("inf", "nan")):
                raise ValueError(f"a non-finite number must be 'inf', '-inf' or 'nan', got "
                                 f"{text!r}")
            return float(text)
        return {k: decode_nonfinite(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [decode_nonfinite(v) for v in tree]
    return tree


def split_arrays(tree, arrays: dict, prefix: str = ""):
    """JSON-ready copy of `tree` with every ndarray moved into `arrays` (key -> array).

    Dicts, lists and tuples are walked; arrays are replaced by
    ``{"__npz__": key}``; non-finite floats by ``{"__float__": "nan"}`` (JSON
    has no NaN).
    """
    if isinstance(tree, np.ndarray):
        key = prefix or "value"
        arrays[key] = tree
        return {"__npz__": key}
    if isinstance(tree, dict):
        return {str(k): split_arrays(v, arrays, f"{prefix}/{k}" if prefix else str(k))
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [split_arrays(v, arrays, f"{prefix}#{i}") for i, v in enumerate(tree)]
    return _json_scalar(tree)


def join_arrays(tree, arrays):
    """Inverse of :func:`split_arrays` (`arrays` any mapping key -> array)."""
    if isinstance(tree, dict):
        if set(tree) == {"__npz__"}:
            try:
                return np.asarray(arrays[tree["__npz__"]])
            except (KeyError, TypeError):      # a hostile or damaged file: not our bug
                raise ValueError(f"the array {tree['__npz__']!r} the JSON refers to is not "
                                 f"in the archive") from None
        if set(tree) == {"__float__"}:
            return decode_nonfinite(tree)
        return {k: join_arrays(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [join_arrays(v, arrays) for v in tree]
    return tree
