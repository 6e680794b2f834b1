"""Report folders: destination checks, atomic replacement, JSON + NPZ encoding.

A report folder is written whole or not at all:

1. :func:`check_destination` refuses, *before* any computation, a destination
   that is empty, a file, an existing folder that is not a symquad report
   (it would be replaced whole), or one whose nearest existing parent folder
   is not writable;
2. :func:`write_folder_atomically` writes every file into a temporary folder
   beside the destination and renames it into place.  An existing report
   folder is swapped with the new one in one ``renameat2(RENAME_EXCHANGE)``
   call where the system has it (Linux); elsewhere it is first renamed aside
   (``.NAME.old-*``), the new folder renamed into place, and the old one
   deleted.  An interrupt at any point leaves the old folder or the new one,
   never a mixture, never a half-written file (at worst, on the fallback
   path, a ``.NAME.old-*`` folder beside a missing destination).

Arrays travel in ``.npz`` files (read back with ``allow_pickle=False``) and
everything else in JSON; :func:`split_arrays` / :func:`join_arrays` turn a
nested dict holding arrays into a JSON tree with ``{"__npz__": key}``
placeholders and back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import math
import os
import shutil
import tempfile

import numpy as np

__all__ = ["REPORT_FORMAT", "check_destination", "write_folder_atomically", "split_arrays",
           "join_arrays", "is_report_folder"]

#: Marker written into ``report.json``; a folder holding it may be replaced whole.
REPORT_FORMAT = "symquad.ValidationReport"


def _as_path(folder, name="folder") -> str:
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or os.PathLike), got {folder!r}")
    path = os.fspath(folder)
    if not path.strip():
        raise ValueError(f"{name} must be a non-empty folder path, got {path!r}")
    return os.path.abspath(path)


def is_report_folder(path) -> bool:
    """True if `path` is a folder whose ``report.json`` was written by symquad."""
    try:
        with open(os.path.join(path, "report.json"), encoding="utf-8") as fh:
            head = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(head, dict):
        return False
    # reports written before the format marker existed carry config + numbers
    return head.get("format") == REPORT_FORMAT or {"config", "numbers"} <= set(head)


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
        folder that is not a symquad report folder, or its nearest existing parent is not a
        folder one can create entries in (tried, not guessed from permission
        bits: a temporary folder is created there and removed).
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
    if occupied and not is_report_folder(path):
        raise ValueError(f"{name}={os.fspath(folder)!r} is a non-empty folder that is not a "
                         f"symquad report (no report.json of ours); the report replaces its "
                         f"folder whole, so choose a new or empty folder")
    parent = _nearest_existing(path)
    if not os.path.isdir(parent):
        raise ValueError(f"{name}={os.fspath(folder)!r}: {parent!r} is not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".symquad-probe-", dir=parent)
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


def _replace_folder(new: str, dest: str) -> None:
    """Move the complete folder `new` to `dest`, replacing an existing `dest` whole."""
    if not os.path.lexists(dest):
        os.rename(new, dest)
        return
    exchange = _renameat2_exchange()
    if exchange is not None and exchange(new, dest):
        shutil.rmtree(new)        # `new` now holds the previous report
        return
    parent, base = os.path.split(dest)
    old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
    os.rmdir(old)
    os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def write_folder_atomically(folder, write, name="out") -> str:
    """Run ``write(tmp)`` on a fresh temporary folder, then move it to `folder` atomically.

    `write` creates the files of the report inside the folder it is given.
    Whatever it raises (including ``KeyboardInterrupt``), the temporary folder
    is removed and `folder` is left as it was.  Returns the absolute path.
    """
    dest = check_destination(folder, name)
    parent, base = os.path.split(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)   # mkdtemp makes it private; a report is not
        write(tmp)
        for entry in os.scandir(tmp):
            # files made with mkstemp (atomic figure writes) are private too
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, 0o666 & ~umask)
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
            return np.asarray(arrays[tree["__npz__"]])
        if set(tree) == {"__float__"}:
            return float(tree["__float__"])
        return {k: join_arrays(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [join_arrays(v, arrays) for v in tree]
    return tree
