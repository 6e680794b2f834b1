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
removes it with :func:`remove_stale` -- only when the owner ran on this host,
that process is gone, and the entry is what symquad makes (the full name form,
a regular file or folder, owned by this user: :func:`is_own_stale_temporary`),
so a temporary of a live process, of another machine sharing the folder, of
another user, or a look-alike name is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import socket
import tempfile
from contextlib import contextmanager, suppress

__all__ = ["atomic_file", "TMP_PREFIX", "temp_prefix", "temp_owner", "pid_alive",
           "remove_stale", "make_temp_dir", "is_own_stale_temporary"]

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


#: The random tail :mod:`tempfile` gives a name (8 characters of its alphabet), then the
#: suffix symquad uses for files (folders have none).
_TEMP_TAIL = re.compile(r"[a-z0-9_]{8}(\.tmp)?")


def is_own_stale_temporary(entry: os.DirEntry, prefix: str) -> bool:
    """True only if `entry` is provably a temporary that a dead symquad process made here.

    A name is not enough (anyone can create ``.tmp-host-123-…``): the entry
    must

    * have the whole form of a name :func:`atomic_file` / :func:`make_temp_dir`
      make: ``<prefix><host>-<pid>-`` and :mod:`tempfile`'s 8-character tail;
    * name this host and a process that no longer exists;
    * be a regular file or a real folder (never a link, FIFO, socket or
      device: symquad makes none of those) owned by this user (another user's
      entry is not ours, even where permissions would let us delete it).
    """
    owner = temp_owner(entry.name, prefix)
    if owner is None or owner[0] != _host() or pid_alive(owner[1]):
        return False
    if not _TEMP_TAIL.fullmatch(entry.name[len(temp_prefix_of(owner, prefix)):]):
        return False
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return False
    return not hasattr(os, "getuid") or st.st_uid == os.getuid()


def temp_prefix_of(owner, prefix: str) -> str:
    """The name prefix :func:`temp_prefix` gives the process ``owner = (host, pid)``."""
    return f"{prefix}{owner[0]}-{owner[1]}-"


def remove_stale(folder, prefix: str) -> list:
    """Remove the temporaries named ``<prefix><host>-<pid>-…`` in `folder` whose owner is dead.

    Only what :func:`is_own_stale_temporary` proves to be a dead symquad
    process's temporary on this host is removed (files, or folders with
    everything in them); anything else -- a live owner, another host, another
    user's entry, a link or special file, a name of another form -- is left
    alone.  Returns the removed paths.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not is_own_stale_temporary(entry, prefix):
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
