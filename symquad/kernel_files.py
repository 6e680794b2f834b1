"""Reading and writing generated kernel files (standard library only).

Shared by the code generator (which writes) and the numeric runtime (which
loads), so the numeric side never needs SymPy.  Every generated module ends in
a ``# sha256: <digest>`` line over the text above it; a file whose digest does
not match (truncated write, hand edit, disk corruption) is rejected.

Trust of the kernel cache
-------------------------
A checksum catches accidents, not a deliberate edit: whoever can write a cache
file can write a matching checksum.  Cached modules are executed, so they are
read only through :func:`read_cache_file`, which treats them the way ssh
treats its keys: the cache folder and the file must be owned by the user (or
root) and not writable by group or others, neither may be a symbolic link
(opened with ``O_NOFOLLOW``), the file must be a regular file (a FIFO or a
device is refused without blocking: opened with ``O_NONBLOCK``), and every
check is made with ``fstat`` on the descriptor that is then read (the file is
opened relative to the already-checked folder descriptor), so nothing can be
swapped in between the check and the read.  Folders above the cache folder
are not checked: whoever can replace the cache folder there can only put a
folder of their own (refused: not owned by the user) or a link (refused).
:func:`write_cache_file` creates the folder with mode ``0o700`` and files
without group/other write permission, so what symquad writes is trusted.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import types
from functools import lru_cache
from pathlib import Path

from ._atomic import _FILE_MODE, atomic_file

__all__ = ["checksum_line", "verify_checksum", "atomic_write", "load_module_file",
           "load_module_text", "cache_dir", "cached_path", "generator_version",
           "GENERATED_DIR", "GENERATOR_SOURCES", "KernelFileError", "UntrustedCacheError",
           "read_cache_file", "write_cache_file", "check_cache_folder", "MAX_CACHE_FILE_BYTES"]

#: Where the committed generated modules live.
GENERATED_DIR = Path(__file__).resolve().parent / "_generated"

#: Sources whose content determines what the generator writes (relative to the
#: package).  Their hash is the generator version of cached kernels, so an
#: upgraded generator never reuses kernels written by an older one.
GENERATOR_SOURCES = (
    "spec.py", "kernel_files.py",
    "symbolic/network.py", "symbolic/symbols.py", "symbolic/wick.py",
    "symbolic/entries.py", "symbolic/tensor.py",
    "codegen/printer.py", "codegen/render.py", "codegen/tensor_render.py",
)


class KernelFileError(ValueError):
    """A generated module that must not be used (checksum mismatch, broken, incomplete)."""


class UntrustedCacheError(KernelFileError):
    """A cache file or folder that others could have written (never executed)."""


#: Largest cache file read (bytes); a larger one is refused before it is read.
MAX_CACHE_FILE_BYTES = 256 * 2**20

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_POSIX = hasattr(os, "geteuid") and os.open in os.supports_dir_fd


def _trusted_owners() -> tuple:
    """User ids whose files may be executed from the cache: this user and root."""
    return (os.geteuid(), 0)


def _check_trusted_stat(st, what: str, path) -> None:
    """UntrustedCacheError unless ``st`` (an fstat) is ours and not group/other-writable."""
    if not _POSIX:          # no owners or mode bits to check (Windows)
        return
    if st.st_uid not in _trusted_owners():
        raise UntrustedCacheError(
            f"kernel cache {what} {path} is owned by user id {st.st_uid}, not by you "
            f"(user id {os.geteuid()}); cached kernels are executed, so only your own files "
            f"are used")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(
            f"kernel cache {what} {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); cached kernels are executed, so it is not used "
            f"(run `chmod go-w {path}` to trust it)")


def _open_folder(folder: Path) -> int:
    """Descriptor of the cache folder, after checking it (see the module docstring)."""
    try:
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(folder):
            raise UntrustedCacheError(
                f"kernel cache folder {folder} is a symbolic link; symquad does not follow "
                f"links in its cache (point SYMQUAD_CACHE_DIR at the real folder)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
        _check_trusted_stat(st, "folder", folder)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_cache_folder(folder) -> None:
    """Raise :class:`UntrustedCacheError` (or OSError) unless ``folder`` may hold cached kernels."""
    if _POSIX:
        os.close(_open_folder(Path(folder)))


def read_cache_file(path) -> str:
    """Text of a cache file, read only if the file and its folder are trusted.

    Raises
    ------
    FileNotFoundError
        If there is no such file (or folder).
    UntrustedCacheError (a KernelFileError)
        If the file or its folder is a symbolic link, is owned by someone else,
        is writable by group or others, or the file is not a regular file
        (FIFO, device, folder) or is larger than :data:`MAX_CACHE_FILE_BYTES`.
    KernelFileError
        If the file is not UTF-8 text.
    OSError
        If it cannot be read.
    """
    path = Path(path)
    if not _POSIX:                   # best effort: no descriptor-relative opens
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise UntrustedCacheError(f"kernel cache file {path} is not a regular file")
        return _decode(path.read_bytes(), path)
    folder_fd = _open_folder(path.parent)
    try:
        # refuse what is not a regular file before opening it (no device is opened)
        _check_regular(os.stat(path.name, dir_fd=folder_fd, follow_symlinks=False), path)
        fd = os.open(path.name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC,
                     dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedCacheError(f"kernel cache file {path} is a symbolic link; symquad "
                                      f"does not follow links in its cache") from None
        raise
    finally:
        os.close(folder_fd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())       # what is actually open (it may have been swapped)
        _check_regular(st, path)
        _check_trusted_stat(st, "file", path)
        data = fh.read(MAX_CACHE_FILE_BYTES + 1)
    if len(data) > MAX_CACHE_FILE_BYTES:
        raise UntrustedCacheError(f"kernel cache file {path} is larger than "
                                  f"{MAX_CACHE_FILE_BYTES} bytes")
    return _decode(data, path)


def _check_regular(st, path) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheError(f"kernel cache file {path} is a symbolic link; symquad does "
                                  f"not follow links in its cache")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a folder" if stat.S_ISDIR(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise UntrustedCacheError(f"kernel cache file {path} is {kind}, not a regular file")
    if st.st_size > MAX_CACHE_FILE_BYTES:
        raise UntrustedCacheError(f"kernel cache file {path} is larger than "
                                  f"{MAX_CACHE_FILE_BYTES} bytes ({st.st_size})")


def _decode(data: bytes, path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KernelFileError(f"generated file {path} is corrupted (not UTF-8 text)") from None


def write_cache_file(path, text: str) -> None:
    """Write a generated module into the cache so that :func:`read_cache_file` trusts it.

    The folder is created with mode ``0o700`` if missing and checked (an
    untrusted folder raises :class:`UntrustedCacheError` and nothing is
    written); the file is written atomically without group/other write
    permission, replacing whatever entry had its name (a link or a FIFO is
    replaced, never written through).
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_cache_folder(path.parent)
    with atomic_file(path, "w", encoding="utf-8", newline="\n",
                     permissions=_FILE_MODE & ~0o022) as handle:
        handle.write(text)


