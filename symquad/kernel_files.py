"""Reading and writing generated kernel files (standard library only).

Shared by the code generator (which writes) and the numeric runtime (which
loads), so the numeric side never needs SymPy.  Every generated module ends in
a ``# sha256: <digest>`` line over the text above it; a file whose digest does
not match (truncated write, hand edit, disk corruption) is rejected.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

__all__ = ["checksum_line", "verify_checksum", "atomic_write", "load_module_file",
           "cache_dir"]


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_module_file(path: Path, name: str):
    """Import a generated module from a file after verifying its checksum.

    Raises
    ------
    ValueError
        If the file's checksum does not match its content.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if not verify_checksum(text):
        raise ValueError(f"generated file {path} is corrupted (checksum mismatch)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cache_dir() -> Path:
    """Where on-demand kernels go: ``$SYMQUAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/symquad``."""
    env = os.environ.get("SYMQUAD_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "symquad" / "kernels"
