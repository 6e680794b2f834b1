"""``symquad regenerate [--check]`` and the on-demand kernel cache.

:func:`regenerate` is the single entry point that writes the committed
generated files *and* checks them for drift (``check=True``), in the style of
SymForce: the same :func:`render_all` feeds both.
"""

from __future__ import annotations

import difflib
from fractions import Fraction
from pathlib import Path

from ..kernel_files import (BANNER, GENERATED_DIR, atomic_write, cached_path, load_module_text,
                            read_cache_file, write_cache_file)
from ..spec import Model
from ..symbolic.latex_outputs import render_tex_files
from .assembly import render_assembly_module
from .block_assembly import render_block_assembly_module
from .diffusion_render import render_diffusion_assembly, render_diffusion_matrix_module
from .matrix_block import render_uniform_matrix_module
from .render import (CANONICAL_ENTRY_MODELS, entries_module_name, render_entries_module,
                     render_matrix_module)
from .special_render import render_special_files
from .tensor_render import TENSOR_BUILTINS, render_tensor_module

__all__ = ["GENERATED_DIR", "regenerate", "render_all", "ensure_cached_entries"]


def render_all() -> dict:
    """``{relative path under symquad/_generated: text}`` of every committed generated file."""
    files = {"quadratic_matrix.py": render_matrix_module(),
             "quadratic_matrix_uniform.py": render_uniform_matrix_module(),
             "assembly.py": render_assembly_module(),
             "block_assembly.py": render_block_assembly_module(),
             "diffusion_assembly.py": render_diffusion_assembly(),
             "diffusion_matrix.py": render_diffusion_matrix_module()}
    for model in CANONICAL_ENTRY_MODELS:
        files[entries_module_name(model) + ".py"] = render_entries_module(model)
    files.update(render_tex_files())
    for (student, teacher), name in TENSOR_BUILTINS.items():
        files[name + ".py"] = render_tensor_module(tuple(Fraction(c) for c in student),
                                                   tuple(Fraction(c) for c in teacher))
    files.update(render_special_files())
    registry = [BANNER, '"""Registry of committed generated kernels."""\n', "",
                "#: (p, p_star) of committed entry-kernel modules for σ = σ* = z², no constraint,",
                "#: fixed readout (the readout values and the learning parameters are arguments)",
                "ENTRY_MODULES = {"]
    for model in CANONICAL_ENTRY_MODELS:
        registry.append(f"    ({model.p}, {model.p_star}): {entries_module_name(model)!r},")
    registry.append("}")
    registry += ["", "#: (student, teacher) activation coefficients (str of each c_j, lowest",
                 "#: order first) -> committed tensor-form module",
                 "TENSOR_MODULES = {"]
    for key, name in sorted(TENSOR_BUILTINS.items()):
        registry.append(f"    {key!r}: {name!r},")
    registry.append("}")
    files["__init__.py"] = "\n".join(registry) + "\n"
    return dict(sorted(files.items()))


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
