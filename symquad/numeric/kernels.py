"""Numeric kernels: the generated right-hand sides and risk, ready to call.

No SymPy here.  Three forms of generated code:

* ``"matrix"``: ``σ = c z² (+ c0)``, the committed width-independent
  matrix-form module, cost ``O((p + p*)³)``;
* ``"tensor"``: any polynomial ``σ``, width independent, cost
  ``O(p² (p + p*)²)``; committed for the built-in activations
  (``z³``, ``z³ − 3z``, ``z⁴``, ``z + z²``, ``z²``) and otherwise generated once
  per *activation* into the kernel cache (needs SymPy the first time only);
* ``"entries"``: entry-by-entry modules for one ``(p, p*)`` (the independent
  small-width reference), committed for ``σ = z²`` at ``p, p* ≤ 3``, cached
  per model structure otherwise.

Loaded modules are kept in memory per structure, so repeated calls (``integrate``
calls :func:`kernels` every time) do not re-read or re-execute files.  Every
module is checked against its trailing SHA-256 before it is used, committed
ones included: a hand edit raises an error that says to run ``symquad
regenerate``.  Cached modules carry the generator version in their file name
(:func:`symquad.kernel_files.generator_version`).  A cache folder that cannot be
written, or that others could have written (see
:mod:`symquad.kernel_files`), falls back to in-memory kernels with a warning; a
cached module that is corrupted, fails at import or lacks ``rhs``/``risk`` is
regenerated, and one that is not trusted (a link, a FIFO, someone else's, writable
by others) is never executed: it is regenerated, with a warning.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..kernel_files import (GENERATED_DIR, KernelFileError, UntrustedCacheError, cached_path,
                            load_module_file, load_module_text, read_cache_file,
                            write_cache_file)
from ..spec import Model, check_model
from .checks import as_real_array, check_float_activation

__all__ = ["Kernels", "kernels", "KERNEL_FORMS", "clear_kernel_memo"]

KERNEL_FORMS = ("matrix", "tensor", "entries")

# (kind, key) -> (module, source); process-wide, guarded for threaded callers
_MEMO: dict = {}
_LOCK = threading.Lock()


def clear_kernel_memo() -> None:
    """Forget the loaded modules (the next :func:`kernels` call reloads from disk)."""
    with _LOCK:
        _MEMO.clear()


@dataclass(frozen=True)
class Kernels:
    """Callable risk and ODE right-hand side of one model.

    Attributes
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}
    source : str
        Where the generated code came from (module name, cache file or ``<memory>``).
    """

    model: Model
    form: str
    source: str
    _rhs: Callable = field(repr=False)
    _risk: Callable = field(repr=False)

    def _arrays(self, Q, rho, T):
        # complex input refused (never truncated); non-finite allowed inside solvers
        Q, rho, T = (as_real_array(x, n, finite=False, copy=False)
                     for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
        p, k = self.model.p, self.model.p_star
        if Q.shape[-2:] != (p, p) or rho.shape[-2:] != (p, k) or T.shape[-2:] != (k, k):
            raise ValueError(
                f"overlaps must end in shapes Q ({p}, {p}), rho ({p}, {k}), T ({k}, {k}) for "
                f"{self.model!r}; got {Q.shape}, {rho.shape}, {T.shape}")
        return Q, rho, T

    def rhs(self, Q, rho, T):
        """``(dQ/dt, dρ/dt)`` at ``(Q, ρ, T)``; leading batch dimensions allowed."""
        return self._rhs(*self._arrays(Q, rho, T))

    def risk(self, Q, rho, T):
        """Population risk ``ε`` at ``(Q, ρ, T)``; a float, or an array over batch dims."""
        out = self._risk(*self._arrays(Q, rho, T))
        return float(out) if np.ndim(out) == 0 else out


def _committed(name: str):
    """A committed ``symquad/_generated`` module, checksum-verified, memoised."""
    key = ("committed", name)
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
    path = GENERATED_DIR / f"{name}.py"
    try:
        module = load_module_file(path, f"symquad._generated.{name}")
    except KernelFileError as exc:
        raise KernelFileError(
            f"{exc}. Committed kernels must not be edited by hand: run `symquad regenerate` "
            f"(or restore the file from version control).") from exc
    with _LOCK:
        _MEMO[key] = (module, f"symquad._generated.{name}")
        return _MEMO[key]


def _cached(kind: str, key: str, render: Callable[[], str]):
    """A module generated on demand into the cache (see the module docstring).

    A cache entry is executed only when :func:`symquad.kernel_files.read_cache_file`
    trusts it (owned by the user, not writable by others, no link, a regular
    file); an untrusted one is never executed: the module is regenerated into a
    fresh trusted file, or into memory when the folder itself is untrusted,
    with a warning that says why.
    """
    path = cached_path(kind, key)
    memo_key = (kind, key, path.name)
    with _LOCK:
        if memo_key in _MEMO:
            return _MEMO[memo_key]
    name = f"symquad_cached_{path.stem}"
    distrust = None
    try:
        result = (load_module_text(read_cache_file(path), name, str(path)), str(path))
    except UntrustedCacheError as exc:
        distrust = exc
    except (OSError, KernelFileError):
        pass     # missing, unreadable, corrupted, broken at import or incomplete
    else:
        with _LOCK:
            _MEMO[memo_key] = result
        return result
    result = _write_and_load(path, name, render(), distrust)
    with _LOCK:
        _MEMO[memo_key] = result
    return result


def _write_and_load(path, name, text, distrust=None):
    """Write ``text`` as a trusted cache file and load it (from memory: what was written)."""
    try:
        write_cache_file(path, text)
    except (OSError, UntrustedCacheError) as exc:
        why = exc if isinstance(exc, UntrustedCacheError) else \
            f"it cannot be written ({type(exc).__name__}: {exc})"
        warnings.warn(
            f"kernel cache folder {path.parent} is not used: {why}; using in-memory kernels "
            f"for this process. Set SYMQUAD_CACHE_DIR to a folder of your own that others "
            f"cannot write to keep them.", RuntimeWarning, stacklevel=5)
        return load_module_text(text, name, "<memory>"), "<memory>"
    if distrust is not None:
        warnings.warn(f"{distrust}; it was not executed, the kernel was regenerated into a "
                      f"fresh file", RuntimeWarning, stacklevel=5)
    return load_module_text(text, name, str(path)), str(path)


def _matrix_kernels(model: Model) -> Kernels:
    mod, source = _committed("quadratic_matrix")
    c2 = model.activation[2]
    c = c2.numerator / c2.denominator
    p, k, eta, noise = model.p, model.p_star, model.eta, model.noise
    return Kernels(
        model, "matrix", source,
        lambda Q, rho, T: mod.rhs(Q, rho, T, eta, noise, p, k, c),
        lambda Q, rho, T: mod.risk(Q, rho, T, p, k, c))


def activation_key(model: Model) -> str:
    """Stable 16-hex-digit key of the activation alone (tensor kernels are per activation)."""
    text = "activation=" + ",".join(str(c) for c in model.activation)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tensor_module(model: Model):
    from .._generated import TENSOR_MODULES
    committed = TENSOR_MODULES.get(tuple(str(c) for c in model.activation))
    if committed:
        return _committed(committed)

    def render():
        from ..codegen.tensor_render import render_tensor_module
        from ..kernel_files import generator_version
        return render_tensor_module(model.activation, generator=generator_version())
    return _cached("tensor", activation_key(model), render)


def _entry_module(model: Model):
    from .._generated import ENTRY_MODULES
    committed = ENTRY_MODULES.get((model.p, model.p_star))
    if committed and model.activation_str == "z**2":
        return _committed(committed)

    def render():
        from ..codegen.render import render_entries_module
        return render_entries_module(model)
    return _cached("entries", model.structure_key, render)


def kernels(model: Model, form: str | None = None) -> Kernels:
    """Numeric kernels of ``model``.

    Parameters
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}, optional
        Default ``"matrix"`` for ``σ = c z² (+ c0)``, ``"tensor"`` for every other
        polynomial.  ``"entries"`` is the entry-by-entry reference route, whose
        derivation cost grows fast with ``p`` (it checks the size first).

    Examples
    --------
    >>> import numpy as np, symquad as sq
    >>> k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1))
    >>> round(k.risk(np.eye(2), np.zeros((2, 1)), np.eye(1)), 6)
    1.5
    """
    check_model(model)
    check_float_activation(model.activation)
    if form is None:
        form = "matrix" if model.is_quadratic else "tensor"
    if form not in KERNEL_FORMS:
        raise ValueError(f"form must be one of {KERNEL_FORMS}, got {form!r}")
    if form == "matrix":
        if not model.is_quadratic:
            raise ValueError(
                f"form='matrix' needs a quadratic activation c*z**2 (+ const), got "
                f"{model.activation_str!r}; use form='tensor'")
        return _matrix_kernels(model)
    eta, noise = model.eta, model.noise
    if form == "tensor":
        mod, source = _tensor_module(model)
    else:
        mod, source = _entry_module(model)
    return Kernels(model, form, source,
                   lambda Q, rho, T: mod.rhs(Q, rho, T, eta, noise), mod.risk)
