"""``symquad regenerate [--check]`` and the on-demand kernel cache.

:func:`regenerate` is the single entry point that writes the committed
generated files *and* checks them for drift (``check=True``), in the style of
SymForce: the same :func:`~symquad.codegen.render.render_all` feeds both.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..kernel_files import (GENERATED_DIR, atomic_write, cached_path, load_module_text,
                            read_cache_file, write_cache_file)
from ..spec import Model
from .render import render_all, render_entries_module

__all__ = ["GENERATED_DIR", "regenerate", "ensure_cached_entries"]


def regenerate(check: bool = False, directory: Path = GENERATED_DIR) -> list[str]:
    """Rewrite (or, with ``check``, compare) every committed generated file.

    Returns
    -------
    list of str
        Unified diffs, one per file that differs (missing, edited or stale).
        Empty when everything is up to date.  Without ``check`` the differing
        files are rewritten and stale ones removed.
    """
    directory = Path(directory)
    wanted = render_all()
    diffs = []
    for name, text in wanted.items():
        path = directory / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            diffs.append("".join(difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"{path} (on disk)", tofile=f"{path} (regenerated)")))
            if not check:
                atomic_write(path, text)
    present = {p.name for p in directory.glob("*") if p.is_file() and p.suffix in (".py", ".tex")}
    for stale in sorted(present - set(wanted)):
        diffs.append(f"--- {directory / stale}: not produced by the generator (stale)\n")
        if not check:
            (directory / stale).unlink()
    return diffs


def ensure_cached_entries(model: Model) -> Path:
    """Path of ``model``'s entry-kernel module in the cache, generating it if needed.

    The file is keyed by :attr:`Model.structure_key` and the generator version
    (:func:`symquad.kernel_files.cached_path`), written atomically, and
    regenerated when missing, unusable (checksum mismatch, failed import,
    missing ``rhs``/``risk``) or not trusted (:func:`symquad.kernel_files.read_cache_file`;
    an untrusted file is never executed).
    """
    path = cached_path("entries", model.structure_key)
    try:
        load_module_text(read_cache_file(path), f"symquad_cached_{path.stem}", str(path))
        return path
    except Exception:  # noqa: BLE001 - any unusable cache file is regenerated
        pass
    write_cache_file(path, render_entries_module(model))
    return path
