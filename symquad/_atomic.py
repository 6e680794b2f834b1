"""Atomic file writes: the one mechanism every part of symquad uses to write results.

A file is written to a temporary name in its destination folder, flushed and
fsync'ed, given the usual permissions, then renamed over the destination with
:func:`os.replace` (atomic on POSIX and Windows within one file system).  A
reader therefore sees the old file or the new one, never a half-written one;
an interrupt or an error removes the temporary file.  Temporary names are
``.tmp-<host>-<pid>-<random>.tmp``, so a sweep store can recognise and remove
the leftovers of a process that was killed before its rename.
"""

from __future__ import annotations

import os
import socket
import tempfile
from contextlib import contextmanager, suppress

__all__ = ["atomic_file", "TMP_PREFIX"]

#: Prefix of every temporary file (see the module docstring).
TMP_PREFIX = ".tmp-"


def _default_file_mode() -> int:
    """``0o666`` less the process umask: what :func:`open` would give (mkstemp gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# read once at import: os.umask can only be read by setting it, which is process-wide
_FILE_MODE = _default_file_mode()


@contextmanager
def atomic_file(path, mode: str = "wb", *, encoding: str | None = None,
                newline: str | None = None, permissions: int | None = None):
    """Open a temporary file that replaces `path` when the ``with`` block ends cleanly.

    Parameters
    ----------
    path : str or path-like
        Destination; its folder must exist.
    mode : {"wb", "w"}
        Binary or text.
    encoding, newline
        Passed to :func:`open` in text mode.
    permissions : int, optional
        Mode bits of the new file (default: what :func:`open` would give,
        ``0o666`` less the umask).

    Yields
    ------
    file object
        Write to it inside the block; nothing is visible at `path` before the
        block ends, and nothing is left behind if it raises.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    prefix = f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE if permissions is None else permissions)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