def checksum_line(body: str) -> str:
    """Last line of a generated module: SHA-256 of everything above it."""
    return f"# sha256: {hashlib.sha256(body.encode()).hexdigest()}\n"


def verify_checksum(text: str) -> bool:
    """True when a generated module's trailing checksum matches its body."""
    body, sep, last = text.rpartition("# sha256: ")
    return bool(sep) and text.endswith("\n") and \
        last.strip() == hashlib.sha256(body.encode()).hexdigest()


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


def load_module_text(text: str, name: str, origin: str = "<memory>",
                     required=("rhs", "risk")):
    """Execute a generated module's text (our own generator's output, never user input).

    Raises
    ------
    KernelFileError
        If the checksum does not match, the module fails while being executed
        (syntax error, recursion limit of a huge expression, ...), or it lacks
        one of the ``required`` functions.
    """
    if not verify_checksum(text):
        raise KernelFileError(f"generated file {origin} is corrupted or was edited "
                              "(checksum mismatch)")
    module = types.ModuleType(name)
    module.__file__ = origin
    try:
        exec(compile(text, origin, "exec"), module.__dict__)  # noqa: S102 - generated code
    except Exception as exc:  # RecursionError included: huge expressions
        raise KernelFileError(f"generated file {origin} fails at import: "
                              f"{type(exc).__name__}: {exc}") from exc
    missing = [f for f in required if not callable(getattr(module, f, None))]
    if missing:
        raise KernelFileError(f"generated file {origin} lacks {', '.join(missing)}")
    return module


def load_module_file(path: Path, name: str, required=("rhs", "risk")):
    """Import a committed generated module from a file after verifying its checksum.

    For modules of the kernel cache use :func:`read_cache_file` and
    :func:`load_module_text` instead (they check who could have written it).

    Raises
    ------
    OSError
        If the file cannot be read (missing, a folder, no permission).
    KernelFileError (a ValueError)
        See :func:`load_module_text`.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    return load_module_text(text, name, str(path), required)


@lru_cache(maxsize=1)
def generator_version() -> str:
    """12 hex digits of SHA-256 over :data:`GENERATOR_SOURCES` (stable across processes)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for rel in GENERATOR_SOURCES:
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def cached_path(kind: str, key: str) -> Path:
    """Cache file of a generated module: ``<cache>/<kind>_<key>_<generator version>.py``."""
    return cache_dir() / f"{kind}_{key}_{generator_version()}.py"


def cache_dir() -> Path:
    """Where on-demand kernels go: ``$SYMQUAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/symquad``."""
    env = os.environ.get("SYMQUAD_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "symquad" / "kernels"
