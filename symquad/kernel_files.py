"""Reading and writing generated kernel files (standard library only).

Shared by the code generator (which writes) and the numeric runtime (which
loads), so the numeric side never needs SymPy.  Every generated module ends in
a ``# sha256: <digest>`` line over the text above it; a file whose digest does
not match (truncated write, hand edit, disk corruption) is rejected.
"""

from __future__ import annotations

import hashlib
import os
import types
from functools import lru_cache
from pathlib import Path

from ._atomic import TMP_PREFIX, atomic_file, remove_stale
from ._safe_io import read_regular

__all__ = ["checksum_line", "verify_checksum", "atomic_write", "load_module_file",
           "load_module_text", "cache_dir", "cached_path", "generator_version",
           "GENERATED_DIR", "GENERATOR_SOURCES", "KernelFileError"]

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


#: Largest generated file read (a cache file beyond it is treated as corrupted).
MAX_FILE_BYTES = 256 * 2**20


class KernelFileError(ValueError):
    """A generated module that must not be used (checksum mismatch, broken, incomplete)."""


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
    remove_stale(path.parent, TMP_PREFIX)     # what a killed writer left (dead owner only)
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
    """Import a generated module from a file after verifying its checksum.

    Raises
    ------
    OSError
        If the file cannot be read (missing, no permission).
    KernelFileError (a ValueError)
        A folder, FIFO, socket or device in place of the file (refused without
        blocking), a file over ``MAX_FILE_BYTES``, or see :func:`load_module_text`.
    """
    path = Path(path)
    try:
        # never blocks: a FIFO or device in place of the file is refused before reading
        data = read_regular(path, "generated file", MAX_FILE_BYTES)
    except ValueError as exc:
        raise KernelFileError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KernelFileError(f"generated file {path} is not UTF-8 text ({exc})") from None
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
