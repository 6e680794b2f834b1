"""Numeric kernels: the generated right-hand sides and risk, ready to call.

No SymPy here.  Quadratic models (``σ = c z² + c0``) use the committed
width-independent matrix-form module; other activations use entry-by-entry
modules, committed for a canonical set of widths and otherwise generated once
into the kernel cache (which needs SymPy the first time only).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..kernel_files import cache_dir, load_module_file
from ..spec import Model, check_model

__all__ = ["Kernels", "kernels"]

KERNEL_FORMS = ("matrix", "entries")


@dataclass(frozen=True)
class Kernels:
    """Callable risk and ODE right-hand side of one model.

    Attributes
    ----------
    model : Model
    form : {"matrix", "entries"}
    source : str
        Where the generated code came from (module name or cache file).
    """

    model: Model
    form: str
    source: str
    _rhs: Callable = field(repr=False)
    _risk: Callable = field(repr=False)

    def rhs(self, Q, rho, T):
        """``(dQ/dt, dρ/dt)`` at ``(Q, ρ, T)``; leading batch dimensions allowed."""
        return self._rhs(np.asarray(Q, dtype=float), np.asarray(rho, dtype=float),
                         np.asarray(T, dtype=float))

    def risk(self, Q, rho, T):
        """Population risk ``ε`` at ``(Q, ρ, T)``; a float, or an array over batch dims."""
        out = self._risk(np.asarray(Q, dtype=float), np.asarray(rho, dtype=float),
                         np.asarray(T, dtype=float))
        return float(out) if np.ndim(out) == 0 else out


def _matrix_kernels(model: Model) -> Kernels:
    mod = importlib.import_module("symquad._generated.quadratic_matrix")
    c2 = model.activation[2]
    c = c2.numerator / c2.denominator
    p, k, eta, noise = model.p, model.p_star, model.eta, model.noise
    return Kernels(
        model, "matrix", mod.__name__,
        lambda Q, rho, T: mod.rhs(Q, rho, T, eta, noise, p, k, c),
        lambda Q, rho, T: mod.risk(Q, rho, T, p, k, c))


def _entry_module(model: Model):
    from .._generated import ENTRY_MODULES
    committed = ENTRY_MODULES.get((model.p, model.p_star))
    if committed and model.activation_str == "z**2":
        return importlib.import_module(f"symquad._generated.{committed}"), \
            f"symquad._generated.{committed}"
    path = cache_dir() / f"entries_{model.structure_key}.py"
    try:
        return load_module_file(path, f"symquad_cached_{model.structure_key}"), str(path)
    except (OSError, ValueError, SyntaxError):
        pass
    # Missing or corrupted: generate (this, and only this, needs SymPy).
    from ..codegen.regenerate import ensure_cached_entries
    path = ensure_cached_entries(model)
    return load_module_file(path, f"symquad_cached_{model.structure_key}"), str(path)


def kernels(model: Model, form: str | None = None) -> Kernels:
    """Numeric kernels of ``model``.

    Parameters
    ----------
    model : Model
    form : {"matrix", "entries"}, optional
        Default ``"matrix"`` for quadratic activations, else ``"entries"``.

    Examples
    --------
    >>> import numpy as np, symquad as sq
    >>> k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1))
    >>> round(k.risk(np.eye(2), np.zeros((2, 1)), np.eye(1)), 6)
    1.5
    """
    check_model(model)
    if form is None:
        form = "matrix" if model.is_quadratic else "entries"
    if form not in KERNEL_FORMS:
        raise ValueError(f"form must be one of {KERNEL_FORMS}, got {form!r}")
    if form == "matrix":
        if not model.is_quadratic:
            raise ValueError(
                f"form='matrix' needs a quadratic activation c*z**2 (+ const), got "
                f"{model.activation_str!r}")
        return _matrix_kernels(model)
    mod, source = _entry_module(model)
    eta, noise = model.eta, model.noise
    return Kernels(model, "entries", source,
                   lambda Q, rho, T: mod.rhs(Q, rho, T, eta, noise), mod.risk)
