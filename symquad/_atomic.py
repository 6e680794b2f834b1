"""Atomic file writes: the one mechanism every part of symquad uses to write results.

A file is written to a temporary name in its destination folder, flushed and
fsync'ed, given the usual permissions, then renamed over the destination with
:func:`os.replace` (atomic on POSIX and Windows within one file system).  A
reader therefore sees the old file or the new one, never a half-written one;
an interrupt or an error removes the temporary file.

Every temporary file or folder symquad makes is named
``<prefix><host>-<pid>-<random><suffix>`` (:func:`temp_prefix`): the host and
the process that own it are in its name.  A process killed before it could
clean up (SIGKILL, power loss) leaves such a name behind, and a later run
removes it with :func:`remove_stale` -- only when the owner ran on this host and
that process is gone, so a temporary of a live process (or of another machine
sharing the folder) is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from contextlib import contextmanager, suppress

__all__ = ["atomic_file", "TMP_PREFIX", "temp_prefix", "temp_owner", "pid_alive",
           "remove_stale", "make_temp_dir"]

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
    prefix = temp_prefix(TMP_PREFIX)
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


# ---------------------------------------------------------------------------
# temporaries named by their owner, and the removal of dead owners' leftovers
# ---------------------------------------------------------------------------
def _host() -> str:
    # '/' cannot be in a file name; the host is compared, never parsed further
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def temp_prefix(prefix: str) -> str:
    """``<prefix><host>-<pid>-``: the start of a temporary name owned by this process."""
    return f"{prefix}{_host()}-{os.getpid()}-"


def temp_owner(name: str, prefix: str):
    """``(host, pid)`` of a temporary named by :func:`temp_prefix`, or None if it is not one."""
    if not name.startswith(prefix):
        return None
    host, sep, rest = name[len(prefix):].rpartition("-")     # rest: <random><suffix>
    host, sep2, pid = host.rpartition("-")
    if not (sep and sep2 and host and rest and pid.isdigit()):
        return None
    return host, int(pid)


def pid_alive(pid: int) -> bool:
    """True if a process `pid` exists on this host (it may belong to another user)."""
    if pid <= 0:
        return True             # 0 / negative address process groups: never "dead"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale(folder, prefix: str) -> list:
    """Remove the temporaries named ``<prefix><host>-<pid>-…`` in `folder` whose owner is dead.

    Only entries of this host whose process no longer exists are removed
    (files, or folders with everything in them); anything else -- a live
    owner, another host, a name of another form -- is left alone.  Returns the
    removed paths.
    """
    removed = []
    host = _host()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        owner = temp_owner(entry.name, prefix)
        if owner is None or owner[0] != host or pid_alive(owner[1]):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass
        except OSError:
            continue            # not ours to remove after all (permissions): leave it
        removed.append(entry.path)
    return removed


def make_temp_dir(folder, prefix: str) -> str:
    """A new private folder ``<prefix><host>-<pid>-<random>`` in `folder` (see :func:`remove_stale`)."""
    return tempfile.mkdtemp(prefix=temp_prefix(prefix), dir=folder)
